"""gpu/bench_h200.py runs end to end with --tiny on the CPU: throughput and MFU per algorithm within its time
budget, model FLOPs as counted from the config by hand, and JSON that `cliplab report` renders."""
import json

import pytest
from typer.testing import CliRunner

from gpu.bench_h200 import DEFAULT_ALGOS, TINY, batch, build, main, run, step_flops
from harness.cli import app

SMALL = {"steps": 1, "prompts": 1, "group": 2, "prompt_len": 8, "gen_len": 8}


def test_tiny_run_reports_grpo_dapo_dcpo_with_mfu():
    res = run(tiny=True, peak_tflops=0.5, **SMALL)
    assert [r["algo"] for r in res["rows"]] == list(DEFAULT_ALGOS) == ["grpo", "dapo", "dcpo"]
    for r in res["rows"]:
        assert r["steps"] == 1 and r["train_tokens_per_s"] > 0 and r["peak_mem_gib"] > 0
        assert r["model_tflops"] == pytest.approx(res["flops_per_step"] / r["step_s"] / 1e12)
        assert r["mfu"] == pytest.approx(r["model_tflops"] / 0.5)
    assert res["device"] == "cpu" and res["kind"] == "cliplab-throughput"


def test_time_budget_stops_after_one_timed_step():
    res = run(tiny=True, algos=["grpo"], max_minutes=1e-9, **{**SMALL, "steps": 5})
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


def test_json_renders_with_cliplab_report(tmp_path):
    main(["--tiny", "--steps", "1", "--prompts", "1", "--group", "2", "--prompt-len", "4", "--gen-len", "4",
          "--algos", "sapo,grpo", "--peak-tflops", "2", "--out", str(tmp_path / "h200" / "throughput.json")])
    data = json.loads((tmp_path / "h200" / "throughput.json").read_text())
    assert [r["algo"] for r in data["rows"]] == ["sapo", "grpo"]
    res = CliRunner().invoke(app, ["report", str(tmp_path / "h200")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "h200" / "throughput.md").read_text()
    for r in data["rows"]:
        assert f"| {r['algo']} | 1 |" in md and f"{100 * r['mfu']:.3g}%" in md


def test_bad_arguments_name_the_argument(tmp_path, capsys):
    for argv, name in ((["--algos", "nope"], "algos"), (["--steps", "0"], "--steps"), (["--group", "1"], "--group")):
        with pytest.raises(SystemExit) as e:
            main(["--tiny", *argv])
        assert e.value.code == 2 and name in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "bad.json")])
    assert res.exit_code == 2 and "bad.json" in res.output
