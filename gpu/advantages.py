"""Advantage estimators and reward shaping in torch: GRPO, Dr.GRPO, DCPO's SAS, GAE, DAPO's extras."""
from __future__ import annotations

import torch

from spec.contract import (check_advantage_kind, check_group_size, check_overlong, check_prompt_ids,
                           check_reinforce_args, check_reward_weights, check_same_shape, check_sas_state,
                           check_unit_interval)
from spec.registry import PARTS

from .checks import as_mask, as_tensor


def _grouped(rewards, group_size):
    rewards = as_tensor("rewards", rewards, ndim=1)
    check_group_size(group_size, len(rewards), needed=True, why="group advantages")
    return rewards.reshape(-1, group_size)


def group_advantages(rewards, group_size, kind="grpo", eps=PARTS["grpo_advantage"]["eps"],
                     unbiased=PARTS["grpo_advantage"]["unbiased"]):
    """GRPO (DeepSeekMath Sec. 4.1.2): (R - mean_g) / (std_g + eps); Dr.GRPO (2503.20783 Eq. 3): R - mean_g;
    RLOO (2402.14740, Sec. 3): G/(G-1) (R - mean_g); GPG (2504.02546 Sec. 2): (B / M) (R - mean_g)."""
    groups = _grouped(rewards, group_size)
    check_advantage_kind(kind, group_size, unbiased, eps)
    centred = groups - groups.mean(1, keepdim=True)
    if kind == "dr_grpo":
        return centred.reshape(-1)
    if kind == "rloo":
        return (group_size / (group_size - 1) * centred).reshape(-1)
    if kind == "gpg":
        live = group_size * int((groups.amax(1) > groups.amin(1)).sum())
        return (groups.numel() / max(live, 1) * centred).reshape(-1)
    den = groups.std(1, correction=1 if unbiased else 0, keepdim=True) + eps
    return torch.where(den > 0, centred / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.zeros_like(centred)).reshape(-1)


def gdpo_advantages(rewards, group_size, weights=None, eps=PARTS["gdpo_advantage"]["eps"],
                    unbiased=PARTS["gdpo_advantage"]["unbiased"]):
    """GDPO (2601.05242): each reward (a column of the [B, N] ``rewards``) standardised within its group as GRPO does,
    (r_n - mean_g) / (std_g + eps); their sum weighted by ``weights`` (all 1 by default) standardised over the batch,
    (S - mean_B) / (std_B + eps), 0 where that denominator is 0."""
    rewards = as_tensor("rewards", rewards, ndim=2)
    w = check_reward_weights(weights, rewards.shape[1])
    total = sum(wn * group_advantages(rewards[:, n], group_size, "grpo", eps, unbiased) for n, wn in enumerate(w))
    den = total.std(correction=1 if unbiased else 0) + eps
    centred = total - total.mean()
    return centred / den if den > 0 else torch.zeros_like(centred)


def _standardise(x, mu, var):
    """(x - mu) / sigma, and 0 where sigma is 0 (DCPO: an all-equal history gives no signal)."""
    sigma = var ** 0.5
    return (x - mu) / sigma if sigma > 0 else torch.zeros_like(x)


class SmoothAdvantage:
    """DCPO smooth advantage standardization (2509.02333 Eq. 9-12, pooled statistics Eq. 29-30), per prompt."""

    def __init__(self):
        self.history: dict = {}  # prompt id -> (visits, mean, population variance)

    def __call__(self, prompt_ids, rewards, group_size):
        groups = _grouped(rewards, group_size)
        ids = list(prompt_ids)
        check_prompt_ids(ids, len(groups))
        out = torch.empty_like(groups)
        for g, (pid, r) in enumerate(zip(ids, groups)):
            visits, mu_old, var_old = self.history.get(pid, (0, 0.0, 0.0))
            i = visits + 1
            mu_new, var_new = float(r.mean()), float(r.var(correction=0))
            mu_tot = (mu_new + (i - 1) * mu_old) / i
            shift = (mu_old - mu_new) * (mu_old - mu_new)  # a product: ** 2 of a Python float can raise OverflowError
            var_tot = (var_new + (i - 1) * var_old) / i + (i - 1) / i**2 * shift
            a_new, a_tot = _standardise(r, mu_new, var_new), _standardise(r, mu_tot, var_tot)
            sa_new = (i - 1) / i * a_new + a_tot / i
            sa_tot = a_new / i + (i - 1) / i * a_tot
            out[g] = torch.where(sa_new.abs() < sa_tot.abs(), sa_new, sa_tot)
            self.history[pid] = (i, mu_tot, var_tot)
        return out.reshape(-1)

    def state_dict(self):
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state):
        self.history = check_sas_state(state)


def gae(rewards, values, mask, gamma=PARTS["gae"]["gamma"], lam=PARTS["gae"]["lam"]):
    """GAE (1506.02438 Eq. 16) by its recursion over valid tokens: A_t = delta_t + gamma*lam*A_{t+1}."""
    rewards = as_tensor("rewards", rewards, ndim=2)
    values = as_tensor("values", values, like=rewards, ndim=2).detach()
    mask = as_mask(mask, rewards)
    for name, x in (("values", values), ("mask", mask)):
        check_same_shape(name, x.shape, "rewards", rewards.shape)
    check_unit_interval("gamma", gamma)
    check_unit_interval("lam", lam)
    adv = torch.zeros_like(rewards)
    next_v = rewards.new_zeros(len(rewards))
    next_a = rewards.new_zeros(len(rewards))
    for t in range(rewards.shape[1] - 1, -1, -1):
        on = mask[:, t] > 0
        a = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * next_a
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
        next_v = torch.where(on, values[:, t], next_v)
        next_a = torch.where(on, a, next_a)
    return adv, (adv + values) * mask


def overlong_penalty(lengths, max_len=PARTS["overlong"]["max_len"], cache_len=PARTS["overlong"]["cache_len"]):
    """DAPO Eq. 13 soft overlong punishment: 0, then linear down to -1 over the last cache_len tokens, then -1."""
    lengths = as_tensor("lengths", lengths)
    check_overlong(max_len, cache_len)
    start = max_len - cache_len
    return torch.where(lengths <= start, torch.zeros_like(lengths),
                       torch.where(lengths <= max_len, (start - lengths) / cache_len, -torch.ones_like(lengths)))


def reinforce_pp_advantages(rewards, mask, *, logp=None, ref_logp=None, beta=0.0, group_size=None,
                            baseline=False, gamma=PARTS["reinforce_pp"]["gamma"], eps=PARTS["reinforce_pp"]["eps"]):
    """REINFORCE++ (2501.03262, Sec. 3): the outcome reward at each row's last token (R - mean_g with
    ``baseline``) minus beta * k1 per token, discounted returns, whitened over the batch's tokens."""
    rewards = as_tensor("rewards", rewards, ndim=1)
    mask = as_mask(mask, rewards)
    check_reinforce_args(len(rewards), tuple(mask.shape), beta, gamma, eps, group_size, baseline, logp, ref_logp)
    if baseline:
        groups = rewards.reshape(-1, group_size)
        rewards = (groups - groups.mean(1, keepdim=True)).reshape(-1)
    on = mask > 0
    remaining = on.flip(1).cumsum(1).flip(1)  # unmasked tokens from t to the row's end
    token_r = torch.where(on & (remaining == 1), rewards[:, None].expand_as(mask), torch.zeros_like(mask))
    if beta > 0:
        logp = as_tensor("logp", logp, like=rewards).detach()
        ref_logp = as_tensor("ref_logp", ref_logp, like=rewards).detach()
        check_same_shape("logp", logp.shape, "mask", mask.shape)
        check_same_shape("ref_logp", ref_logp.shape, "mask", mask.shape)
        token_r = token_r - beta * torch.where(on, logp - ref_logp, torch.zeros_like(logp))
    ret = torch.zeros_like(mask)
    acc = mask.new_zeros(len(mask))
    for t in range(mask.shape[1] - 1, -1, -1):
        acc = torch.where(on[:, t], token_r[:, t] + gamma * acc, acc)
        ret[:, t] = torch.where(on[:, t], acc, torch.zeros_like(acc))
    n = int(on.sum())
    if n == 0:
        return ret
    vals = ret[on]
    var = vals.var(correction=1) if n > 1 else vals.new_zeros(())  # the unbiased variance, as verl's whitening
    return torch.where(on, (ret - vals.mean()) / torch.sqrt(var + eps), torch.zeros_like(ret))


def dynamic_sampling_filter(rewards, group_size):
    """Keep a group (True) iff its values are not all equal: given 0/1 correctness, DAPO Eq. 11's 0 < #correct < G."""
    groups = _grouped(rewards, group_size)
    return groups.amax(1) > groups.amin(1)
