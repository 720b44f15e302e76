"""pytest-benchmark: our whole GRPO step against TRL's GRPOTrainer step (same model, prompts, G, completion length,
transformers generate, loss), alternating in one process, on SmolLM2-135M-Instruct with one thread under `make
bench` (TRL at its default gradient checkpointing, and without it); `make test` runs one step of each on the tiny
model, untimed, as a check that the timing runs."""
import json

import pytest

pytest.importorskip("trl")


def test_steps_against_trl(benchmark):
    import torch

    from gpu.models import resolve_model
    from harness.runs.trl_compare import time_both
    torch.set_num_threads(1)
    path, steps = (resolve_model("tiny"), 1) if benchmark.disabled else (resolve_model("smollm2"), 3)
    runs = benchmark.pedantic(lambda: {gc: time_both(path, steps, gradient_checkpointing=gc) for gc in (True, False)},
                              rounds=1)
    print(json.dumps({gc: r["speedup"] for gc, r in runs.items()}))
    for r in runs.values():
        assert len(r["ours_steps"]["cpu"]) == len(r["trl_steps"]["cpu"]) == steps and r["speedup"] > 0
    if not benchmark.disabled:  # the target: at least 1.5x TRL's step rate
        benchmark.extra_info.update({f"speedup_trl_checkpointing_{gc}": r["speedup"] for gc, r in runs.items()})
        assert min(r["speedup"] for r in runs.values()) >= 1.5
