"""cliplab report on a cluster's logs: verl's file-logger JSONL and console lines and TRL's trainer_state.json,
written here in each framework's format (by verl's own logger classes where importable), mapped onto cliplab's
metrics, with claims, published numbers, absent metrics and cut-short logs; and on the committed CPU runs."""
import json
from pathlib import Path

import numpy as np
import pytest
from gpu_helpers import tiny_path  # noqa: F401  (fixture)

from harness.reports import cluster as cluster_logs
from harness.cli import app
from harness.reports.published import PUBLISHED
from harness.recipes.launch import all_recipes

CPU_RUNS = Path(__file__).resolve().parent.parent / "reports" / "real" / "runs"


def verl_metrics(step, algo):
    """A step's metrics under verl's names; the clip fraction differs by algorithm as the papers say."""
    clip = {"dcpo": 0.001, "grpo": 0.02, "dapo": 0.03, "gspo": 0.15}[algo]
    return {"actor/pg_clipfrac": clip, "actor/entropy": 1.0 - 0.01 * step, "critic/score/mean": 0.1 * step,
            "response_length/mean": 100.0 + step, "actor/cliplab_rur": 0.7 if algo == "dcpo" else 0.4,
            "timing_s/step": 3.0}


def write_verl_jsonl(path: Path, algo: str, steps: int, val_every: int = 2):
    """verl's FileLogger (verl.utils.tracking) writing the log, as a verl run with logger=[file] does."""
    tracking = pytest.importorskip("verl.utils.tracking")
    path.parent.mkdir(parents=True, exist_ok=True)
    import os
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        logger = tracking.FileLogger("p", algo)
        for s in range(1, steps + 1):
            data = verl_metrics(s, algo)
            if s % val_every == 0:
                data["val-core/aime24/acc/mean@32"] = 0.01 * s
            logger.log(data, s)
        logger.finish()
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]


def comparison_row(md: str, label: str) -> str:
    """The label's row in the report's comparison table (the second table that lists it)."""
    return [line for line in md.splitlines() if line.startswith(f"| {label} |")][1]


def write_run_json(folder: Path, recipe, run, algorithm, steps, params=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps({"recipe": recipe, "run": run, "framework": "verl",
                                                 "algorithm": algorithm, "params": params or {}, "steps": steps}))


def test_verl_file_logger_runs_map_onto_cliplabs_metrics_with_published_numbers(tmp_path):
    for algo in ("grpo", "dapo", "gspo", "dcpo"):
        write_run_json(tmp_path / "dcpo_math7b" / algo, "dcpo_math7b", algo, algo, 10)
        write_verl_jsonl(tmp_path / "dcpo_math7b" / algo / "verl.jsonl", algo, 10)
    runs, notes = cluster_logs.load([tmp_path])
    assert not notes and len(runs) == 4
    dcpo = next(r for r in runs if r["label"] == "dcpo")
    assert [r["step"] for r in dcpo["records"]] == list(range(1, 11))
    rec = dcpo["records"][3]  # step 4: every mapped metric under cliplab's name, values unchanged
    assert rec["clip_frac"] == 0.001 and rec["entropy"] == pytest.approx(0.96) and rec["reward"] == pytest.approx(0.4)
    assert rec["resp_len"] == 104.0 and rec["rur"] == 0.7 and rec["accuracy"] == pytest.approx(0.04)
    assert "accuracy" not in dcpo["records"][2]  # no validation at step 3: absent, not carried over
    md = cluster_logs.write_report([tmp_path], tmp_path / "report.md").read_text()
    row = comparison_row(md, "dcpo")
    assert "| 10% |" in row  # accuracy (final): step 10's validation 0.1
    assert "38.8%" in row and "71.8%" in row  # DCPO's published AIME24 Avg@32 and RUR beside
    tcr = next(line for line in md.splitlines() if "DCPO's TCR" in line)
    assert "**reproduced**" in tcr  # 0.1% vs 2%/3%: a factor of 20
    rur = next(line for line in md.splitlines() if "DCPO's RUR" in line)
    assert "**absent**" not in rur
    assert "kl_ref (final) | zero_grad_frac" in md and "| absent |" in row  # no KL, no zero-std share in verl logs
    sapo = next(line for line in md.splitlines() if "SAPO with tau_neg" in line)
    assert "n/a" in sapo or "absent" in sapo


def test_verl_file_logs_at_verls_default_place_are_found(tmp_path):
    """Without cliplab's launcher verl writes <project>/<experiment>.jsonl; the experiment names the run."""
    write_verl_jsonl(tmp_path / "DCPO" / "dcpo.jsonl", "dcpo", 3)
    write_verl_jsonl(tmp_path / "DCPO" / "grpo-baseline.jsonl", "grpo", 3)
    assert cluster_logs.handles([tmp_path])
    runs, _ = cluster_logs.load([tmp_path])
    assert {r["label"]: r["algo"] for r in runs} == {"dcpo": "dcpo", "grpo-baseline": None}  # names, not guesses


def test_verl_console_lines_parse_as_verl_prints_them(tmp_path):
    agg = pytest.importorskip("verl.utils.logger.aggregate_logger")
    def metrics(s):  # verl's values are often numpy scalars, which pprint writes as np.float64(...)
        return {k: np.float64(v) if k.startswith("actor/") else v for k, v in verl_metrics(s, "grpo").items()}
    lines = ["(TaskRunner pid=1) starting", agg.concat_dict_to_str(metrics(1), step=1),
             *(f"(TaskRunner pid=7) {agg.concat_dict_to_str(metrics(s), step=s)}" for s in (2, 3))]  # Ray's prefix
    log = tmp_path / "run.txt"
    log.write_text("\n".join(lines) + "\n")
    records, framework, note, _ = cluster_logs.read_log(log)
    assert framework == "verl" and note == "" and [r["step"] for r in records] == [1, 2, 3]
    for rec in records:
        assert rec["clip_frac"] == 0.02 and rec["resp_len"] == 100.0 + rec["step"]
        assert rec["entropy"] == pytest.approx(1.0 - 0.01 * rec["step"])


def trl_state(steps, max_steps, algo_clip=0.01, beta=False):
    """trainer_state.json as transformers' Trainer writes it for a GRPOTrainer run (logging_steps=1)."""
    hist = []
    for s in range(1, steps + 1):
        e = {"loss": 0.01, "grad_norm": 0.5, "learning_rate": 1e-6, "num_tokens": 1000.0 * s,
             "completions/mean_length": 50.0 + s, "completions/clipped_ratio": 0.0, "reward": 0.1 * s,
             "reward_std": 0.3, "frac_reward_zero_std": 0.25, "clip_ratio/region_mean": algo_clip,
             "cliplab/rur": 0.75, "epoch": s / 10, "step": s}
        if beta:
            e["kl"] = 0.001 * s
        hist.append(e)
    if steps == max_steps:
        hist.append({"train_runtime": 12.0, "train_loss": 0.01, "epoch": 1.0, "step": steps})
    return {"global_step": steps, "max_steps": max_steps, "log_history": hist, "epoch": steps / 10}


def test_trl_trainer_state_maps_and_a_cut_short_run_is_reported_to_its_last_step(tmp_path, capsys):
    for run, algo, steps in (("grpo", "grpo", 6), ("dcpo", "dcpo", 4)):
        folder = tmp_path / "dcpo_math7b" / run
        write_run_json(folder, "dcpo_math7b", run, algo, 6)
        ck = folder / "checkpoint-4"  # a run killed after its checkpoint at step 4 has no final state
        ck.mkdir(parents=True)
        (ck / "trainer_state.json").write_text(json.dumps(trl_state(4, 6, beta=algo == "grpo")))
        if steps == 6:
            (folder / "trainer_state.json").write_text(json.dumps(trl_state(6, 6, 0.02, beta=True)))
    runs, notes = cluster_logs.load([tmp_path])
    by = {r["label"]: r for r in runs}
    assert [r["step"] for r in by["dcpo"]["records"]] == [1, 2, 3, 4] and len(by["grpo"]["records"]) == 6
    assert notes == [f"{tmp_path / 'dcpo_math7b' / 'dcpo' / 'checkpoint-4' / 'trainer_state.json'}: cut short at "
                     "step 4 of 6"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint-4/trainer_state.json" in err[0] and "reported up to step 4" in err[0]
    rec = by["grpo"]["records"][2]
    assert rec["clip_frac"] == 0.02 and rec["zero_grad_frac"] == 0.25 and rec["kl_ref"] == pytest.approx(0.003)
    assert rec["rur"] == 0.75 and rec["resp_len"] == 53.0 and "entropy" not in rec
    md = cluster_logs.write_report([tmp_path], tmp_path / "r.md").read_text()
    assert "## Cut short" in md
    row = comparison_row(md, "dcpo")
    assert row.count("absent") >= 2  # no entropy and no validation accuracy in TRL's log


def test_the_cpu_runs_and_a_cluster_log_in_one_report(tmp_path):
    write_run_json(tmp_path / "c" / "gspo", "gspo_vs_grpo", "gspo", "gspo", 5)
    write_verl_jsonl(tmp_path / "c" / "gspo" / "verl.jsonl", "gspo", 5)
    runs, _ = cluster_logs.load([CPU_RUNS, tmp_path])
    labels = {r["label"]: r["framework"] for r in runs}
    assert labels["gspo (gspo_vs_grpo)"] == "verl" and labels["gspo (cliplab)"] == "cliplab"
    assert labels["grpo"] == labels["dcpo"] == "cliplab"
    cpu = next(r for r in runs if r["algo"] == "dcpo")
    assert np.isfinite([rec.get("rur", np.nan) for rec in cpu["records"]]).any()  # cliplab's own RUR is read
    md = cluster_logs.write_report([CPU_RUNS, tmp_path], tmp_path / "both.md").read_text()
    assert "DCPO's RUR" in md and (tmp_path / "both_curves.png").exists()
    clips = [rec.get("clip_frac") for r in runs if r["framework"] == "cliplab" for rec in r["records"]]
    if not any(clips):  # one epoch on-policy: every ratio is 1, no run clipped: the TCR claim is not testable
        tcr = next(line for line in md.splitlines() if "DCPO's TCR" in line)
        assert "**not testable here**" in tcr and "ratios stay inside" in tcr


def test_bad_logs_are_one_line_errors_naming_the_file(tmp_path):
    from typer.testing import CliRunner
    runner = CliRunner()
    odd = tmp_path / "odd.log"
    odd.write_text("hello\n")
    for path, expected in ((odd, f"{odd}: unknown log format"),
                           (tmp_path / "missing.jsonl", f"{tmp_path / 'missing.jsonl'}: no such file")):
        res = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "r.md")])
        assert res.exit_code == 2 and res.output.strip().splitlines() == [f"error: {expected}" + res.output.strip()
                                                                          .split(expected, 1)[1]]
    cut = tmp_path / "x" / "verl.jsonl"
    write_verl_jsonl(cut, "grpo", 3)
    cut.write_bytes(cut.read_bytes() + b'{"step": 4, "data": {"actor/pg_clip')  # killed mid-write
    records, _, note, _ = cluster_logs.read_log(cut)
    assert [r["step"] for r in records] == [1, 2, 3] and "cut short" in note


def test_published_numbers_name_real_recipe_runs_and_match_the_reference_values():
    runs = {(r["name"], run) for r in all_recipes() for run in r["runs"]}
    assert set(PUBLISHED) <= runs
    dapo = [PUBLISHED[("dapo_ladder_32b", run)]["accuracy"][0] for run in
            ("naive_grpo", "overlong_filter", "clip_higher", "soft_overlong", "token_level", "dynamic_sampling")]
    assert dapo == sorted(dapo) and dapo[0] == 0.30 and dapo[-1] == 0.50  # each rung adds, as DAPO Table 1
    assert all(src.startswith(("DCPO 2509.02333", "DAPO 2503.14476")) for v in PUBLISHED.values()
               for _, src in v.values())


def test_a_trl_recipe_run_on_a_tiny_model_reports_from_its_own_trainer_state(tmp_path, tiny_path):
    """The TRL variant trains two steps, writes trainer_state.json as TRL does, and the report reads it."""
    pytest.importorskip("trl")
    from harness.recipes import launch as recipes
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"problem": "{a} + {b} = ?", "answer": "{a + b}"}}\n'
                            for a in range(3) for b in range(2)))
    r = next(x for x in all_recipes() if x["name"] == "dcpo_math7b")
    out = tmp_path / "runs"
    trainer = recipes.trl_trainer(r, "dcpo", {"model": tiny_path, "train": data}, out, use_vllm=False, bf16=False,
                                  use_cpu=True, gradient_checkpointing=False, num_generations=2,
                                  per_device_train_batch_size=2, gradient_accumulation_steps=1,
                                  max_completion_length=6, max_steps=2, learning_rate=1e-3, save_steps=100)
    trainer.train()
    trainer.save_state()
    runs, notes = cluster_logs.load([out])
    (run,) = runs
    assert run["framework"] == "trl" and run["algo"] == "dcpo" and [x["step"] for x in run["records"]] == [1, 2]
    assert notes == []  # all of its max_steps done
    assert json.loads((out / "dcpo_math7b" / "dcpo" / "run.json").read_text())["steps"] == 2
    for rec in run["records"]:
        assert 0.0 <= rec["clip_frac"] <= 1.0 and 0.0 <= rec["rur"] <= 1.0 and rec["resp_len"] > 0
        assert 0.0 < rec["entropy"] <= np.log(trainer.model.config.vocab_size)  # nats, at most log |V|
    md = cluster_logs.write_report([out], tmp_path / "trl.md").read_text()
    assert "38.8%" in comparison_row(md, "dcpo")


def test_the_dapo_ladder_logs_give_the_clip_higher_claim_and_the_ladders_published_numbers(tmp_path):
    """run.json carries each rung's params, so the clip-higher pair (eps_high 0.2 vs 0.28, nothing else) is found."""
    ladder = next(r for r in all_recipes() if r["name"] == "dapo_ladder_32b")
    for run, entropy_drop in (("naive_grpo", 0.05), ("clip_higher", 0.01)):
        spec = ladder["runs"][run]
        write_run_json(tmp_path / run, "dapo_ladder_32b", run, spec["algorithm"], 6, spec["params"])
        path = tmp_path / run / "verl.jsonl"
        path.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 1.0 - entropy_drop * s,
                                                                 "actor/pg_clipfrac": 0.01}}) + "\n"
                                for s in range(1, 7)))
    md = cluster_logs.write_report([tmp_path], tmp_path / "r.md").read_text()
    row = next(line for line in md.splitlines() if "Clip-higher slows entropy collapse" in line)
    # one run per rung: the direction is stated, but a difference without a standard error is not a verdict
    assert "**not testable here**" in row and "entropy ends higher with the looser bound" in row
    assert "eps_high 0.2 0.7; 0.28 0.94 (" in row  # one run a rung: no interval
    assert "30%" in comparison_row(md, "naive_grpo") and "38%" in comparison_row(md, "clip_higher")


def test_every_claim_says_which_metrics_it_reads():
    from harness.reports.claims import CLAIMS
    assert {fn.__name__ for _, fn in CLAIMS} == set(cluster_logs.NEEDS)


# ---- TensorBoard, verl's validation keys, --label / --algo, plots ---------------------------------------------------
def write_verl_tensorboard(folder: Path, algo: str, steps: int, val: dict, monkeypatch):
    """verl's TensorBoard logger (verl.utils.tracking, trainer.logger=[tensorboard]) writing into ``folder`` (its
    TENSORBOARD_DIR), validation metrics ``val`` (key -> value at step s) every 5th step and before training."""
    tracking = pytest.importorskip("verl.utils.tracking")
    monkeypatch.setenv("TENSORBOARD_DIR", str(folder))
    logger = tracking._TensorboardAdapter("p", algo)
    logger.log({k: f(0) for k, f in val.items()}, 0)  # val_before_train
    for s in range(1, steps + 1):
        logger.log({**verl_metrics(s, algo), **({k: f(s) for k, f in val.items()} if s % 5 == 0 else {})}, s)
    logger.finish()


def write_trl_tensorboard(output_dir: Path, steps: int):
    """transformers' TensorBoardCallback, which TRL's trainers log through: TRL's log keys under train/, in
    <output_dir>/runs/<date_host>/."""
    from transformers import TrainingArguments
    from transformers.integrations.integration_utils import TensorBoardCallback
    from transformers.trainer_callback import TrainerControl, TrainerState
    args = TrainingArguments(output_dir=str(output_dir), report_to=[], use_cpu=True)
    callback, state = TensorBoardCallback(), TrainerState(is_world_process_zero=True)
    callback.on_train_begin(args, state, TrainerControl())
    for entry in trl_state(steps, steps)["log_history"][:steps]:
        state.global_step = entry["step"]
        callback.on_log(args, state, TrainerControl(), logs={k: v for k, v in entry.items() if k != "step"})
    callback.on_train_end(args, state, TrainerControl())


def run_report(*args):
    from typer.testing import CliRunner
    return CliRunner().invoke(app, ["report", *map(str, args)])


def test_label_reads_a_verl_tensorboard_folder_and_a_console_log_named_unlike_any_algorithm(tmp_path, monkeypatch):
    agg = pytest.importorskip("verl.utils.logger.aggregate_logger")
    tb = tmp_path / "tensorboard_log" / "DCPO" / "qwen7b-dcpo-lr1e6"
    write_verl_tensorboard(tb, "dcpo", 20, {"val-core/aime24/reward/mean@1": lambda s: 0.2 + 0.01 * s,
                                            "val-aux/aime24/reward/std@1": lambda s: 0.4}, monkeypatch)
    console = tmp_path / "qwen7b-grpo-lr1e6" / "console.log"
    console.parent.mkdir()
    console.write_text("".join(f"(TaskRunner pid=7) {agg.concat_dict_to_str(verl_metrics(s, 'grpo'), step=s)}\n"
                               for s in range(1, 21)))
    out = tmp_path / "r.md"
    res = run_report(tb, console.parent, "--label", f"dcpo-lr1e6={tb}", "--algo", "dcpo-lr1e6=dcpo",
                     "--algo", f"{console.parent}=grpo", "--out", out)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    runs = {line.split(" | ")[0][2:]: line for line in text.split("## Runs")[1].split("## Comparison")[0]
            .splitlines() if line.startswith("| ") and not line.startswith("| label")}
    assert set(runs) == {"dcpo-lr1e6", "qwen7b-grpo-lr1e6"}
    assert "| verl | dcpo |" in runs["dcpo-lr1e6"] and "| verl | grpo |" in runs["qwen7b-grpo-lr1e6"]
    assert "| 21 |" in runs["dcpo-lr1e6"] and "val-core/aime24/reward/mean@1" in runs["dcpo-lr1e6"]  # steps 0-20
    runs_, _ = cluster_logs.load([tb, console.parent], [f"dcpo-lr1e6={tb}"],
                                 ["dcpo-lr1e6=dcpo", "qwen7b-grpo-lr1e6=grpo"])
    dcpo = next(r for r in runs_ if r["label"] == "dcpo-lr1e6")
    val = {rec["step"]: rec["val_reward"] for rec in dcpo["records"] if "val_reward" in rec}
    assert val == pytest.approx({s: 0.2 + 0.01 * s for s in (0, 5, 10, 15, 20)})  # the reward, not an accuracy
    assert all("accuracy" not in rec for rec in dcpo["records"])
    assert dcpo["records"][4]["clip_frac"] == pytest.approx(0.001) and dcpo["records"][4]["rur"] == pytest.approx(.7)
    row = comparison_row(text, "dcpo-lr1e6")
    assert "| absent | 0.4 |" in row  # accuracy absent; val_reward (final): step 20's 0.2 + 0.2
    rur = next(line for line in text.splitlines() if "DCPO's RUR" in line)
    # 70% vs 40% on two runs told apart by --algo alone; one seed each: no interval to clear the paper's gap with
    assert "DCPO 70% vs GRPO 40%" in rur and "**partly**" in rur
    tcr = next(line for line in text.splitlines() if "DCPO's TCR" in line)  # no dapo run
    assert "**not measured**" in tcr and "cliplab sim" not in tcr and "verl `actor/pg_clipfrac`" in tcr
    assert "cliplab sim" not in text
    assert (tmp_path / "r_curves.png").exists()


def test_trl_tensorboard_folders_are_read_and_named_by_their_output_dir(tmp_path):
    pytest.importorskip("transformers")
    write_trl_tensorboard(tmp_path / "trl" / "sapo-run", 5)
    write_run_json(tmp_path / "recipe" / "dcpo", "dcpo_math7b", "dcpo", "dcpo", 5)  # a run.json, no text log
    write_trl_tensorboard(tmp_path / "recipe" / "dcpo", 5)
    assert cluster_logs.handles([tmp_path])
    runs, notes = cluster_logs.load([tmp_path])
    by = {r["label"]: r for r in runs}
    assert set(by) == {"sapo-run", "dcpo"} and not notes
    assert by["sapo-run"]["algo"] is None and by["dcpo"]["algo"] == "dcpo"
    for run in runs:
        assert run["framework"] == "trl" and [r["step"] for r in run["records"]] == [1, 2, 3, 4, 5]
        rec = run["records"][2]
        assert rec["reward"] == pytest.approx(0.3) and rec["zero_grad_frac"] == 0.25 and rec["rur"] == 0.75
        assert rec["clip_frac"] == pytest.approx(0.01) and rec["resp_len"] == 53.0


def test_a_resumed_trl_runs_tensorboard_folders_merge_with_the_later_one_winning(tmp_path):
    pytest.importorskip("transformers")
    import time
    write_trl_tensorboard(tmp_path / "run", 4)
    time.sleep(1.1)  # the callback's folder is named by the second
    from torch.utils.tensorboard import SummaryWriter
    (later,) = [d for d in (tmp_path / "run" / "runs").iterdir()]
    w = SummaryWriter(str(later.with_name(later.name + "-resumed")))  # resumed at step 3: steps 3-5 again
    for s in (3, 4, 5):
        w.add_scalar("train/reward", 10.0 + s, s)
    w.close()
    (run,), _ = cluster_logs.load([tmp_path])
    assert [r["step"] for r in run["records"]] == [1, 2, 3, 4, 5]
    assert [r["reward"] for r in run["records"]] == pytest.approx([0.1, 0.2, 13.0, 14.0, 15.0])


def test_val_core_acc_is_accuracy_and_one_key_per_run(tmp_path):
    path = tmp_path / "x" / "verl.jsonl"
    path.parent.mkdir()
    rows = []
    for s in range(1, 5):
        data = {"actor/entropy": 1.0}
        if s % 2 == 0:  # two data sources; acc is the headline (val-core), the score goes to val-aux
            data |= {"val-core/math500/acc/mean@4": 0.5 + s, "val-core/aime24/acc/mean@32": 0.1 * s,
                     "val-aux/aime24/reward/mean@32": 0.01 * s, "val-aux/aime24/acc/best@32/mean": 0.9}
        rows.append(json.dumps({"step": s, "data": data}))
    path.write_text("\n".join(rows) + "\n")
    log = cluster_logs.read_log(path)
    assert log.validation == ["val-core/aime24/acc/mean@32", "val-aux/aime24/reward/mean@32"]
    assert [r.get("accuracy") for r in log.records] == pytest.approx([None, 0.2, None, 0.4])
    assert [r.get("val_reward") for r in log.records] == pytest.approx([None, 0.02, None, 0.04])
    assert all(set(r) <= {"step", "entropy", "accuracy", "val_reward"} for r in log.records)


def test_label_and_algo_mistakes_are_one_line_errors_listing_the_choices(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p in (a, b):
        p.write_text(json.dumps({"step": 1, "data": {"actor/entropy": 1.0}}) + "\n")
    cases = [(["--label", f"x={tmp_path / 'c.jsonl'}"], f"error: label: {tmp_path / 'c.jsonl'} is not one of the "
                                                        f"given paths; expected one of {a}, {b}"),
             (["--label", "x"], "error: label: expected NAME=PATH, got 'x'"),
             (["--label", f"x={a}", "--label", f"x={b}"], "error: label: 'x' is given twice"),
             (["--algo", "a=grpo2"], "error: algo: unknown algorithm 'grpo2' (did you mean 'grpo'?); expected one of ppo, grpo"),
             (["--algo", "zz=grpo"], f"error: algo: 'zz' names no run; expected a run's label or a given path: a, b, "
                                     f"{a}, {b}")]
    for extra, expected in cases:
        res = run_report(a, b, *extra, "--out", tmp_path / "r.md")
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert res.output.startswith(expected), res.output
    res = run_report(tmp_path, "--label", f"x={tmp_path}", "--out", tmp_path / "r.md")
    assert res.exit_code == 2 and res.output.strip() == (f"error: label: {tmp_path} holds 2 runs; give the folder "
                                                         "or log of one run")


def test_a_tensorboard_folder_without_scalars_is_named(tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    folder = tmp_path / "tensorboard_log" / "p" / "exp"
    w = SummaryWriter(str(folder))
    w.add_text("note", "no scalars here", 1)
    w.close()
    res = run_report(tmp_path, "--out", tmp_path / "r.md")
    assert res.exit_code == 2 and res.output.strip() == (f"error: {folder}: a TensorBoard event folder with no "
                                                         f"scalars; expected {cluster_logs.FORMATS}")


def test_an_unknown_algorithm_is_warned_with_the_flag_that_names_it(tmp_path):
    write_verl_jsonl(tmp_path / "qwen7b-grpo-lr1e6" / "verl.jsonl", "grpo", 3)
    res = run_report(tmp_path, "--out", tmp_path / "r.md")
    assert res.exit_code == 0
    assert ("warning: qwen7b-grpo-lr1e6: no algorithm known, so no claim reads it; name it with --algo "
            "qwen7b-grpo-lr1e6=ALGO or in its run.json") in res.output
    assert "| unknown (--algo) |" in (tmp_path / "r.md").read_text()


def test_curves_draw_only_logged_metrics_validation_as_markers(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from PIL import Image
    write_verl_jsonl(tmp_path / "grpo" / "verl.jsonl", "grpo", 12, val_every=4)
    runs, _ = cluster_logs.load([tmp_path])
    drawn = {}
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: drawn.setdefault("fig", fig))  # keep the figure to look at
    panels = cluster_logs.plot_runs(cluster_logs.Groups(runs), tmp_path / "c.png")
    fig = drawn["fig"]
    # the five metrics verl_metrics logs and the validation accuracy; no empty panel for kl_ref, val_reward, ...
    assert panels == ["accuracy", "reward", "entropy", "clip_frac", "rur", "resp_len"]
    assert len(fig.axes) == len(panels)
    for ax, key in zip(fig.axes, panels):
        (line,) = ax.get_lines()
        assert ax.get_title().startswith(key) and ax.get_xticklabels() and ax.get_yticklabels()
        if key == "accuracy":  # steps 4, 8, 12: three markers at the logged steps
            assert line.get_marker() == "o" and list(line.get_xdata()) == [4, 8, 12]
        else:
            assert line.get_marker() in ("None", None, "") and len(line.get_xdata()) == 12
    real_close(fig)
    assert Image.open(tmp_path / "c.png").info["dpi"][0] >= 100


def test_a_folder_named_with_a_backtick_and_html_puts_neither_into_the_report(tmp_path):
    import subprocess
    name = "a`<img src=x onerror=alert(2)>`"
    run = tmp_path / name
    run.mkdir()
    (run / "verl.jsonl").write_text("".join(json.dumps({"step": s, "data": verl_metrics(s, "grpo")}) + "\n"
                                            for s in (1, 2, 3)))
    out = tmp_path / "r.md"
    text = cluster_logs.write_report([run], out, algos=[f"{name}=grpo"]).read_text()  # '=' in the folder's name
    assert "<img" not in text and "`<" not in text and ">`" not in text
    assert f"| {cluster_logs.md(name)} | verl | grpo |" in text
    command = text.split("```\n")[1].splitlines()[0]  # Produced by: the command, as bash reads it back
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, check=True).stdout
    assert words.decode().split("\0")[:-1] == ["cliplab", "report", str(run), "--algo", f"{name}=grpo", "--out",
                                               str(out)]
