"""Advantage estimators and reward shaping in torch: GRPO, Dr.GRPO, DCPO's SAS, GAE, DAPO's extras."""
from __future__ import annotations

import torch

from spec.contract import (check_advantage_kind, check_group_size, check_overlong, check_prompt_ids,
                           check_same_shape, check_unit_interval)
from spec.registry import PARTS

from .checks import as_mask, as_tensor


def _grouped(rewards, group_size):
    rewards = as_tensor("rewards", rewards, ndim=1)
    check_group_size(group_size, len(rewards), needed=True, why="group advantages")
    return rewards.reshape(-1, group_size)


def group_advantages(rewards, group_size, kind="grpo", eps=PARTS["grpo_advantage"]["eps"],
                     unbiased=PARTS["grpo_advantage"]["unbiased"]):
    """GRPO (DeepSeekMath Sec. 4.1.2): (R - mean_g) / (std_g + eps); Dr.GRPO (2503.20783 Eq. 3): R - mean_g."""
    groups = _grouped(rewards, group_size)
    check_advantage_kind(kind, group_size, unbiased)
    centred = groups - groups.mean(1, keepdim=True)
    if kind == "dr_grpo":
        return centred.reshape(-1)
    den = groups.std(1, correction=1 if unbiased else 0, keepdim=True) + eps
    return torch.where(den > 0, centred / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.zeros_like(centred)).reshape(-1)


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
            var_tot = (var_new + (i - 1) * var_old) / i + (i - 1) / i**2 * (mu_old - mu_new) ** 2
            a_new, a_tot = _standardise(r, mu_new, var_new), _standardise(r, mu_tot, var_tot)
            sa_new = (i - 1) / i * a_new + a_tot / i
            sa_tot = a_new / i + (i - 1) / i * a_tot
            out[g] = torch.where(sa_new.abs() < sa_tot.abs(), sa_new, sa_tot)
            self.history[pid] = (i, mu_tot, var_tot)
        return out.reshape(-1)

    def state_dict(self):
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state):
        self.history = {k: (int(v[0]), float(v[1]), float(v[2])) for k, v in state["history"].items()}


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


def dynamic_sampling_filter(rewards, group_size):
    """Keep a group (True) iff its values are not all equal: given 0/1 correctness, DAPO Eq. 11's 0 < #correct < G."""
    groups = _grouped(rewards, group_size)
    return groups.amax(1) > groups.amin(1)
