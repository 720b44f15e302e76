"""Bad input gets a clear ValueError naming the argument, in every layer; a fully masked batch is a defined zero."""
import math

import numpy as np
import pytest
import torch

import gpu
import sim
import spec
from spec.registry import KL_KINDS, ROLLOUT_CORRECTIONS

LAYERS = {"spec": (spec, np.asarray), "sim": (sim, np.asarray), "gpu": (gpu, lambda x: torch.tensor(x))}


def batch(rows=4, cols=3):
    rng = np.random.default_rng(0)
    old = -rng.exponential(1.0, (rows, cols))
    return dict(logp=old + 0.1 * rng.normal(size=(rows, cols)), old_logp=old, adv=rng.normal(size=(rows, cols)),
                mask=np.ones((rows, cols)))


def call(layer, name="ppo", **over):
    mod, conv = LAYERS[layer]
    b = {**batch(), **over}
    extra = {k: b.pop(k) for k in list(b) if k not in ("logp", "old_logp", "adv", "mask")}
    if "ref_logp" in extra and extra["ref_logp"] is not None:
        extra["ref_logp"] = conv(extra["ref_logp"])
    return mod.policy_loss(name, *(conv(b[k]) for k in ("logp", "old_logp", "adv", "mask")), **extra)


@pytest.fixture(params=list(LAYERS))
def layer(request):
    return request.param


def test_wrong_shape(layer):
    with pytest.raises(ValueError, match=r"adv: expected shape \(4, 3\)"):
        call(layer, adv=np.zeros((4, 2)))


def test_one_dimensional_logp(layer):
    with pytest.raises(ValueError, match="logp: expected a 2-D"):
        call(layer, logp=np.zeros(4), old_logp=np.zeros(4), adv=np.zeros(4), mask=np.ones(4))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("arg", ["logp", "old_logp", "adv"])
def test_nan_and_inf(layer, arg, bad):
    x = batch()[arg].copy()
    x[1, 2] = bad
    with pytest.raises(ValueError, match=f"^{arg}: expected finite values"):
        call(layer, **{arg: x})


def test_mask_not_binary(layer):
    m = np.ones((4, 3))
    m[0, 0] = 0.5
    with pytest.raises(ValueError, match="mask: expected only 0 and 1"):
        call(layer, mask=m)


def test_non_numeric(layer):
    if layer == "gpu":
        with pytest.raises(ValueError, match="logp: expected a real floating tensor"):
            gpu.policy_loss("ppo", torch.ones(4, 3, dtype=torch.complex64), *[torch.zeros(4, 3)] * 3)
    else:
        with pytest.raises(ValueError, match="logp: expected a numeric array"):
            call(layer, logp=[["a", "b", "c"]] * 4)


def test_group_size_must_divide(layer):
    with pytest.raises(ValueError, match="group_size: 3 does not divide the batch of 4 rows"):
        call(layer, name="dapo", group_size=3)


def test_group_modes_need_group_size(layer):
    with pytest.raises(ValueError, match="group_size: agg='group_token_mean' needs group_size"):
        call(layer, name="dapo")


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_group_size_must_be_positive_int(layer, bad):
    with pytest.raises(ValueError, match="group_size: expected a positive integer"):
        call(layer, name="dcpo", group_size=bad)


def test_unknown_algorithm(layer):
    with pytest.raises(ValueError, match="name: unknown algorithm 'gpro'"):
        call(layer, name="gpro")


def test_dpo_is_not_a_policy_loss(layer):
    with pytest.raises(ValueError, match="name: 'dpo' is not a policy loss"):
        call(layer, name="dpo")


def test_unknown_aggregation(layer):
    with pytest.raises(ValueError, match="agg: unknown aggregation mode 'mean'"):
        call(layer, agg="mean")


def test_unknown_hyper_parameter(layer):
    with pytest.raises(ValueError, match="unknown hyper-parameter.*epsilon"):
        call(layer, epsilon=0.2)


def test_dr_grpo_needs_max_len(layer):
    with pytest.raises(ValueError, match="max_len: dr_grpo with agg='seq_mean_token_sum_norm' needs max_len"):
        call(layer, name="dr_grpo")


def test_grpo_kl_needs_reference(layer):
    with pytest.raises(ValueError, match="ref_logp: grpo with beta=0.04 > 0 needs ref_logp"):
        call(layer, name="grpo")


@pytest.mark.parametrize("arg", ["tau_pos", "tau_neg"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_negative_temperature(layer, arg, bad):
    with pytest.raises(ValueError, match=f"{arg}: expected"):
        call(layer, name="sapo", **{arg: bad})


def test_negative_eps(layer):
    with pytest.raises(ValueError, match="eps_high: expected a number >= 0"):
        call(layer, eps_high=-0.1)


def test_dcpo_old_logp_must_be_log_probability(layer):
    b = batch()
    b["old_logp"][0, 0] = 0.5
    with pytest.raises(ValueError, match="old_logp: dcpo needs log-probabilities <= 0"):
        call(layer, name="dcpo", group_size=2, **{k: b[k] for k in ("old_logp",)})


@pytest.mark.parametrize("q", [[0.5, 0.0], [1.2], [-0.1]])
def test_q_outside_unit_interval(layer, q):
    mod, conv = LAYERS[layer]
    with pytest.raises(ValueError, match=r"q: expected probabilities in \(0, 1\]"):
        mod.dcpo_bounds(conv(q))


def test_kl_unknown_kind(layer):
    mod, conv = LAYERS[layer]
    with pytest.raises(ValueError, match="kind: unknown KL estimator 'k4'"):
        mod.kl(conv([[0.0]]), conv([[0.0]]), "k4")


def test_advantages_group_size(layer):
    mod, conv = LAYERS[layer]
    with pytest.raises(ValueError, match="group_size: 4 does not divide the batch of 6 rows"):
        mod.group_advantages(conv(np.zeros(6)), 4)
    with pytest.raises(ValueError, match="group_size: group advantages needs group_size"):
        mod.group_advantages(conv(np.zeros(6)), None)
    with pytest.raises(ValueError, match="kind: expected one of grpo, dr_grpo, rloo, gpg, got 'gae'"):
        mod.group_advantages(conv(np.zeros(6)), 3, kind="gae")


def test_dpo_shapes_and_beta(layer):
    mod, conv = LAYERS[layer]
    with pytest.raises(ValueError, match=r"logp_rejected: expected shape \(2,\)"):
        mod.dpo_loss(conv([-1.0, -2.0]), conv([-1.0]), conv([-1.0, -2.0]), conv([-1.0, -2.0]))
    with pytest.raises(ValueError, match="beta: expected a number > 0"):
        mod.dpo_loss(conv([-1.0]), conv([-1.0]), conv([-1.0]), conv([-1.0]), beta=-0.1)


def test_gae_bad_gamma(layer):
    mod, conv = LAYERS[layer]
    with pytest.raises(ValueError, match=r"gamma: expected a number in \[0, 1\]"):
        mod.gae(conv([[1.0]]), conv([[0.0]]), conv([[1.0]]), gamma=1.5)


@pytest.mark.parametrize("name", spec.POLICY_ALGORITHMS)
def test_fully_masked_batch_is_zero(layer, name):
    b = batch()
    b["mask"] = np.zeros((4, 3))
    out = call(layer, name=name, group_size=2, ref_logp=b["logp"] - 0.1, max_len=3, **b)
    loss = float(out[0])
    assert loss == 0.0
    if layer != "gpu":
        assert np.all(np.asarray(out[1], dtype=float) == 0.0)
    if layer == "sim":
        assert out[2]["clip_frac"] == 0.0


@pytest.mark.parametrize("name", spec.POLICY_ALGORITHMS)
def test_fully_masked_batch_zero_gradient_in_torch(name):
    b = batch()
    logp = torch.tensor(b["logp"], requires_grad=True)
    loss, stats = gpu.policy_loss(name, logp, torch.tensor(b["old_logp"]), torch.tensor(b["adv"]),
                                  torch.zeros(4, 3), group_size=2, ref_logp=torch.tensor(b["logp"]) - 0.1,
                                  max_len=3)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.all(logp.grad == 0) and not torch.isnan(logp.grad).any()


# ---- padding: whatever a padded position holds, it changes nothing ---------------------------------------------------

PAD_OPTIONS = [*({"beta": 0.1, "kl": kind} for kind in KL_KINDS),
               *({"rollout_correction": kind} for kind in ROLLOUT_CORRECTIONS)]
PAD_MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=float)


def _padded(pad: float) -> dict:
    """The batch with ``pad`` written into the padding of logp, rollout_logp and adv and ``-pad`` into that of
    old_logp and ref_logp: gaps of 2 * |pad| there, e^(2e4) in the KL and the ratios if anything exponentiated them."""
    b = batch()
    b["ref_logp"], b["rollout_logp"] = b["logp"] - 0.1, b["old_logp"] + 0.2
    off = PAD_MASK == 0
    for key, sign in (("logp", 1), ("old_logp", -1), ("ref_logp", -1), ("rollout_logp", 1), ("adv", 1)):
        b[key] = np.where(off, sign * pad, b[key])
    return {**b, "mask": PAD_MASK}


def _loss_and_grad(layer, name, b, hp):
    """(loss, gradient) as float64 arrays: sim, or gpu in the dtype ``layer`` names ("gpu-float32", ...)."""
    kw = dict(group_size=2, ref_logp=b["ref_logp"], max_len=3, **hp)
    if "rollout_correction" in hp:
        kw["rollout_logp"] = b["rollout_logp"]
    args = [b[k] for k in ("logp", "old_logp", "adv", "mask")]
    if layer == "sim":
        loss, grad, _ = sim.policy_loss(name, *args, **kw)
        return np.float64(loss), grad
    dtype = getattr(torch, layer.split("-")[1])
    logp = torch.tensor(args[0], dtype=dtype, requires_grad=True)
    conv = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    kw = {k: conv(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    loss, _ = gpu.policy_loss(name, logp, *map(conv, args[1:]), **kw)
    loss.backward()
    return loss.detach().double().numpy(), logp.grad.double().numpy()


@pytest.mark.parametrize("pad", [1e4, -1e4])
@pytest.mark.parametrize("option", range(len(PAD_OPTIONS)))
@pytest.mark.parametrize("name", spec.POLICY_ALGORITHMS)
@pytest.mark.parametrize("where", ["sim", "gpu-float32", "gpu-bfloat16"])
def test_padding_values_change_nothing(where, name, option, pad):
    # padding of +-1e4 (e^(2e4) overflows every float): the loss and the gradient are those of zero padding, all
    # finite, and the padding's gradient is exactly 0 (an overflow inside torch.where used to give 0 * inf = NaN)
    hp = PAD_OPTIONS[option]
    loss, grad = _loss_and_grad(where, name, _padded(pad), hp)
    want_loss, want_grad = _loss_and_grad(where, name, _padded(0.0), hp)
    assert np.isfinite(loss) and np.isfinite(grad).all()
    assert np.all(grad[PAD_MASK == 0] == 0.0)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6, atol=0)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=0)


def test_issue_example_kl_padding_has_no_nan_gradient():
    # logp = [[-1, -801]], ref = [[-1.1, -1]], mask = [[1, 0]], beta 0.1: only token 0 counts; its k3 gradient is
    # beta * (1 - e^d) with d = ref - logp = -0.1, and r = 1, so k3_unbiased's -r d is beta * 0.1
    for kind, want in (("k3", 0.1 * (1 - math.exp(-0.1))), ("k3_unbiased", 0.1 * 0.1)):
        logp = torch.tensor([[-1.0, -801.0]], requires_grad=True)
        loss, _ = gpu.policy_loss("grpo", logp, logp.detach(), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]),
                                  ref_logp=torch.tensor([[-1.1, -1.0]]), beta=0.1, kl=kind)
        loss.backward()
        assert logp.grad[0, 0].item() == pytest.approx(want, rel=1e-5) and logp.grad[0, 1].item() == 0.0


# ---- numpy integers and saved states ----------------------------------------------------------------------------

def test_group_size_may_be_a_numpy_integer(layer):
    mod, conv = LAYERS[layer]
    rewards = conv(np.array([1.0, 0.0, 1.0, 1.0]))
    for fn in (mod.group_advantages, mod.dynamic_sampling_filter):
        np.testing.assert_array_equal(np.asarray(fn(rewards, np.int64(2))), np.asarray(fn(rewards, 2)))
    assert float(call(layer, name="dapo", group_size=np.int64(2))[0]) == float(call(layer, name="dapo",
                                                                                    group_size=2)[0])


@pytest.mark.parametrize("state, message", [
    (None, "state: expected a mapping"), ({}, "state: expected a mapping"), ({"history": [1]}, "state: expected"),
    ({"history": {"p": [1, 0.5]}}, r"state: history\['p'\] must be \[visits >= 1, mean, variance >= 0\]"),
    ({"history": {"p": [0, 0.5, 0.25]}}, r"state: history\['p'\]"),
    ({"history": {"p": [1, float("nan"), 0.25]}}, r"state: history\['p'\]"),
    ({"history": {"p": [1, 0.5, -0.25]}}, r"state: history\['p'\]"),
    ({"history": {"p": ["1", 0.5, 0.25]}}, r"state: history\['p'\]")])
@pytest.mark.parametrize("mod", [sim, gpu])
def test_malformed_sas_state(mod, state, message):
    sas = mod.SmoothAdvantage()
    with pytest.raises(ValueError, match=message):
        sas.load_state_dict(state)
    assert sas.history == {}
