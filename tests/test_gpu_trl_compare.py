"""Our GRPO loss equals TRL GRPOTrainer._compute_loss on the same batch (same tiny model, completions, advantages
and old log-probs), and the step timing is symmetric."""
import pytest

pytest.importorskip("trl")


def test_same_batch_same_loss(tiny_path):
    from harness.runs.trl_compare import same_batch_losses
    res = same_batch_losses(tiny_path, seed=1)
    assert res["abs_diff"] < 1e-5 and abs(res["trl_loss"]) > 1e-4, res
    assert 0 < res["clip_frac"] < 1  # the old log-probs are offset so that some tokens clip


from gpu_helpers import tiny_path  # noqa: E402,F401  (fixture)


def test_timing_is_symmetric(tiny_path):
    """Fresh trainers, pairs in alternating order, lengths and ratios of the timed steps only, the t interval of
    the ratios' mean as scipy gives it."""
    import numpy as np
    from scipy import stats

    from harness.runs.trl_compare import time_both
    res = time_both(tiny_path, 2, gradient_checkpointing=False)
    ours, trl = res["ours_steps"], res["trl_steps"]
    assert all(len(r[c]) == 2 for r in (ours, trl) for c in r)  # the warm-up pair dropped from every record
    # timed pairs 1 and 2: ours first in the odd one, TRL's step first in the even one
    assert [o < t for o, t in zip(ours["start"], trl["start"])] == [True, False]
    assert res["ours_len_mean"] == np.mean(ours["len_mean"]) and res["trl_len_mean"] == np.mean(trl["len_mean"])
    ratios = np.array(trl["cpu"]) / np.array(ours["cpu"])
    assert res["speedup"] == np.median(ratios)
    assert res["speedup_half"] == pytest.approx(stats.t.ppf(0.975, 1) * ratios.std(ddof=1) / np.sqrt(2))
    assert 1 <= min(ours["len_mean"] + trl["len_mean"]) and max(ours["len_mean"] + trl["len_mean"]) <= 16
