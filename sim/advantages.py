"""Advantage estimators and reward shaping in NumPy: GRPO, Dr.GRPO, DCPO's SAS, GAE, DAPO's extras."""
from __future__ import annotations

import numpy as np

from spec.contract import (check_advantage_kind, check_group_size, check_overlong, check_prompt_ids,
                           check_reinforce_args, check_reward_weights, check_same_shape, check_sas_state,
                           check_unit_interval)
from spec.registry import PARTS

from spec.arrays import as_float, as_mask


def _grouped(rewards, group_size):
    rewards = as_float("rewards", rewards, ndim=1)
    check_group_size(group_size, len(rewards), needed=True, why="group advantages")
    return rewards.reshape(-1, group_size)


def group_advantages(rewards, group_size, kind="grpo", eps=PARTS["grpo_advantage"]["eps"],
                     unbiased=PARTS["grpo_advantage"]["unbiased"]):
    """GRPO (DeepSeekMath Sec. 4.1.2): (R - mean_g) / (std_g + eps); Dr.GRPO (2503.20783 Eq. 3): R - mean_g;
    RLOO (2402.14740, Sec. 3): G/(G-1) (R - mean_g); GPG (2504.02546 Sec. 2): (B / M) (R - mean_g)."""
    groups = _grouped(rewards, group_size)
    check_advantage_kind(kind, group_size, unbiased, eps)
    centred = groups - np.add.reduce(groups, 1, keepdims=True) / group_size  # groups.mean(1, keepdims=True)
    if kind == "dr_grpo":
        return centred.reshape(-1)
    if kind == "rloo":
        return (group_size / (group_size - 1) * centred).reshape(-1)
    if kind == "gpg":
        live = group_size * int((groups.max(1) > groups.min(1)).sum())
        return (groups.size / max(live, 1) * centred).reshape(-1)
    den = np.add.reduce(centred * centred, 1, keepdims=True)  # groups.std(1, ddof, keepdims=True) + eps, as NumPy
    den /= group_size - 1 if unbiased else group_size
    np.sqrt(den, out=den)
    den += eps
    return np.divide(centred, den, out=np.zeros_like(centred), where=den > 0).reshape(-1)


def gdpo_advantages(rewards, group_size, weights=None, eps=PARTS["gdpo_advantage"]["eps"],
                    unbiased=PARTS["gdpo_advantage"]["unbiased"]):
    """GDPO (2601.05242): each reward (a column of the [B, N] ``rewards``) standardised within its group as GRPO does,
    (r_n - mean_g) / (std_g + eps); their sum weighted by ``weights`` (all 1 by default) standardised over the batch,
    (S - mean_B) / (std_B + eps), 0 where that denominator is 0."""
    rewards = as_float("rewards", rewards, ndim=2)
    w = check_reward_weights(weights, rewards.shape[1])
    total = sum(wn * group_advantages(rewards[:, n], group_size, "grpo", eps, unbiased) for n, wn in enumerate(w))
    centred = total - total.mean()
    den = np.sqrt((centred * centred).sum() / (len(total) - 1 if unbiased else len(total))) + eps
    return np.divide(centred, den, out=np.zeros_like(centred), where=den > 0)


def _standardise(x, mu, var):
    """(x - mu) / sigma, and 0 where sigma is 0 (DCPO: an all-equal history gives no signal)."""
    sigma = np.sqrt(var)
    return np.divide(x - mu, sigma, out=np.zeros(np.broadcast(x, sigma).shape), where=sigma > 0)


class SmoothAdvantage:
    """DCPO smooth advantage standardization (2509.02333 Eq. 9-12, pooled statistics Eq. 29-30), per prompt."""

    def __init__(self):
        self.history: dict = {}  # prompt id -> (visits, mean, population variance)

    def __call__(self, prompt_ids, rewards, group_size):
        groups = _grouped(rewards, group_size)
        ids = list(prompt_ids)
        check_prompt_ids(ids, len(groups))
        past = np.array([self.history.get(pid, (0, 0.0, 0.0)) for pid in ids], dtype=float).reshape(-1, 3)
        i, mu_old, var_old = past[:, :1] + 1.0, past[:, 1:2], past[:, 2:]  # one column per group
        mu_new, var_new = groups.mean(1, keepdims=True), groups.var(1, keepdims=True)
        mu_tot = (mu_new + (i - 1) * mu_old) / i
        shift = (mu_old - mu_new) * (mu_old - mu_new)
        var_tot = (var_new + (i - 1) * var_old) / i + (i - 1) / (i * i) * shift
        a_new, a_tot = _standardise(groups, mu_new, var_new), _standardise(groups, mu_tot, var_tot)
        sa_new = (i - 1) / i * a_new + a_tot / i
        sa_tot = a_new / i + (i - 1) / i * a_tot
        for pid, visits, mu, var in zip(ids, i[:, 0].tolist(), mu_tot[:, 0].tolist(), var_tot[:, 0].tolist()):
            self.history[pid] = (int(visits), mu, var)
        return np.where(np.abs(sa_new) < np.abs(sa_tot), sa_new, sa_tot).reshape(-1)

    def state_dict(self):
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state):
        self.history = check_sas_state(state)


def gae(rewards, values, mask, gamma=PARTS["gae"]["gamma"], lam=PARTS["gae"]["lam"]):
    """GAE (1506.02438 Eq. 16) by its recursion over valid tokens: A_t = delta_t + gamma*lam*A_{t+1}."""
    rewards, values, mask = as_float("rewards", rewards, ndim=2), as_float("values", values, ndim=2), as_mask(mask)
    for name, x in (("values", values), ("mask", mask)):
        check_same_shape(name, x.shape, "rewards", rewards.shape)
    check_unit_interval("gamma", gamma)
    check_unit_interval("lam", lam)
    adv = np.zeros_like(rewards)
    next_v = np.zeros(len(rewards))
    next_a = np.zeros(len(rewards))
    for t in range(rewards.shape[1] - 1, -1, -1):
        on = mask[:, t] > 0
        a = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * next_a
        adv[:, t] = np.where(on, a, 0.0)
        next_v = np.where(on, values[:, t], next_v)
        next_a = np.where(on, a, next_a)
    return adv, (adv + values) * mask


def overlong_penalty(lengths, max_len=PARTS["overlong"]["max_len"], cache_len=PARTS["overlong"]["cache_len"]):
    """DAPO Eq. 13 soft overlong punishment: 0, then linear down to -1 over the last cache_len tokens, then -1."""
    lengths = as_float("lengths", lengths)
    check_overlong(max_len, cache_len)
    start = max_len - cache_len
    return np.where(lengths <= start, 0.0, np.where(lengths <= max_len, (start - lengths) / cache_len, -1.0))


def reinforce_pp_advantages(rewards, mask, *, logp=None, ref_logp=None, beta=0.0, group_size=None,
                            baseline=False, gamma=PARTS["reinforce_pp"]["gamma"], eps=PARTS["reinforce_pp"]["eps"]):
    """REINFORCE++ (2501.03262, Sec. 3): the outcome reward at each row's last token (R - mean_g with
    ``baseline``) minus beta * k1 per token, discounted returns, whitened over the batch's tokens."""
    rewards, mask = as_float("rewards", rewards, ndim=1), as_mask(mask)
    check_reinforce_args(len(rewards), mask.shape, beta, gamma, eps, group_size, baseline, logp, ref_logp)
    if baseline:
        groups = rewards.reshape(-1, group_size)
        rewards = (groups - groups.mean(1, keepdims=True)).reshape(-1)
    on = mask > 0
    remaining = np.cumsum(on[:, ::-1], axis=1)[:, ::-1]  # unmasked tokens from t to the row's end
    last = on & (remaining == 1)
    token_r = np.where(last, rewards[:, None], 0.0)
    if beta > 0:
        logp, ref_logp = as_float("logp", logp), as_float("ref_logp", ref_logp)
        check_same_shape("logp", logp.shape, "mask", mask.shape)
        check_same_shape("ref_logp", ref_logp.shape, "mask", mask.shape)
        token_r = token_r - beta * np.where(on, logp - ref_logp, 0.0)
    ret = np.zeros(mask.shape)
    acc = np.zeros(len(mask))
    for t in range(mask.shape[1] - 1, -1, -1):
        acc = np.where(on[:, t], token_r[:, t] + gamma * acc, acc)
        ret[:, t] = np.where(on[:, t], acc, 0.0)
    n = int(on.sum())
    if n == 0:
        return ret
    mean = ret[on].mean()
    var = ret[on].var(ddof=1) if n > 1 else 0.0  # the unbiased variance, as verl's whitening
    return np.where(on, (ret - mean) / np.sqrt(var + eps), 0.0)


def dynamic_sampling_filter(rewards, group_size):
    """Keep a group (True) iff its values are not all equal: given 0/1 correctness, DAPO Eq. 11's 0 < #correct < G."""
    groups = _grouped(rewards, group_size)
    return groups.max(1) > groups.min(1)
