"""One toy-LM update through the simulator's analytic gradients equals torch autograd on the same tabular policy."""
import numpy as np
import pytest
import torch

import gpu
from sim import dpo_loss, optim, policy_loss, toy_lm
from sim.advantages import group_advantages
from sim.tabular import CORRECT, logit_grad, row_logp, sample, tables
from spec.registry import POLICY_ALGORITHMS

G = 4


def _batch(seed):
    """A small toy LM, a rollout from its initial policy, then a perturbed current policy (so ratios move)."""
    rng = np.random.default_rng(seed)
    aut, logits0, _ = toy_lm.build(n_prompts=6, max_len=6, env_seed=seed)
    ro = sample(aut, tables(logits0), np.arange(6), G, rng)
    adv = group_advantages((ro.outcome == CORRECT).astype(float) + 0.1 * rng.standard_normal(len(ro.outcome)), G)
    adv = np.broadcast_to(adv[:, None], ro.mask.shape) * ro.mask
    logits = logits0 + 0.4 * rng.standard_normal(logits0.shape)
    ref = logits0 + 0.2 * rng.standard_normal(logits0.shape)
    ref_lp = np.where(ro.mask > 0, tables(ref)[0][ro.states, ro.tokens], 0.0)
    return aut, logits, ro, adv, ref_lp


def _torch_logp(logits, ro):
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(z, dim=1)[torch.as_tensor(ro.states), torch.as_tensor(ro.tokens)]
    return z, logp * torch.as_tensor(ro.mask)


def _full(shape, visited_grad):
    """The whole logit table's gradient from ``logit_grad``'s rows (every other row's is 0)."""
    grad, rows = visited_grad
    full = np.zeros(shape)
    full[rows] = grad
    return full


def _sim_grad(name, logits, ro, adv, ref_lp, **hp):
    logp, visited = row_logp(logits, ro.states, ro.tokens, ro.mask)
    loss, grad, _ = policy_loss(name, logp, ro.old_logp, adv, ro.mask, group_size=G, ref_logp=ref_lp, **hp)
    return loss, _full(logits.shape, logit_grad(ro.tokens, ro.mask, visited, grad))


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_logit_gradient_matches_autograd_through_gpu_loss(name, seed):
    aut, logits, ro, adv, ref_lp = _batch(seed)
    hp = {"max_len": 6, "beta": 0.04}
    loss, grad = _sim_grad(name, logits, ro, adv, ref_lp, **hp)
    z, logp = _torch_logp(logits, ro)
    t_loss, _ = gpu.policy_loss(name, logp, torch.as_tensor(ro.old_logp), torch.as_tensor(adv),
                                torch.as_tensor(ro.mask), group_size=G, ref_logp=torch.as_tensor(ref_lp), **hp)
    t_loss.backward()
    assert loss == pytest.approx(float(t_loss.detach()), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(grad, z.grad.numpy(), rtol=1e-9, atol=1e-13)


def test_grpo_update_matches_an_independent_torch_objective():
    """GRPO (DeepSeekMath Eq. 3): clipped ratio plus beta*k3, token mean per response, mean over responses."""
    aut, logits, ro, adv, ref_lp = _batch(3)
    _, grad = _sim_grad("grpo", logits, ro, adv, ref_lp)
    logp, _ = row_logp(logits, ro.states, ro.tokens, ro.mask)
    clip_frac = policy_loss("grpo", logp, ro.old_logp, adv, ro.mask, ref_logp=ref_lp)[2]["clip_frac"]
    assert 0 < clip_frac < 1  # the batch exercises both branches of the clip
    z, logp = _torch_logp(logits, ro)
    m, a = torch.as_tensor(ro.mask), torch.as_tensor(adv)
    r = torch.exp(logp - torch.as_tensor(ro.old_logp))
    surr = torch.minimum(r * a, torch.clamp(r, 0.8, 1.2) * a)
    d = torch.as_tensor(ref_lp) - logp
    tok = -(surr - 0.04 * (torch.exp(d) - d - 1)) * m
    (tok.sum(1) / m.sum(1)).mean().backward()
    np.testing.assert_allclose(grad, z.grad.numpy(), rtol=1e-9, atol=1e-13)
    assert np.abs(grad).max() > 0


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_one_optimiser_step_matches_torch(opt_name):
    aut, logits, ro, adv, ref_lp = _batch(4)
    params = logits.copy()
    opt = optim.make(opt_name, params, 0.05)
    for _ in range(3):
        _, grad = _sim_grad("dapo", params, ro, adv, ref_lp)
        opt.step(grad)
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    t_opt = torch.optim.SGD([z], lr=0.05) if opt_name == "sgd" else torch.optim.Adam([z], lr=0.05)
    for _ in range(3):
        t_opt.zero_grad()
        logp = torch.log_softmax(z, 1)[torch.as_tensor(ro.states), torch.as_tensor(ro.tokens)] * torch.as_tensor(
            ro.mask)
        loss, _ = gpu.policy_loss("dapo", logp, torch.as_tensor(ro.old_logp), torch.as_tensor(adv),
                                  torch.as_tensor(ro.mask), group_size=G)
        loss.backward()
        t_opt.step()
    np.testing.assert_allclose(params, z.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_dpo_gradient_through_sequence_logps_matches_autograd():
    """DPO Eq. 7 on summed token log-probs of chosen and rejected responses."""
    aut, logits, ro, adv, ref_lp = _batch(5)
    w, l_ = np.arange(0, len(ro.outcome), 2), np.arange(1, len(ro.outcome), 2)
    logp, visited = row_logp(logits, ro.states, ro.tokens, ro.mask)
    seq, ref_seq = logp.sum(1), ref_lp.sum(1)
    _, (gw, gl), _ = dpo_loss(seq[w], seq[l_], ref_seq[w], ref_seq[l_], beta=0.1)
    g_seq = np.zeros(len(seq))
    g_seq[w], g_seq[l_] = gw, gl
    grad = _full(logits.shape, logit_grad(ro.tokens, ro.mask, visited, g_seq[:, None] * ro.mask))
    z, t_logp = _torch_logp(logits, ro)
    s, rs = t_logp.sum(1), torch.as_tensor(ref_seq)
    margin = 0.1 * ((s[w] - rs[w]) - (s[l_] - rs[l_]))
    (-torch.nn.functional.logsigmoid(margin)).mean().backward()
    np.testing.assert_allclose(grad, z.grad.numpy(), rtol=1e-9, atol=1e-13)
