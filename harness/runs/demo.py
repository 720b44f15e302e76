"""`make demo`: the main job on the embedded defaults: verify, simulate, train a small real model, report."""
from __future__ import annotations

from pathlib import Path

DEMO_ALGOS = ["grpo", "dr_grpo", "dapo", "gspo", "dcpo", "sapo"]


def check_demo(out: Path, sim_steps: int, train_steps: int) -> None:
    """Every setting of the demo checked before its first part runs: ``out`` a folder to write, the sweep's plan
    (``sim_steps``) and the training config (``train_steps``)."""
    from gpu.config import from_dict
    from harness.runs.train import demo_config
    from sim.sweep import plan
    from spec.records import writable_folder
    writable_folder(out, "out")
    for check, field, arg in ((lambda: plan("toy_lm", DEMO_ALGOS, 2, sim_steps, {}), "steps: ", "sim-steps: "),
                              (lambda: from_dict(demo_config(Path(out) / "real", train_steps)), "run.steps: ",
                               "train-steps: ")):
        try:
            check()
        except ValueError as exc:  # named by the demo's own option
            raise ValueError(str(exc).replace(field, arg, 1) if str(exc).startswith(field) else str(exc)) from None


def run_demo(out: Path, verify_rows, sim_steps: int = 150, train_steps: int = 4) -> Path:
    """Write ``out/README.md`` linking the three parts' reports; ``verify_rows`` is (rows, derivations)."""
    from harness.verify.layers import markdown as verify_markdown
    from harness.reports.sim import write_report
    from harness.runs.train import demo_train
    from sim.sweep import run_sweep
    out.mkdir(parents=True, exist_ok=True)
    rows, derivations = verify_rows
    run_sweep("toy_lm", DEMO_ALGOS, 2, sim_steps, {}, str(out / "sim"))
    sim_report = write_report([out / "sim"], out / "sim" / "report.md", bandit=False)
    real_run = demo_train(out / "real", steps=train_steps)
    index = out / "README.md"
    index.write_text(
        "# cliplab demo\n\n"
        f"1. **Verify**: the three layers agree (table below).\n"
        f"2. **Simulate**: {', '.join(DEMO_ALGOS)} on the toy LM, 2 seeds x {sim_steps} steps: "
        f"[{sim_report.relative_to(out)}]({sim_report.relative_to(out)}).\n"
        f"3. **Train**: GRPO on SmolLM2-135M-Instruct, {train_steps} steps on the CPU: "
        f"[real/README.md](real/README.md) (metrics in `{real_run.relative_to(out)}/metrics.jsonl`).\n\n"
        "## Verify\n\n" + verify_markdown(rows, derivations))
    return index
