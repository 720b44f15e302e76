"""gpu/bench_h200.py: the throughput part on the CPU (throughput and MFU per algorithm within its time budget,
model FLOPs as counted from the config by hand, generation timed apart), the device-name peak table, the tiny tier's
recipe and run plan, the scheduler of the tier's runs (results after each, stopped at the deadline), and JSON that
`cliplab report` renders. The whole `--tiny` run (both parts, about 40 s) is run by hand; README gives its time."""
import json
import os
import time

import pytest
from typer.testing import CliRunner

from gpu.bench_h200 import (DEFAULT_ALGOS, MFU_SCOPE, TINY, batch, build, device_peak, main, run_all, step_flops,
                            throughput, tier_plan, tier_recipe)
from gpu.config import load_config
from gpu.data import column_addition
from harness.cli import app

SMALL = {"steps": 1, "prompts": 1, "group": 2, "prompt_len": 8, "gen_len": 8}


def _throughput(**kw):
    args = {**SMALL, "algos": list(DEFAULT_ALGOS), "peak_tflops": None, "deadline": time.perf_counter() + 60, **kw}
    return throughput(True, on_row=lambda res: None, **args)


def test_tiny_run_reports_grpo_dapo_dcpo_with_mfu_and_generation_apart():
    res = _throughput(peak_tflops=0.5)
    assert [r["algo"] for r in res["rows"]] == list(DEFAULT_ALGOS) == ["grpo", "dapo", "dcpo"]
    for r in res["rows"]:
        assert r["steps"] == 1 and r["train_tokens_per_s"] > 0 and r["peak_mem_gib"] > 0
        assert r["model_tflops"] == pytest.approx(res["flops_per_step"] / r["step_s"] / 1e12)
        assert r["mfu"] == pytest.approx(r["model_tflops"] / 0.5)
    assert res["mfu_scope"] == MFU_SCOPE and "training step only" in MFU_SCOPE
    g = res["generation"]  # 1 prompt x G = 2 samples x 8 new tokens each, no early stop
    assert g["sequences"] == 2 and g["tokens"] == 16 and g["tokens_per_s"] == pytest.approx(16 / g["s"])


def test_time_budget_stops_after_one_timed_step():
    res = _throughput(algos=["grpo"], deadline=time.perf_counter(), steps=5)
    assert res["rows"][0]["steps"] == 1 and res["rows"][0]["mfu"] is None  # no peak given on the CPU


def test_step_flops_from_the_config_by_hand():
    """3 x forward: 2 x (q, o: d^2; k, v: d x kv; mlp 3 d I) per layer per token, 2 V d per completion token, and
    4 d per causal (query, key) pair per layer."""
    model = build(True, "cpu")
    ids, att, comp = batch(2, 2, 5, 6, TINY["vocab_size"], "cpu")
    d, i, L, V = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"], TINY["vocab_size"]
    kv = d // TINY["num_attention_heads"] * TINY["num_key_value_heads"]
    lens = att.sum(1).tolist()
    per_token = 2 * L * (2 * d * d + 2 * d * kv + 3 * d * i)
    attn = sum(L * 4 * d * n * (n + 1) / 2 for n in lens)
    out = 2 * V * d * int(comp[:, 1:].sum())
    assert step_flops(model, att, comp) == pytest.approx(3 * (per_token * sum(lens) + out + attn), rel=1e-12)


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA GH200 480GB", 989.0),
                                        ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H100 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0),
                                        ("NVIDIA B200", 2250.0)])
def test_peak_by_device_name(name, peak):
    assert device_peak(name) == peak
    assert device_peak(name, 123.0) == 123.0  # --peak-tflops wins


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA RTX 6000 Ada Generation", "NVIDIA H800", "Tesla V100-SXM2-16GB"])
def test_unknown_device_needs_peak_tflops(name):
    """Unknown names, and names that hold a known one only as part of a word (L40 is not L4), are refused."""
    with pytest.raises(ValueError, match="^--peak-tflops: .*" + name.split()[-1]):
        device_peak(name)


def test_tier_recipe_fits_its_longest_prompt_and_answer():
    """The wider recipe is checked like configs/tiny/model.yaml and its positions hold the longest prompt and the
    worked answer (with <eos>) of its digits, which fit in the tier's new-token budget."""
    r = tier_recipe("gpu")
    d = r["task"]["digits"]
    assert d == 5 and r["model"]["hidden"] > 64
    top = 10 ** d - 1
    answer = len(column_addition(top, top, d)) + 1
    assert answer <= 32 and len(f"{top}+{top}\n") + 32 <= r["model"]["max_positions"]


@pytest.mark.parametrize("size", ["tiny", "gpu"])
def test_tier_plan_configs_load(size, tiny_path, tmp_path, monkeypatch):
    """Every planned run is a valid config: its own folder and seed, the recipe's digits, the given steps."""
    import gpu.models
    monkeypatch.setattr(gpu.models, "check_device", lambda device: None)  # no CUDA here
    plan = tier_plan(size, tiny_path, tmp_path, ["grpo", "dapo"], 2, 7, "cpu" if size == "tiny" else "cuda")
    assert [(p["algo"], p["seed"]) for p in plan] == [("grpo", 0), ("grpo", 1), ("dapo", 0), ("dapo", 1)]
    for p in plan:
        c = load_config(p["config"], p["sets"])
        assert (c.run.seed, c.run.steps, c.run.out_dir) == (p["seed"], 7, p["out_dir"])
        assert c.data.digits == tier_recipe(size)["task"]["digits"] and c.model.name == str(tiny_path)
        assert c.algo.name == p["algo"]
    assert len({p["out_dir"] for p in plan}) == len(plan)


def test_run_all_reports_each_run_as_it_ends_and_stops_at_the_deadline(tmp_path):
    plan = [{"algo": a, "seed": 0, "config": str(tmp_path / a), "out_dir": str(tmp_path / a), "sets": s}
            for a, s in (("quick", [3, 0, 0]), ("failing", [1, 0, 3]), ("slow", [2, 60, 0]), ("late", [1, 0, 0]))]
    seen = []
    t = time.perf_counter()
    runs = run_all(plan, 2, t + 4, lambda done: seen.append([r["algo"] for r in done]),
                   target=__import__("gpu_helpers").fake_tier_run, preload=())
    assert time.perf_counter() - t < 9  # the slow run was stopped, not waited for
    by = {r["algo"]: r for r in runs}
    assert by["quick"]["status"] == "finished" and by["quick"]["steps"] == 3
    assert by["quick"]["step_time_s_median"] == 2.0 and by["quick"]["accuracy_last"] == 0.2
    assert by["failing"]["status"] == "failed (exit code 3)" and by["failing"]["steps"] == 1
    assert by["slow"]["status"] == "stopped at the time limit" and by["slow"]["steps"] == 2  # its metrics stay
    assert by["late"]["status"] == "finished"  # started when a slot freed
    assert len(seen) == 4 and seen[-1][-1] == "slow" and all(len(s) == k + 1 for k, s in enumerate(seen))


def test_json_renders_with_cliplab_report(tmp_path):
    main(["--tiny", "--parts", "throughput", "--steps", "1", "--prompts", "1", "--group", "2", "--prompt-len", "4",
          "--gen-len", "4", "--algos", "sapo,grpo", "--peak-tflops", "2", "--out", str(tmp_path / "h200")])
    data = json.loads((tmp_path / "h200" / "throughput.json").read_text())
    assert [r["algo"] for r in data["rows"]] == ["sapo", "grpo"] and data["parts"] == ["throughput"]
    res = CliRunner().invoke(app, ["report", str(tmp_path / "h200")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "h200" / "throughput.md").read_text()
    for r in data["rows"]:
        assert f"| {r['algo']} | 1 |" in md and f"{100 * r['mfu']:.3g}%" in md
    assert "training step only" in md and "tokens/s" in md and "tiny tier" not in md


def test_bad_arguments_name_the_argument(tmp_path, capsys):
    for argv, name in ((["--algos", "nope"], "--algos"), (["--steps", "0"], "--steps"), (["--group", "1"], "--group"),
                       (["--tier-algos", "nope"], "--tier-algos"), (["--parts", "tier,x"], "--parts")):
        with pytest.raises(SystemExit) as e:
            main(["--tiny", "--out", str(tmp_path / "o"), *argv])
        assert e.value.code == 2 and name in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "bad.json")])
    assert res.exit_code == 2 and "bad.json" in res.output


def test_one_writer_per_out_folder(tmp_path, capsys):
    from spec.records import open_lock, take_lock
    (tmp_path / "o").mkdir()
    fd = open_lock(tmp_path / "o" / "bench.lock", "--out", "lock")
    assert take_lock(fd) is None
    with pytest.raises(SystemExit) as e:
        main(["--tiny", "--parts", "throughput", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--out:" in err and "in use by another bench_h200 run" in err
    os.close(fd)


from gpu_helpers import tiny_path  # noqa: E402,F401  (fixture)
