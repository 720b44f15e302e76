"""The vectorised RL loop: rollouts, rewards, advantages, minibatch epochs of ``policy_loss``, optimiser steps."""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable

import numpy as np

from collections import deque

from . import bandit, optim, toy_lm
from .advantages import SmoothAdvantage, dynamic_sampling_filter, gae, group_advantages, overlong_penalty
from .config import REWARD_SCHEMES, resolve
from .feature_lm import FeatureLM
from .losses import dpo_loss, policy_terms, value_loss
from .metrics import StepClips, batch_cov, clean, entropy_law, exact_metrics, rollout_metrics
from .tabular import CORRECT, MALFORMED, Rollout, TableEnv
from spec.contract import resolve_hparams
from spec.registry import ALGORITHMS, POLICY_ALGORITHMS

#: Stats some losses add (CISPO's truncated share, Clip-Cov's and KL-Cov's selected share, rollout correction's mean
#: weight and cut share), averaged over a step's tokens.
EXTRA_STATS = ("trunc_frac", "cov_frac", "rc_weight_mean", "rc_cut_frac")


#: The settings each environment is built from (beyond n_prompts, the difficulty range and env_seed).
ENV_KEYS = {"bandit": ("n_arms",), "toy_lm": ("max_len", "n_think", "n_answers"),
            "feature_lm": ("vocab", "answer_len", "max_len", "n_correct", "forks", "n_features", "zipf", "confidence")}


def build_env(env: str, cfg: dict):
    """The environment object of ``env`` under the settings ``cfg`` (sampling, exact metrics, policy rows). Built
    once per process for each distinct setting: runs only read it, and its arrays are read-only."""
    keys = ("n_prompts", "difficulty_low", "difficulty_high", "env_seed", *ENV_KEYS[env])
    return _build_env(env, tuple((k, cfg[k]) for k in keys))


@functools.lru_cache(maxsize=8)
def _build_env(env: str, settings: tuple):
    kw = dict(settings)
    if env == "feature_lm":
        built = FeatureLM(**kw)
    else:
        built = TableEnv(*(bandit if env == "bandit" else toy_lm).build(**kw))
    owners = [built] + ([built.aut] if isinstance(built, TableEnv) else [])
    for value in (v for owner in owners for v in vars(owner).values()):
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return built


def rewards_of(ro: Rollout, cfg: dict, rng: np.random.Generator | None = None) -> np.ndarray:
    """The reward scheme's value of each outcome, plus DAPO's soft overlong punishment (Eq. 13) if on.

    ``random``: 1 or 0 with probability 1/2 each, independent of the response (the spurious-reward control of
    Park et al. 2509.26114); needs ``rng``.
    """
    if cfg["reward"] == "random":
        r = (rng.random(len(ro.outcome)) < 0.5).astype(float)
    else:
        good, wrong, bad = REWARD_SCHEMES[cfg["reward"]]
        r = np.where(ro.outcome == CORRECT, good, np.where(ro.outcome == MALFORMED, bad, wrong))
    if cfg["overlong"]:
        r = r + overlong_penalty(ro.lengths, cfg["max_len"], cfg["overlong_cache"])
    return r


def _select(ro: Rollout, groups: np.ndarray, group_size: int) -> Rollout:
    rows = (groups[:, None] * group_size + np.arange(group_size)).reshape(-1)
    return Rollout(ro.prompts[groups], ro.states[rows], ro.tokens[rows], ro.mask[rows], ro.old_logp[rows],
                   ro.outcome[rows], ro.lengths[rows], ro.truncated[rows])


def _concat(parts: list[Rollout]) -> Rollout:
    return Rollout(*(np.concatenate([getattr(p, f) for p in parts]) for f in Rollout.__dataclass_fields__))


class Trainer:
    """One run: an environment, the policy's parameters, its reference, optimiser and advantage state.

    ``steps`` (if known) makes the last step an exact evaluation whatever ``eval_every``.
    """

    def __init__(self, env: str, algo: str, seed: int, overrides: dict | None = None, steps: int | None = None):
        self.env_name, self.algo, self.seed = env, algo, seed
        self.cfg = cfg = resolve(env, algo, overrides)
        self.env = build_env(env, cfg)
        self.info = self.env.info
        self.params = self.env.init.copy()
        if isinstance(self.env, TableEnv):  # the tabular policy's parameters are its logit table
            self.aut, self.logits = self.env.aut, self.params
        self.rng = np.random.default_rng(seed)
        kw = {"momentum": cfg["momentum"]} if cfg["optimizer"] == "sgd" else {}
        self.opt = optim.make(cfg["optimizer"], self.params, cfg["lr"], **kw)
        self.sas = SmoothAdvantage() if cfg.get("adv") == "sas" else None
        if cfg.get("adv") == "gae":
            self.values = np.zeros(self.env.n_rows)
            self.critic = optim.Adam(self.values, cfg["critic_lr"])
        self.step_no, self.last_step = 0, None if steps is None else steps - 1
        self.history = deque(maxlen=cfg["staleness"] + 1)  # parameters at the start of the last steps
        self.snap = self.env.snapshot(self.params)
        order = np.argsort(self.snap.success, kind="stable")
        third = max(1, len(order) // 3)
        self.hard, self.easy = order[:third], order[-third:]
        self.cov_sum = 0.0
        if algo not in POLICY_ALGORITHMS:
            self._build_pairs()
        else:  # checked once here; each update calls the unchecked terms
            self.loss_hp = resolve_hparams(algo, cfg["loss"])

    # ---- rollouts ------------------------------------------------------------------------------------------
    def _collect(self, table):
        """Rollouts of G responses per prompt from ``table`` (the environment's sampler of the rollout policy);
        with dynamic sampling, refill with new prompts (DAPO Sec. 3.2)."""
        cfg, g = self.cfg, self.cfg["group_size"]
        p = cfg["batch_prompts"]
        order = self.rng.permutation(cfg["n_prompts"])
        ds = cfg["dynamic_sampling"]
        per_round = int(np.ceil(p * cfg["ds_oversample"])) if ds else p
        generated, kept, kept_r, seen_ro, seen_r = 0, [], [], [], []
        for k in range(cfg["ds_max_rounds"] if ds else 1):
            chunk = order[k * per_round:(k + 1) * per_round]  # distinct prompts within a step
            if chunk.size == 0:
                break
            ro = self.env.sample(table, chunk, g, self.rng)
            r = rewards_of(ro, cfg, self.rng)
            generated += len(r)
            seen_ro.append(ro)
            seen_r.append(r)
            if not cfg["dynamic_sampling"]:
                return ro, r, ro, r, generated
            good = np.flatnonzero(dynamic_sampling_filter((ro.outcome == CORRECT).astype(float), g))
            have = sum(len(x.prompts) for x in kept)
            if good.size:
                take = good[:p - have]
                kept.append(_select(ro, take, g))
                kept_r.append(r.reshape(-1, g)[take].reshape(-1))
            if have + min(good.size, p - have) == p:
                break
        all_ro, all_r = _concat(seen_ro), np.concatenate(seen_r)
        if not kept:
            return all_ro, all_r, None, None, generated
        return all_ro, all_r, _concat(kept), np.concatenate(kept_r), generated

    def _advantages(self, ro: Rollout, r: np.ndarray, ref_lp: np.ndarray) -> np.ndarray:
        """Token advantages [B, T] per the configured estimator (sequence ones broadcast over tokens)."""
        cfg, g = self.cfg, self.cfg["group_size"]
        kind = cfg["adv"]
        if kind in ("grpo", "dr_grpo", "rloo", "gpg"):
            seq = group_advantages(r, g, kind, eps=cfg["adv_eps"], unbiased=cfg["adv_unbiased"])
        elif kind == "sas":
            seq = self.sas(ro.prompts.tolist(), r, g)
        else:
            tok_r = -cfg["reward_kl"] * (ro.old_logp - ref_lp) * ro.mask  # k1 KL folded into the reward
            last = np.maximum(ro.lengths - 1, 0)
            tok_r[np.arange(len(r)), last] += r
            self.old_values = self.values[ro.states] * ro.mask
            adv, self.returns = gae(tok_r, self.old_values, ro.mask, cfg["gamma"], cfg["lam"])
            return adv
        return seq[:, None] * ro.mask

    # ---- one step ------------------------------------------------------------------------------------------
    def step(self) -> dict:
        """One rollout and its minibatch epochs; returns the step's metrics (exact ones on evaluation steps)."""
        rec, snap = {}, None
        if self.step_no % self.cfg["eval_every"] == 0 or self.step_no == self.last_step:
            snap = self.env.snapshot(self.params) if self.step_no else self.snap
            rec.update(exact_metrics(snap, self.hard, self.easy))
            if self.step_no:
                rec.update(entropy_law(self.snap, snap), cov_interval=self.cov_sum)
            self.snap, self.cov_sum = snap, 0.0
        self.history.append(self.params.copy() if self.cfg["staleness"] else self.params)
        params = self._rollout_params()  # the policy ``staleness`` steps back, perturbed
        table = self.env.sampler(params, snap if params is self.params else None)
        rec.update(self._rl_step(table) if self.algo in POLICY_ALGORITHMS else self._dpo_step(table))
        rec["step"] = self.step_no
        self.step_no += 1
        return clean(rec)

    def _rollout_params(self):
        """The rollout policy's parameters: the trainer's ``staleness`` steps back, plus N(0, rollout_noise^2)
        per parameter, drawn afresh each step (a rollout engine that does not quite compute the trainer's policy)."""
        params, noise = self.history[0], self.cfg["rollout_noise"]
        return params + noise * self.rng.standard_normal(params.shape) if noise else params

    def _rl_step(self, table) -> dict:
        cfg, g = self.cfg, self.cfg["group_size"]
        all_ro, all_r, ro, r, generated = self._collect(table)
        rec = rollout_metrics(all_ro, all_r, g)
        if ro is None:  # dynamic sampling found no informative group within its budget
            rec.update(clip_frac=None, rur=None, gen_per_trained=None, loss=None, trained=0, generated=generated)
            return rec
        rollout_lp = ro.old_logp  # the engine's log-probs; the trainer's old policy is the unperturbed one
        if cfg["rollout_noise"]:
            ro = replace(ro, old_logp=self.env.rows(self.history[0], ro.states, ro.tokens, ro.mask)[0])
        ref_lp = self.env.ref_logp(ro.states, ro.tokens, ro.mask)
        adv = self._advantages(ro, r, ref_lp)
        mask = ro.mask * ~ro.truncated[:, None] if cfg["overlong_filter"] else ro.mask
        cov = batch_cov(ro.old_logp, adv, mask)
        self.cov_sum += 0.0 if cov is None else cov
        n_groups = len(ro.prompts)
        clips = StepClips(self.algo, cfg["loss"])
        clip_sum = tok_sum = loss_sum = 0.0
        extra_sums: dict = {}  # token-weighted sums of the stats some losses add (trunc_frac, cov_frac, rc_*)
        updates = 0
        alg, in_group = ALGORITHMS[self.algo], np.arange(g)
        for _ in range(cfg["epochs"]):
            for mb in np.array_split(self.rng.permutation(n_groups), min(cfg["minibatches"], n_groups)):
                rows = (mb[:, None] * g + in_group).reshape(-1)
                st, tk, m, old, a = ro.states[rows], ro.tokens[rows], mask[rows], ro.old_logp[rows], adv[rows]
                logp, pi_rows = self.env.rows(self.params, st, tk, m)
                hp = self.loss_hp
                if alg.select == "clip_cov":  # Clip-Cov's random choice: a seed per update
                    hp = {**hp, "cov_seed": int(self.rng.integers(2**31 - 1))}
                kept: dict = {}  # the token ratio (and DCPO's bounds) the loss computed, for StepClips
                loss, grad, stats = policy_terms(alg, hp, logp, old, a, m, g, ref_lp[rows], rollout_lp[rows],
                                                 keep=kept)
                zeroed = clips.add(logp, old, a, m, self._at_fork(st), **kept)  # PPO-zeroed tokens
                for key in EXTRA_STATS:
                    if key in stats:
                        extra_sums[key] = extra_sums.get(key, 0.0) + stats[key] * stats["tokens"]
                extra_sums["ppo_zeroed_frac"] = extra_sums.get("ppo_zeroed_frac", 0.0) + zeroed
                self.opt.step(self.env.grad(self.params, st, tk, m, pi_rows, grad))
                if cfg["adv"] == "gae":
                    self._critic_step(st, m, rows)
                clip_sum += stats["clip_frac"] * stats["tokens"]
                tok_sum += stats["tokens"]
                loss_sum += loss
                updates += 1
        nonzero = (np.abs(adv) > 1e-12).any(1)
        rec.update(clip_frac=clip_sum / max(tok_sum, 1.0), rur=float(nonzero.mean()), loss=loss_sum / updates,
                   gen_per_trained=generated / len(r), trained=len(r), generated=generated, cov_logp_adv=cov,
                   **clips.summary(), **{k: v / max(tok_sum, 1.0) for k, v in extra_sums.items()})
        return rec

    def _at_fork(self, states):
        """Which tokens sit at forking positions (feature_lm), else None."""
        part = getattr(self.env, "part", None)
        return None if part is None else part[states] == 1

    def _critic_step(self, st, m, rows):
        """PPO's clipped value loss on the tabular critic V(s), chained to the table."""
        v = self.values[st] * m
        _, dv, _ = value_loss(v, self.old_values[rows], self.returns[rows], m, clip=self.cfg["vf_clip"])
        self.critic.step(np.bincount(st.reshape(-1), weights=(dv * m).reshape(-1), minlength=len(self.values)))

    # ---- DPO -----------------------------------------------------------------------------------------------
    def _build_pairs(self):
        """Preference pairs from G reference samples per pool prompt: i-th best vs i-th worst by reward."""
        cfg, g = self.cfg, self.cfg["group_size"]
        ro = self.env.sample(self.env.sampler(self.env.init), np.arange(cfg["n_prompts"]), g, self.rng)
        r = rewards_of(ro, cfg, self.rng).reshape(-1, g)
        order = np.argsort(-r, axis=1, kind="stable")
        half = g // 2
        best, worst = order[:, :half], order[:, ::-1][:, :half]
        rows = np.arange(len(r))[:, None]
        ok = r[rows, best] > r[rows, worst]
        if not ok.any():
            raise ValueError("group_size: no preference pairs: every reference group had equal rewards; "
                             "raise group_size or n_prompts")
        self.chosen = (rows * g + best)[ok]
        self.rejected = (rows * g + worst)[ok]
        self.pair_ro = ro
        self.ref_seq = self.env.ref_logp(ro.states, ro.tokens, ro.mask).sum(1)

    def _dpo_step(self, table) -> dict:
        cfg, g = self.cfg, self.cfg["group_size"]
        eval_ro = self.env.sample(table, self.rng.permutation(cfg["n_prompts"])[:cfg["batch_prompts"]], g,
                                  self.rng)
        rec = rollout_metrics(eval_ro, rewards_of(eval_ro, cfg, self.rng), g)
        ro, n = self.pair_ro, min(len(self.chosen), cfg["batch_prompts"] * g // 2)
        loss_sum, updates = 0.0, 0
        for _ in range(cfg["epochs"]):
            pick = self.rng.permutation(len(self.chosen))[:n]
            for mb in np.array_split(pick, min(cfg["minibatches"], n)):
                w, l_ = self.chosen[mb], self.rejected[mb]
                rows = np.concatenate([w, l_])
                st, tk, m = ro.states[rows], ro.tokens[rows], ro.mask[rows]
                logp, pi_rows = self.env.rows(self.params, st, tk, m)
                seq = logp.sum(1)
                k = len(w)
                loss, (gw, gl), _ = dpo_loss(seq[:k], seq[k:], self.ref_seq[w], self.ref_seq[l_],
                                             beta=cfg["loss"]["beta"])
                grad = np.concatenate([gw, gl])[:, None] * m  # d seq / d logp_t = 1 on response tokens
                self.opt.step(self.env.grad(self.params, st, tk, m, pi_rows, grad))
                loss_sum += loss
                updates += 1
        rec.update(clip_frac=None, rur=None, gen_per_trained=None, loss=loss_sum / updates, trained=2 * n,
                   generated=len(eval_ro.outcome))
        return rec


def run(env: str, algo: str, seed: int, steps: int, overrides: dict | None = None,
        on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Train ``algo`` on ``env`` for ``steps`` steps; returns (and streams to ``on_step``) the per-step metrics."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive integer, got {steps!r}")
    trainer = Trainer(env, algo, seed, overrides, steps)
    records = []
    for _ in range(steps):
        rec = trainer.step()
        records.append(rec)
        if on_step is not None:
            on_step(rec)
    return records
