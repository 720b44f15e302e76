"""Our GRPO loss equals TRL GRPOTrainer._compute_loss on the same batch (same tiny model, completions, advantages
and old log-probs)."""
import pytest

pytest.importorskip("trl")


def test_same_batch_same_loss(tiny_path):
    from harness.runs.trl_compare import same_batch_losses
    res = same_batch_losses(tiny_path, seed=1)
    assert res["abs_diff"] < 1e-5 and abs(res["trl_loss"]) > 1e-4, res
    assert 0 < res["clip_frac"] < 1  # the old log-probs are offset so that some tokens clip


from gpu_helpers import tiny_path  # noqa: E402,F401  (fixture)
