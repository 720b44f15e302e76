"""Properties of the losses and parts, each checked against a value computed another way."""
import numpy as np
import pytest
import torch

import gpu
import sim
import spec
from harness.verify.cases import make_case
from spec.registry import POLICY_ALGORITHMS

LAYER_BOUNDS = {"spec": lambda q: tuple(np.asarray(b, float) for b in spec.dcpo_bounds(q)),
                "sim": lambda q: sim.dcpo_bounds(q),
                "gpu": lambda q: tuple(b.numpy() for b in gpu.dcpo_bounds(torch.tensor(q, dtype=torch.float64)))}


@pytest.mark.parametrize("layer", list(LAYER_BOUNDS))
def test_dcpo_worked_values(layer):
    """The reference's worked values (eps_low 0.16, eps_high 0.2, r_max 10)."""
    lo, hi = LAYER_BOUNDS[layer](np.array([0.9, 0.1, 0.01, 2.3e-3, 2.1e-3]))
    np.testing.assert_allclose(lo[:3], [0.769, 0.5, 0.5], atol=5e-4)
    np.testing.assert_allclose(hi[:3], [1.187, 2.0, 5.0], atol=5e-4)
    assert hi[3] < 10 and hi[4] == 10  # the cap binds below q = 0.8 / 360 = 2.22e-3


def equal_length_case(seed, prompts=3, group_size=4, length=5):
    case = make_case(seed, prompts=prompts, group_size=group_size, length=length, extreme=False)
    case.mask = np.ones_like(case.mask)
    return case


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_aggregation_modes_relate_when_lengths_are_equal(name):
    case = equal_length_case(1)
    n, g = case.mask.shape[1], case.group_size

    def loss(agg, **hp):
        return sim.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, group_size=g,
                               ref_logp=case.ref_logp, agg=agg, max_len=hp.get("max_len", 7))[0]
    base = loss("seq_mean_token_mean")
    assert loss("token_mean") == pytest.approx(base, rel=1e-12, abs=1e-14)
    assert loss("group_token_mean") == pytest.approx(base, rel=1e-12, abs=1e-14)
    assert loss("seq_mean") == pytest.approx(base, rel=1e-12, abs=1e-14)
    assert loss("seq_mean_token_sum") == pytest.approx(n * base, rel=1e-12, abs=1e-14)
    assert loss("group_seq_sum_token_mean") == pytest.approx(g * base, rel=1e-12, abs=1e-14)
    assert loss("seq_mean_token_sum_norm", max_len=n) == pytest.approx(base, rel=1e-12, abs=1e-14)


def test_token_mean_weights_long_responses_more():
    """token_mean counts tokens, seq_mean_token_mean counts responses: with one long and one short response of
    equal and opposite advantage, token_mean favours the long one's sign."""
    logp = np.full((2, 4), -1.0)
    mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], float)
    adv = np.array([[1.0] * 4, [-1.0] * 4])
    tm = sim.policy_loss("ppo", logp, logp, adv, mask, agg="token_mean")[0]
    sm = sim.policy_loss("ppo", logp, logp, adv, mask, agg="seq_mean_token_mean")[0]
    assert tm == pytest.approx(-(4 - 1) / 5) and sm == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(5))
def test_gspo_token_equals_gspo_for_sequence_advantages(seed):
    case = make_case(seed, seq_adv=True, extreme=False)
    args = (case.logp, case.old_logp, case.adv, case.mask)
    l1, g1, s1 = sim.policy_loss("gspo", *args, agg="seq_mean_token_mean")
    l2, g2, s2 = sim.policy_loss("gspo_token", *args)
    assert l1 == pytest.approx(l2, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(g1, g2, rtol=1e-12, atol=1e-15)
    assert s1["clip_frac"] == s2["clip_frac"]
    t1, t2 = (torch.tensor(case.logp, requires_grad=True) for _ in range(2))
    for name, t in (("gspo", t1), ("gspo_token", t2)):
        loss, _ = gpu.policy_loss(name, t, *(torch.tensor(x) for x in args[1:]), agg="seq_mean_token_mean")
        loss.backward()
    torch.testing.assert_close(t1.grad, t2.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["ppo", "dr_grpo", "dapo", "dcpo", "gspo_token"])
@pytest.mark.parametrize("seed", range(4))
def test_clip_frac_counts_exactly_the_zeroed_gradients(name, seed):
    case = make_case(seed, prompts=2, group_size=3, length=5)
    case.adv[case.adv == 0] = 0.5
    loss, grad, stats = sim.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, group_size=3,
                                        max_len=5)
    on = case.mask > 0
    zeroed = (grad == 0) & on
    assert stats["clip_frac"] == pytest.approx(zeroed.sum() / max(on.sum(), 1))


@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "dcpo", "sapo", "gspo_token"])
def test_on_policy_gradient_is_the_policy_gradient(name):
    """At r = 1 every clipped or gated surrogate has gradient -A times the aggregation weight (SAPO's gate has
    derivative 1 at r = 1), here with seq_mean_token_mean: -A / (|o_i| * B)."""
    case = make_case(3, prompts=2, group_size=2, length=4)
    case.mask[:, 0] = 1
    lens = case.mask.sum(1, keepdims=True)
    _, grad, stats = sim.policy_loss(name, case.old_logp, case.old_logp, case.adv, case.mask, group_size=2,
                                     agg="seq_mean_token_mean", beta=0.0)
    np.testing.assert_allclose(grad, -case.adv * case.mask / lens / len(lens), atol=1e-15)
    assert stats["clip_frac"] == 0 and stats["ratio_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_padding_values_do_not_matter(name):
    case = make_case(7, prompts=2, group_size=2, length=5)
    garbage = np.where(case.mask > 0, case.logp, 123.0)
    kw = dict(group_size=2, ref_logp=case.ref_logp, max_len=5)
    a = sim.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask, **kw)
    b = sim.policy_loss(name, garbage, np.where(case.mask > 0, case.old_logp, -50.0), case.adv, case.mask,
                        **{**kw, "ref_logp": np.where(case.mask > 0, case.ref_logp, 77.0)})
    assert a[0] == b[0] and np.array_equal(a[1], b[1])


SAS = {"spec": spec.SmoothAdvantage, "sim": sim.SmoothAdvantage, "gpu": gpu.SmoothAdvantage}


@pytest.mark.parametrize("layer", list(SAS))
def test_sas_all_equal_group_still_trains(layer):
    """Visit 1: [1, 0, 0, 1]; visit 2 all zeros: pooled mean 1/4, pooled variance 1/8 + 1/16 = 3/16, so every
    response gets A_total / 2 = (-1/4) / sqrt(3/16) / 2 (DCPO Eq. 29-30)."""
    sas = SAS[layer]()
    conv = (lambda x: torch.tensor(x, dtype=torch.float64)) if layer == "gpu" else np.asarray
    first = np.asarray(sas(["p"], conv([1.0, 0.0, 0.0, 1.0]), 4), dtype=float)
    np.testing.assert_allclose(first, [1, -1, -1, 1])  # population std 1/2
    second = np.asarray(sas(["p"], conv([0.0, 0.0, 0.0, 0.0]), 4), dtype=float)
    np.testing.assert_allclose(second, [(-0.25 / np.sqrt(3 / 16)) / 2] * 4, rtol=1e-12)


def test_sas_history_survives_a_state_round_trip():
    a, b = sim.SmoothAdvantage(), sim.SmoothAdvantage()
    a(["x", "y"], np.array([1.0, 0, 0, 0, 1, 1]), 3)
    b.load_state_dict(a.state_dict())
    r = np.array([0.0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(a(["x", "y"], r, 3), b(["x", "y"], r, 3))


def test_grpo_advantage_matches_pandas_groupby():
    import pandas as pd
    rewards = np.random.default_rng(0).integers(0, 2, 24).astype(float)
    frame = pd.DataFrame({"g": np.repeat(np.arange(6), 4), "r": rewards})
    z = (frame.r - frame.groupby("g").r.transform("mean")) / (frame.groupby("g").r.transform("std") + 1e-6)
    np.testing.assert_allclose(sim.group_advantages(rewards, 4), z.to_numpy(), atol=1e-12)


@pytest.mark.parametrize("layer", ["spec", "sim", "gpu"])
def test_overlong_penalty_eq13(layer):
    mod = {"spec": spec, "sim": sim, "gpu": gpu}[layer]
    lengths = [10.0, 16.0, 18.0, 20.0, 21.0]
    conv = torch.tensor if layer == "gpu" else np.asarray
    out = np.asarray(mod.overlong_penalty(conv(lengths), max_len=20, cache_len=4), dtype=float)
    np.testing.assert_allclose(out, [0, 0, -0.5, -1, -1])


def test_dynamic_sampling_keeps_the_expected_share():
    """With G = 16 and success rate p = 0.9 a group is all-equal with probability p^16 + (1-p)^16 (0.19)."""
    rng = np.random.default_rng(0)
    rewards = (rng.random(16 * 20000) < 0.9).astype(float)
    dropped = 1 - sim.dynamic_sampling_filter(rewards, 16).mean()
    assert dropped == pytest.approx(0.9**16 + 0.1**16, abs=0.01)


def test_gae_with_lam_one_is_return_to_go_minus_value():
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    mask = np.ones((3, 6))
    adv, ret = sim.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, np.cumsum(rewards[:, ::-1], 1)[:, ::-1] - values, atol=1e-12)
    np.testing.assert_allclose(ret, adv + values)


def test_k3_is_unbiased_for_kl_exhaustively():
    rng = np.random.default_rng(0)
    logits, ref_logits = rng.normal(size=7), rng.normal(size=7)
    logp = logits - np.logaddexp.reduce(logits)
    ref = ref_logits - np.logaddexp.reduce(ref_logits)
    p = np.exp(logp)
    kl_true = float((p * (logp - ref)).sum())
    for kind in ("k1", "k3"):
        assert float((p * sim.kl(logp, ref, kind)).sum()) == pytest.approx(kl_true, rel=1e-12)
    assert (sim.kl(logp, ref, "k3") >= 0).all()


def test_dpo_gradient_pushes_chosen_up_and_rejected_down():
    loss, (gw, gl), stats = sim.dpo_loss([-5.0, -3.0], [-4.0, -6.0], [-5.0, -5.0], [-5.0, -5.0])
    assert (gw < 0).all() and (gl > 0).all()
    margins = 0.1 * np.array([0.0 - 1.0, 2.0 + 1.0])
    assert loss == pytest.approx(np.mean(np.log1p(np.exp(-margins))))
    assert stats["reward_accuracy"] == 0.5
