"""The algorithms beyond the seeds (CISPO, GMPO, GPG, Clip-Cov, KL-Cov, RLOO, REINFORCE++, rollout correction, the
two-sided clip, k3_unbiased): values computed by hand, the three layers against each other, and bad input."""
import math

import numpy as np
import pytest
import torch

import gpu
import sim
import spec
from spec.registry import AGG_MODES

NEW = ("cispo", "gmpo", "gpg", "clip_cov", "kl_cov")


def _float(x):
    return np.asarray(x, dtype=object).astype(float)


def run(layer, name, logp, old, adv, mask, **kw):
    """(loss, gradient in logp, stats or None) of one layer, as floats."""
    if layer == "spec":
        loss, grad = spec.policy_loss(name, logp, old, adv, mask, **kw)
        return float(loss), _float(grad), None
    if layer == "sim":
        return sim.policy_loss(name, logp, old, adv, mask, **kw)
    t = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    kw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    loss, stats = gpu.policy_loss(name, t, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), **kw)
    loss.backward()
    return float(loss.detach()), t.grad.numpy(), stats


LAYERS = ("spec", "sim", "gpu")


def module(layer):
    """The layer's module and its float64 array conversion."""
    if layer == "gpu":
        return gpu, lambda x: torch.tensor(np.asarray(x, dtype=np.float64))
    return {"spec": spec, "sim": sim}[layer], np.asarray


@pytest.fixture(params=LAYERS)
def layer(request):
    return request.param


def arr(*rows):
    return np.array(rows, dtype=float)


# -- values by hand ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cap_mode, weight", [("relative", 5.0), ("absolute", 4.0)])
def test_cispo_truncates_the_weight_not_the_gradient(layer, cap_mode, weight):
    # r = 6 is above both caps (1 + 4 = 5 and 4); l = -w A logp, dl/dlogp = -w A with A = 0.5
    old = -2.0
    lp = old + math.log(6.0)
    loss, grad, stats = run(layer, "cispo", arr([lp]), arr([old]), arr([0.5]), arr([1.0]), cap_mode=cap_mode)
    assert loss == pytest.approx(-weight * 0.5 * lp, rel=1e-12)
    assert grad[0, 0] == pytest.approx(-weight * 0.5, rel=1e-12)
    if stats is not None:
        assert stats["trunc_frac"] == 1.0 and stats["clip_frac"] == 0.0


@pytest.mark.parametrize("cap_mode, weight, truncated", [("relative", 0.5, 1.0), ("absolute", math.exp(-2.0), 0.0)])
def test_cispo_absolute_cap_has_no_lower_bound(layer, cap_mode, weight, truncated):
    # r = e^-2 = 0.135, eps_low 0.5, eps_high 4, A = 1: the paper's weight is clip(r, 0.5, 5) = 0.5; TRL's
    # clamp(r, max=4) leaves r = 0.135 itself
    old = -1.0
    lp = old - 2.0
    loss, grad, stats = run(layer, "cispo", arr([lp]), arr([old]), arr([1.0]), arr([1.0]), cap_mode=cap_mode,
                            eps_low=0.5, eps_high=4.0)
    assert loss == pytest.approx(-weight * lp, rel=1e-12)
    assert grad[0, 0] == pytest.approx(-weight, rel=1e-12)
    if stats is not None:
        assert stats["trunc_frac"] == truncated


def test_gmpo_geometric_mean_of_log_clipped_ratios(layer):
    # row 0, A = 1, log-ratios 0.1 and 1.0: clipped to 0.1 and 0.4 (eps 0.4), loss -exp(0.25), token 1 gets no grad
    # row 1, A = -1, log-ratios -1.0 and 0.2: max(x, clip(x)) gives -0.4 and 0.2, loss exp(-0.1), token 0 none
    old = arr([-1.0, -2.0], [-1.5, -0.5])
    logp = old + arr([0.1, 1.0], [-1.0, 0.2])
    loss, grad, stats = run(layer, "gmpo", logp, old, arr([1.0, 1.0], [-1.0, -1.0]), np.ones((2, 2)))
    assert loss == pytest.approx((-math.exp(0.25) + math.exp(-0.1)) / 2, rel=1e-12)  # seq_mean over two rows
    np.testing.assert_allclose(grad, [[-math.exp(0.25) / 4, 0.0], [0.0, math.exp(-0.1) / 4]], rtol=1e-12, atol=0)
    if stats is not None:
        assert stats["clip_frac"] == 0.5


def test_gpg_is_the_plain_policy_gradient(layer):
    logp, adv = arr([-1.0, -2.0], [-0.5, -3.0]), arr([2.0, 2.0], [-1.0, -1.0])
    mask = arr([1, 1], [1, 0])
    loss, grad, _ = run(layer, "gpg", logp, logp + 0.3, adv, mask)  # no ratio: old_logp plays no part
    assert loss == pytest.approx(-(2 * -1 + 2 * -2 + -1 * -0.5) / 3, rel=1e-12)
    np.testing.assert_allclose(grad, [[-2 / 3, -2 / 3], [1 / 3, 0.0]], rtol=1e-12)


def test_kl_cov_penalises_the_largest_covariance(layer):
    # logp -1..-4 (mean -2.5), A = 1, -1, 1, -1 (mean 0): cov = 1.5, -0.5, -0.5, 1.5; k = 1/4 selects one token and
    # the tie goes to the earlier one (token 0). log r = 0.1 everywhere.
    logp = arr([-1.0, -2.0, -3.0, -4.0])
    adv = arr([1.0, -1.0, 1.0, -1.0])
    r = math.exp(0.1)
    loss, grad, stats = run(layer, "kl_cov", logp, logp - 0.1, adv, np.ones((1, 4)), kl_cov_ratio=0.25,
                            kl_cov_coef=2.0)
    assert loss == pytest.approx((-r * 1 + 2.0 * 0.1 + r - r + r) / 4, rel=1e-12)
    np.testing.assert_allclose(grad, [[(-r + 2.0) / 4, r / 4, -r / 4, r / 4]], rtol=1e-12)
    if stats is not None:
        assert stats["cov_frac"] == 0.25 and stats["clip_frac"] == 0.0


def test_clip_cov_detaches_the_selected_token(layer):
    # log r = 0 (inside the clip): the PPO loss is -mean(A); selecting token 1 keeps its value, zeroes its gradient
    logp, adv = arr([-1.0, -2.0, -3.0]), arr([1.0, 2.0, -1.0])
    select = arr([0, 1, 0])
    loss, grad, stats = run(layer, "clip_cov", logp, logp, adv, np.ones((1, 3)), cov_select=select)
    assert loss == pytest.approx(-2.0 / 3, rel=1e-12)
    np.testing.assert_allclose(grad, [[-1 / 3, 0.0, 1 / 3]], rtol=1e-12)
    if stats is not None:
        assert stats["clip_frac"] == pytest.approx(1 / 3) and stats["cov_frac"] == pytest.approx(1 / 3)


def test_clip_cov_seeded_choice_is_within_the_window(layer):
    # cov = (logp - mean) (A - mean A): logp -1..-4 deviate by 1.5, 0.5, -0.5, -1.5 and A = 4, -4, -4, 4 (mean 0),
    # so the covs are 6, -2, 2, -6; only token 2 lies in (1, 5): any seed, and a share below one token selects one
    logp, adv = arr([-1.0, -2.0, -3.0, -4.0]), arr([4.0, -4.0, -4.0, 4.0])
    for seed in (0, 1, 7):
        _, grad, _ = run(layer, "clip_cov", logp, logp, adv, np.ones((1, 4)), cov_seed=seed)
        np.testing.assert_allclose(grad, [[-1.0, 1.0, 0.0, -1.0]], rtol=1e-12)


@pytest.mark.parametrize("cap, capped_loss", [({"delta": 2.0}, 2.0), ({"dual_clip": 3.0}, 3.0)])
def test_clip_cov_candidates_exclude_only_ppo_clipped_tokens(layer, cap, capped_loss):
    # token 0: A = -1, r = e^2 = 7.39; PPO-clip keeps the unclipped branch (rA < 1.2 A), the cap makes the loss
    # -2 A = 2 (delta 2) or -3 A = 3 (dual clip 3) with no gradient. token 1: A = 1, r = 1, loss -1, gradient -1/2.
    # Both covs are -0.5, inside the window; the share 0.5 chooses one token. The authors' code leaves out only
    # PPO-clipped tokens, so token 0 is a candidate too, and with a seed whose permutation puts it first it is the
    # one chosen: token 1 keeps its gradient (were capped tokens left out, token 1 would be chosen and lose it).
    seed = next(s for s in range(10) if np.random.default_rng(s).permutation(2)[0] == 0)
    logp, old, adv = arr([-1.0, -2.0]), arr([-3.0, -2.0]), arr([-1.0, 1.0])
    loss, grad, stats = run(layer, "clip_cov", logp, old, adv, np.ones((1, 2)), clip_cov_ratio=0.5,
                            clip_cov_lb=-100.0, clip_cov_ub=100.0, cov_seed=seed, **cap)
    assert loss == pytest.approx((capped_loss - 1.0) / 2, rel=1e-12)
    np.testing.assert_allclose(grad, [[0.0, -0.5]], rtol=1e-12, atol=0)
    if stats is not None:
        assert stats["cov_frac"] == 0.5 and stats["clip_frac"] == 0.5


def test_seeded_clip_cov_selects_the_same_tokens_in_every_layer():
    rng = np.random.default_rng(3)
    logp = -rng.exponential(1.0, (4, 6))
    adv = np.repeat(rng.normal(0, 2, (4, 1)), 6, axis=1)
    kw = dict(clip_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0, cov_seed=11)
    zero = [run(layer, "clip_cov", logp, logp - 0.05, adv, np.ones((4, 6)), **kw)[1] == 0 for layer in LAYERS]
    assert zero[0].sum() == 4  # int(0.2 * 24)
    assert (zero[0] == zero[1]).all() and (zero[1] == zero[2]).all()


def test_two_sided_clip_caps_negative_advantages(layer):
    # A = -1, r = 2 > delta = 1.5: loss -min(1.5 A, 1.2 A) = 1.5 and no gradient; without delta: loss 2, grad 2
    lp, old = arr([math.log(2.0) - 1.0]), arr([-1.0])
    loss, grad, stats = run(layer, "ppo", lp, old, arr([-1.0]), arr([1.0]), delta=1.5)
    assert loss == pytest.approx(1.5, rel=1e-12) and grad[0, 0] == 0
    if stats is not None:
        assert stats["clip_frac"] == 1.0
    loss, grad, _ = run(layer, "ppo", lp, old, arr([-1.0]), arr([1.0]))
    assert loss == pytest.approx(2.0, rel=1e-12) and grad[0, 0] == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("kind, rho, weight, cut", [("tis", 3.0, 2.0, 1.0), ("tis", 0.5, 0.5, 0.0),
                                                    ("mis", 3.0, 3.0, 0.0), ("mis", 6.0, 0.0, 1.0),
                                                    ("mis", 0.4, 0.0, 1.0)])
def test_rollout_correction_weights_the_token_loss(layer, kind, rho, weight, cut):
    # GRPO without KL at r = 1, A = 1: the token loss is -1; the weight is min(rho, 2) (TIS) or
    # rho * 1[0.5 <= rho <= 5] (MIS)
    old = arr([-1.0])
    loss, grad, stats = run(layer, "grpo", old, old, arr([1.0]), arr([1.0]), beta=0.0, rollout_correction=kind,
                            rollout_logp=old - math.log(rho))
    assert loss == pytest.approx(-weight, rel=1e-12, abs=1e-300)
    assert grad[0, 0] == pytest.approx(-weight, rel=1e-12, abs=1e-300)
    if stats is not None:
        assert stats["rc_weight_mean"] == pytest.approx(weight) and stats["rc_cut_frac"] == cut


def test_sequence_mis_masks_a_whole_row(layer):
    # row 0: rho = e^0.5 * e^1.0 = e^1.5 = 4.48 kept; row 1: e^1.0 * e^1.0 = e^2 = 7.39 > 5 masked
    old = arr([-1.0, -1.0], [-1.0, -1.0])
    rollout = old - arr([0.5, 1.0], [1.0, 1.0])
    loss, _, stats = run(layer, "grpo", old, old, np.ones((2, 2)), np.ones((2, 2)), beta=0.0,
                         rollout_correction="seq_mis", rollout_logp=rollout)
    assert loss == pytest.approx(-math.exp(1.5) / 2, rel=1e-12)  # seq_mean_token_mean: (-e^1.5 + 0) / 2
    if stats is not None:
        assert stats["rc_cut_frac"] == 0.5


def test_k3_unbiased_by_hand(layer):
    # d = ref - logp = -0.5, k3 = e^-0.5 + 0.5 - 1, r = e^(logp - old) = e^0.2; d/dlogp (r k3) = -r d
    mod, conv = module(layer)
    k = _float(np.asarray(mod.kl(conv([[-1.0]]), conv([[-0.5 - 1.0]]), "k3_unbiased", old_logp=conv([[-1.2]]))))
    assert k[0, 0] == pytest.approx(math.exp(0.2) * (math.exp(-0.5) - 0.5), rel=1e-12)
    _, grad, _ = run(layer, "grpo", arr([-1.0]), arr([-1.2]), arr([0.0]), arr([1.0]), beta=0.1, kl="k3_unbiased",
                     ref_logp=arr([-1.5]))
    assert grad[0, 0] == pytest.approx(0.1 * math.exp(0.2) * 0.5, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gap", [10.0, 20.0, 50.0])
@pytest.mark.parametrize("log_ratio", [0.0, 0.5])
def test_k3_unbiased_gradient_in_low_precision(dtype, gap, log_ratio):
    # GPG with A = 0, beta 1: the gradient is the KL term's alone, d/dlogp (r k3) = -r d with d = ref - logp = gap.
    # On-policy (r = 1) every number is exact in both dtypes: -gap (formed as r k3 + r (1 - e^d), two terms of size
    # e^gap, it came out -32 for gap 20 in float32 and 0 in bfloat16).
    lp = torch.tensor([[-1.0 - gap]], dtype=dtype, requires_grad=True)
    old, ref = torch.tensor([[-1.0 - gap - log_ratio]], dtype=dtype), torch.tensor([[-1.0]], dtype=dtype)
    loss, _ = gpu.policy_loss("gpg", lp, old, torch.zeros(1, 1, dtype=dtype), torch.ones(1, 1, dtype=dtype),
                              ref_logp=ref, beta=1.0, kl="k3_unbiased")
    loss.backward()
    r = math.exp(log_ratio)
    rel = {torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    assert float(lp.grad[0, 0]) == pytest.approx(-r * gap, rel=rel if log_ratio else 0.0)
    assert float(loss.detach()) == pytest.approx(r * (math.exp(gap) - gap - 1.0), rel=rel)


def test_k3_unbiased_derivatives_match_finite_differences():
    # gpu.kl's k3_unbiased has closed-form derivatives in logp (-r d) and ref_logp (r (e^d - 1)): torch's
    # gradcheck compares them with central differences, in float64
    rng = np.random.default_rng(0)
    lp, ref = (torch.tensor(rng.normal(-2.0, 1.0, (3, 4)), requires_grad=True) for _ in range(2))
    old = torch.tensor(rng.normal(-2.0, 1.0, (3, 4)))
    assert torch.autograd.gradcheck(lambda a, b: gpu.kl(a, b, "k3_unbiased", old_logp=old), (lp, ref))


def test_rloo_and_gpg_advantages_by_hand(layer):
    mod, conv = module(layer)
    rloo = _float(np.asarray(mod.group_advantages(conv([1.0, 0.0, 0.0, 1.0]), 4, kind="rloo")))
    np.testing.assert_allclose(rloo, [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3], rtol=1e-12)
    # group 0 all equal (no gradient), group 1 mixed: M = 2 of B = 4, alpha = 2
    gpg_adv = _float(np.asarray(mod.group_advantages(conv([1.0, 1.0, 0.0, 1.0]), 2, kind="gpg")))
    np.testing.assert_allclose(gpg_adv, [0.0, 0.0, -1.0, 1.0], rtol=1e-12)


def test_reinforce_pp_by_hand(layer):
    mod, conv = module(layer)
    # gamma 1, beta 0: returns [[1, 1], [0, pad]]; mean 2/3, unbiased var 1/3
    out = _float(np.asarray(mod.reinforce_pp_advantages(conv([1.0, 0.0]), conv([[1.0, 1.0], [1.0, 0.0]]),
                                                        eps=0.0)))
    sd = math.sqrt(1 / 3)
    np.testing.assert_allclose(out, [[1 / 3 / sd, 1 / 3 / sd], [-2 / 3 / sd, 0.0]], rtol=1e-12)
    # gamma 1/2, beta 1/10, k1 = logp - ref = 1 on every token: row 0 returns G_1 = 1 - 0.1 = 0.9,
    # G_0 = -0.1 + 0.45 = 0.35; row 1 (one token, reward 0): -0.1
    out = _float(np.asarray(mod.reinforce_pp_advantages(
        conv([1.0, 0.0]), conv([[1.0, 1.0], [1.0, 0.0]]), logp=conv([[-1.0, -1.0], [-1.0, -1.0]]),
        ref_logp=conv([[-2.0, -2.0], [-2.0, -2.0]]), beta=0.1, gamma=0.5, eps=0.0)))
    vals = np.array([0.35, 0.9, -0.1])
    z = (vals - vals.mean()) / vals.std(ddof=1)
    np.testing.assert_allclose(out, [[z[0], z[1]], [z[2], 0.0]], rtol=1e-12)
    # baseline: R - mean_g over groups of 2, whitened; all tokens of a row carry it
    out = _float(np.asarray(mod.reinforce_pp_advantages(conv([1.0, 0.0, 1.0, 1.0]), conv(np.ones((4, 1))),
                                                        group_size=2, baseline=True, eps=0.0)))
    vals = np.array([0.5, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(out[:, 0], (vals - vals.mean()) / vals.std(ddof=1), rtol=1e-12)


# -- the three layers against each other on generated batches -----------------------------------------------------

def _batch(seed, rows=4, cols=3):
    rng = np.random.default_rng(seed)
    old = -rng.exponential(1.0, (rows, cols))
    mask = (rng.uniform(size=(rows, cols)) > 0.25).astype(float)
    mask[0] = 1.0
    return dict(logp=old + rng.normal(0, 0.6, (rows, cols)), old_logp=old, adv=rng.normal(0, 1.5, (rows, cols)),
                mask=mask, ref_logp=old + rng.normal(0, 0.3, (rows, cols)),
                rollout_logp=old + rng.normal(0, 0.6, (rows, cols)))


OPTIONS = [{}, {"rollout_correction": "tis", "tis_cap": 1.3}, {"rollout_correction": "mis", "mis_low": 0.7,
                                                                 "mis_high": 1.6},
           {"rollout_correction": "seq_mis", "mis_low": 0.4, "mis_high": 2.5}, {"beta": 0.2, "kl": "k3_unbiased"},
           {"beta": 0.2, "kl": "k1"}]
EXTRA = {"clip_cov": {"clip_cov_ratio": 0.3, "clip_cov_lb": -3.0, "clip_cov_ub": 3.0},
         "kl_cov": {"kl_cov_ratio": 0.3}}


def _agree(name, b, **hp):
    kw = dict(group_size=2, ref_logp=b["ref_logp"], **hp)
    if hp.get("rollout_correction"):
        kw["rollout_logp"] = b["rollout_logp"]
    args = [b[k] for k in ("logp", "old_logp", "adv", "mask")]
    e_loss, e_grad, _ = run("spec", name, *args, **kw)
    s_loss, s_grad, s_stats = run("sim", name, *args, **kw)
    g_loss, g_grad, g_stats = run("gpu", name, *args, **kw)
    for loss, grad in ((e_loss, e_grad), (g_loss, g_grad)):
        assert loss == pytest.approx(s_loss, rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(grad, s_grad, rtol=1e-9, atol=1e-12)
    assert s_stats == pytest.approx(g_stats)


@pytest.mark.parametrize("agg", list(AGG_MODES))
@pytest.mark.parametrize("name", NEW)
def test_new_algorithms_agree_in_every_aggregation_mode(name, agg):
    extra = {"max_len": 4} if agg == "seq_mean_token_sum_norm" else {}
    _agree(name, _batch(hash((name, agg)) % 1000), agg=agg, **EXTRA.get(name, {}), **extra)


@pytest.mark.parametrize("option", range(len(OPTIONS)))
@pytest.mark.parametrize("name", NEW + ("grpo", "gspo", "dcpo", "sapo"))
def test_options_agree_for_every_loss(name, option):
    extra = {"max_len": 4} if name == "dr_grpo" else {}
    _agree(name, _batch(option), **OPTIONS[option], **EXTRA.get(name, {}), **extra)


@pytest.mark.parametrize("name", ["ppo", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "clip_cov"])
def test_two_sided_clip_agrees_for_every_fixed_clip_loss(name):
    extra = {"max_len": 4} if name == "dr_grpo" else {}
    _agree(name, _batch(5), delta=1.3, eps_high=0.1, **EXTRA.get(name, {}), **extra)


# -- bad input, in every layer ---------------------------------------------------------------------------------------

BAD = [
    ("cispo", {"cap_mode": "absolute", "eps_high": 0.5}, "eps_high: CISPO's absolute cap must be >= 1"),
    ("cispo", {"cap_mode": "sometimes"}, "cap_mode: expected one of relative, absolute"),
    ("grpo", {"rollout_correction": "mis", "mis_low": 2.0, "mis_high": 1.0}, "mis_low: expected 0 <= mis_low"),
    ("grpo", {"rollout_correction": "tis", "tis_cap": 0.0}, "tis_cap: expected a number > 0"),
    ("grpo", {"rollout_correction": "icepop"}, "rollout_correction: expected None or one of tis, mis, seq_mis"),
    ("ppo", {"delta": -1.0}, "delta: expected a number > 0"),
    ("ppo", {"delta": 1.1}, "delta: expected a number > 1 \\+ eps_high"),
    ("sapo", {"delta": 3.0}, "delta: the two-sided clip applies to fixed-clip losses, not sapo"),
    ("clip_cov", {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_ub: expected a number > clip_cov_lb"),
    ("kl_cov", {"kl_cov_ratio": 1.5}, "kl_cov_ratio: expected a share in \\[0, 1\\]"),
    ("clip_cov", {"cov_seed": -1}, "cov_seed: expected an integer >= 0"),
    ("grpo", {"kl": "k3_biased"}, "kl: unknown KL estimator"),
]


def _call(layer, name, **kw):
    b = _batch(0)
    mod, conv = module(layer)
    kw = {k: conv(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    return mod.policy_loss(name, *(conv(b[k]) for k in ("logp", "old_logp", "adv", "mask")), group_size=2,
                           ref_logp=conv(b["ref_logp"]), **kw)


@pytest.mark.parametrize("name, hp, message", BAD)
def test_bad_hyper_parameters(layer, name, hp, message):
    with pytest.raises(ValueError, match=message):
        _call(layer, name, **hp)


def test_bad_rollout_logp(layer):
    with pytest.raises(ValueError, match="rollout_logp: rollout_correction='tis' needs rollout_logp"):
        _call(layer, "grpo", rollout_correction="tis")
    with pytest.raises(ValueError, match="rollout_logp: used only by a rollout correction"):
        _call(layer, "grpo", rollout_logp=np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"rollout_logp: expected shape \(4, 3\)"):
        _call(layer, "grpo", rollout_correction="tis", rollout_logp=np.zeros((4, 2)))
    bad = np.zeros((4, 3))
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="rollout_logp: expected finite values"):
        _call(layer, "grpo", rollout_correction="mis", rollout_logp=bad)


def test_bad_cov_select(layer):
    with pytest.raises(ValueError, match="cov_select: expected only 0 and 1"):
        _call(layer, "clip_cov", cov_select=np.full((4, 3), 0.5))
    with pytest.raises(ValueError, match="cov_select: only clip_cov and kl_cov select tokens, not grpo"):
        _call(layer, "grpo", cov_select=np.zeros((4, 3)))
    masked = _batch(1)["mask"]  # has padding
    select = 1.0 - masked
    with pytest.raises(ValueError, match=r"cov_select: selects tokens outside mask"):
        b = _batch(1)
        mod, conv = module(layer)
        mod.policy_loss("kl_cov", *(conv(b[k]) for k in ("logp", "old_logp", "adv", "mask")),
                        cov_select=conv(select))


def test_bad_advantage_arguments(layer):
    mod, conv = module(layer)
    with pytest.raises(ValueError, match="group_size: the leave-one-out mean needs G >= 2"):
        mod.group_advantages(conv([1.0, 0.0]), 1, kind="rloo")
    for eps in (float("nan"), -0.5):
        with pytest.raises(ValueError, match="eps: expected a"):
            mod.group_advantages(conv([1.0, 0.0]), 2, eps=eps)
    with pytest.raises(ValueError, match="old_logp: the k3_unbiased estimator"):
        mod.kl(conv([[0.0]]), conv([[0.0]]), "k3_unbiased")
    with pytest.raises(ValueError, match="rewards: expected one reward per row of mask"):
        mod.reinforce_pp_advantages(conv([1.0]), conv(np.ones((2, 2))))
    with pytest.raises(ValueError, match="ref_logp: beta=0.1 > 0 needs logp and ref_logp"):
        mod.reinforce_pp_advantages(conv([1.0, 0.0]), conv(np.ones((2, 2))), beta=0.1)
    with pytest.raises(ValueError, match="group_size: the baseline variant needs group_size"):
        mod.reinforce_pp_advantages(conv([1.0, 0.0]), conv(np.ones((2, 2))), baseline=True)
    with pytest.raises(ValueError, match="gamma: expected a number in \\[0, 1\\]"):
        mod.reinforce_pp_advantages(conv([1.0, 0.0]), conv(np.ones((2, 2))), gamma=1.5)
