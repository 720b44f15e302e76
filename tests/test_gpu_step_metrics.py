"""The simulator's per-step metrics on real-model steps (gpu/step_metrics.py), against values worked by hand, and
the trainer writing them."""
import json
import math

import numpy as np
import pytest
import torch

from gpu.config import from_dict
from gpu.step_metrics import CLIP_KEYS, StepClips, batch_cov, pass_at_k, rollout_metrics
from gpu.train import Trainer
from gpu_helpers import tiny_config


def test_pass_at_k_from_the_group_by_hand():
    # G = 4; groups with 0, 1 and 4 correct. pass@1 = c/4: (0 + 1/4 + 1) / 3; pass@2 = 1 - C(4-c,2)/C(4,2):
    # c=0 -> 0, c=1 -> 1 - 3/6 = 1/2, c=4 -> 1
    correct = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1])
    assert pass_at_k(correct, 4, 1) == pytest.approx((0 + 0.25 + 1) / 3)
    assert pass_at_k(correct, 4, 2) == pytest.approx((0 + 0.5 + 1) / 3)
    assert pass_at_k(correct, 4, 4) == pytest.approx(2 / 3)  # a group passes iff it has a correct answer
    with pytest.raises(ValueError, match="^k: "):
        pass_at_k(correct, 4, 5)


def test_rollout_metrics_by_hand():
    lens = torch.tensor([3.0, 5.0, 7.0, 9.0, 2.0, 2.0, 2.0, 2.0])
    correct = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0])
    rewards = correct.float()
    m = rollout_metrics(lens, correct, rewards, 4, trained=4)
    assert m["resp_len"] == pytest.approx(32 / 8)
    assert m["len_correct"] == pytest.approx((3 + 9) / 2) and m["len_wrong"] == pytest.approx((5 + 7 + 8) / 6)
    assert m["zero_grad_frac"] == 0.5 and m["gen_per_trained"] == 2.0
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@4"] == pytest.approx(0.5)


def test_batch_cov_by_hand():
    logp = torch.tensor([[-1.0, -2.0, 9.0], [-3.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 5.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # tokens (x, a): (-1, 1), (-2, 1), (-3, -2); means -2 and 0; cov = ((1)(1) + 0 + (-1)(-2)) / 3 = 1
    assert batch_cov(logp, adv, mask) == pytest.approx(1.0)
    assert batch_cov(logp, adv, torch.tensor([[1.0, 0, 0], [0, 0, 0]])) is None


def test_clip_sides_by_hand():
    # token ratios 1.5 (A>0: up-clipped), 1.25 (A>0: freed by eps_high 0.28), 0.5 (A<0: low-clipped),
    # 0.5 (A>0: inside), padding (ignored)
    old = torch.log(torch.tensor([[0.1, 0.3, 0.5, 0.4, 0.5]]))
    ratio = torch.tensor([[1.5, 1.25, 0.5, 0.5, 3.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    c = StepClips("dapo", {"eps_low": 0.2, "eps_high": 0.28})
    c.add(old + torch.log(ratio), old, adv, mask)
    s = c.summary()
    assert s["clip_up_frac"] == 0.25 and s["clip_low_frac"] == 0.25 and s["freed_frac"] == 0.25
    assert s["upclip_pold_median"] == pytest.approx(0.1) and s["upclip_pold_lt02"] == 1.0
    assert s["freed_pold_median"] == pytest.approx(0.3)
    assert s["ratio_dev_median"] == pytest.approx(0.5)  # |r - 1| of 0.5, 0.25, 0.5, 0.5
    # GSPO: one sequence ratio, the geometric mean of the tokens' ratios: (1.5 * 1.25 * 0.5 * 0.5)^(1/4) < 1.2
    g = StepClips("gspo", {"eps_low": 3e-4, "eps_high": 4e-4})
    g.add(old + torch.log(ratio), old, adv, mask)
    seq = (1.5 * 1.25 * 0.5 * 0.5) ** 0.25  # 0.827: below 1 - 3e-4, so tokens with A < 0 are low-clipped
    assert g.summary()["clip_low_frac"] == 0.25 and g.summary()["clip_up_frac"] == 0.0
    assert g.summary()["ratio_dev_median"] == pytest.approx(1 - seq)
    # SAPO's soft gate has no hard clip: its clip statistics are undefined (None), never 0
    sapo = StepClips("sapo", {})
    sapo.add(old + torch.log(ratio), old, adv, mask)
    assert all(sapo.summary()[k] is None for k in CLIP_KEYS) and sapo.summary()["trunc_frac"] is None
    assert sapo.summary()["ratio_dev_median"] == pytest.approx(0.5)


def test_the_regime_card_statistics_by_hand():
    # six tokens (and padding): pi_old, ratio, A. GRPO's bounds 0.8 / 1.2.
    #   0.10, 1.5,   +1: up-clipped, a decision token, |r-1| 0.5
    #   0.30, 1.25,  +1: up-clipped, decision, 0.25
    #   0.50, 0.5,   -1: down-clipped, decision, 0.5
    #   0.95, 1.001, +1: inside; pi_old >= 0.9: no decision token
    #   0.40, 0.5,    0: A = 0: neither clipped nor a decision token
    #   0.05, 1.0,   -1: inside, decision, 0
    old = torch.log(torch.tensor([[0.1, 0.3, 0.5, 0.95, 0.4, 0.05, 0.5]]))
    ratio = torch.tensor([[1.5, 1.25, 0.5, 1.001, 0.5, 1.0, 9.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, 0.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 1, 0]])
    c = StepClips("grpo", {"eps_low": 0.2, "eps_high": 0.2})
    c.add(old + torch.log(ratio), old, adv, mask)
    # a second update's micro-batch, still on-policy: two tokens at r = 1 exactly (A != 0, pi_old 0.6: decisions)
    c.add(torch.log(torch.tensor([[0.6, 0.6]])), torch.log(torch.tensor([[0.6, 0.6]])), torch.tensor([[1.0, -1.0]]),
          torch.ones(1, 2), on_policy=True)
    s = c.summary()
    assert s["zero_adv_frac"] == pytest.approx(1 / 8) and s["on_policy_frac"] == pytest.approx(2 / 8)
    assert s["clip_frac"] == pytest.approx(3 / 8) and s["clip_frac_active"] == pytest.approx(3 / 7)
    assert s["clip_up_frac"] == pytest.approx(2 / 8) and s["clip_low_frac"] == pytest.approx(1 / 8)
    assert s["upclip_pold_median"] == pytest.approx(0.2) and s["upclip_pold_lt02"] == 0.5
    assert s["lowclip_pold_median"] == pytest.approx(0.5) and s["lowclip_pold_lt02"] == 0.0
    # decision |r - 1|: 0.5, 0.25, 0.5, 0, 0, 0 -> sorted 0, 0, 0, 0.25, 0.5, 0.5: median 0.125, q90 at 4.5 -> 0.5
    assert s["decision_dev_q50"] == pytest.approx(0.125) and s["decision_dev_q90"] == pytest.approx(0.5)
    assert s["decision_frac"] == pytest.approx(6 / 8)  # those six of the eight trained tokens
    assert s["decision_clip_frac"] == pytest.approx(3 / 6) and s["decision_clip_up_frac"] == pytest.approx(2 / 6)
    assert s["trunc_frac"] is None
    # CISPO truncates its weight to [1 - eps_low, 1 + eps_high] = [0, 5] (relative cap), or [0, eps_high] = [0, 4]
    for mode, truncated in (("relative", 1 / 3), ("absolute", 2 / 3)):
        cispo = StepClips("cispo", {"eps_low": 1.0, "eps_high": 4.0, "cap_mode": mode})
        r = torch.tensor([[6.0, 4.5, 0.5]])
        cispo.add(torch.log(r * 0.1), torch.log(torch.full((1, 3), 0.1)), torch.ones(1, 3), torch.ones(1, 3))
        assert cispo.summary()["trunc_frac"] == pytest.approx(truncated), mode
        assert all(cispo.summary()[k] is None for k in CLIP_KEYS)


def test_dcpo_bounds_widen_for_rare_tokens():
    # DCPO's upper bound 0.5 + 0.5 sqrt(1 + 4 eps_high / q): q = 0.1 -> 0.5 + 0.5 * sqrt(9) = 2.0 with eps_high 0.2
    old = torch.log(torch.tensor([[0.1, 0.9]]))
    ratio = torch.tensor([[1.9, 1.9]])
    c = StepClips("dcpo", {"eps_low": 0.16, "eps_high": 0.2, "r_max": 10.0})
    c.add(old + torch.log(ratio), old, torch.ones(1, 2), torch.ones(1, 2))
    # q = 0.9: hi = 0.5 + 0.5 sqrt(1 + 0.8 / 0.9) = 1.187 < 1.9: clipped; q = 0.1: 1.9 < 2.0: not clipped
    assert c.summary()["clip_up_frac"] == 0.5 and c.summary()["upclip_pold_median"] == pytest.approx(0.9)


def test_trainer_writes_the_simulator_metrics(tmp_path):
    raw = tiny_config(tmp_path / "r", "grpo", train={"epochs": 2, "minibatch_size": 4})
    Trainer(from_dict(raw)).fit()
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    for m in rows:
        for k in ("clip_up_frac", "clip_low_frac", "ratio_dev_median", "cov_logp_adv", "pass@1", "pass@4",
                  "resp_len", "len_wrong", "zero_grad_frac", "gen_per_trained", "tcr", "gap_mean_abs"):
            assert k in m, k
        # fixed clip without dual clip: a token is clipped iff it is up- or low-clipped
        assert m["tcr"] == pytest.approx(m["clip_up_frac"] + m["clip_low_frac"])
        assert m["gen_per_trained"] == 1.0 and 0 <= m["pass@1"] <= m["pass@4"] <= 1
        assert not math.isnan(m["cov_logp_adv"])
        # the step's time split: generation, the passes without gradient, the optimiser, within the training part
        assert m["rollout_s"] > 0 and 0 < m["old_logp_s"] and 0 < m["optimizer_s"]
        assert m["old_logp_s"] + m["optimizer_s"] < m["train_s"] <= m["step_time_s"]
    assert any(m["ratio_dev_median"] > 0 for m in rows)  # the second minibatch and epoch see moved ratios


@pytest.mark.parametrize("algo", ["grpo", "dapo", "gspo", "dcpo", "cispo", "sapo"])
def test_the_card_metrics_agree_with_the_simulators_on_one_batch(algo):
    """The two layers' step metrics (written apart, in torch and in NumPy) on the same random update: every metric
    both define has the same value (None where one is undefined)."""
    from sim.metrics import StepClips as SimClips
    from spec.registry import ALGORITHMS
    rng = np.random.default_rng(7)
    p_old = rng.uniform(0.01, 1.0, (6, 9))
    p_old[:, :4] = np.minimum(p_old[:, :4] + 0.9, 0.999)  # near-certain tokens beside the decision tokens
    old = np.log(p_old)
    logp = old + rng.normal(0, 0.3, old.shape)
    adv = np.repeat(rng.choice([-1.0, 0.0, 1.0], (6, 1)), 9, axis=1)
    mask = (np.arange(9) < rng.integers(3, 10, (6, 1))).astype(float)
    hp = dict(ALGORITHMS[algo].defaults)
    sim = SimClips(algo, hp)
    sim.add(logp, old, adv, mask)
    want = sim.summary()[0]
    trainer = StepClips(algo, hp)
    trainer.add(*(torch.tensor(x) for x in (logp, old, adv, mask)))
    got = trainer.summary()
    shared = sorted(set(want) & set(got))
    assert {"decision_frac", "decision_dev_q50", "zero_adv_frac", "on_policy_frac"} <= set(shared)
    if ALGORITHMS[algo].clip in ("fixed", "dynamic"):  # a hard clip: the clip statistics are defined, and bind
        assert want["decision_clip_frac"] > 0 and want["upclip_pold_median"] is not None
    for key in shared:
        assert (got[key] is None) == (want[key] is None), key
        if got[key] is not None:
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
