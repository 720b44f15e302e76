"""The vectorised RL loop: rollouts, rewards, advantages, minibatch epochs of ``policy_loss``, optimiser steps."""
from __future__ import annotations

import functools
import itertools
from dataclasses import replace
from typing import Callable

import numpy as np

from collections import deque

from . import bandit, optim, toy_lm
from .advantages import SmoothAdvantage, dynamic_sampling_filter, gae, group_advantages, overlong_penalty
from .aggregation import block_count
from .config import REWARD_SCHEMES, resolve
from .feature_lm import FeatureLM
from .losses import dpo_terms, policy_terms, value_loss
from .metrics import NO_CLIP, StepClips, batch_cov, clean, entropy_law, exact_metrics, rollout_metrics
from .tabular import CORRECT, MALFORMED, Rollout, TableEnv, concat_rollouts, uniforms
from spec.contract import resolve_hparams
from spec.registry import ALGORITHMS, POLICY_ALGORITHMS

#: Stats some losses add (CISPO's truncated share, Clip-Cov's and KL-Cov's selected share, rollout correction's mean
#: weight and cut share), averaged over a step's tokens.
EXTRA_STATS = ("trunc_frac", "cov_frac", "rc_weight_mean", "rc_cut_frac")


#: The settings each environment is built from (beyond n_prompts, the difficulty range and env_seed).
ENV_KEYS = {"bandit": ("n_arms",), "toy_lm": ("max_len", "n_think", "n_answers"),
            "feature_lm": ("vocab", "answer_len", "max_len", "n_correct", "forks", "n_features", "zipf", "confidence",
                           "offtrack_eos", "explore")}


def build_env(env: str, cfg: dict, draws: tuple[int, ...] | None = None):
    """The environment object of ``env`` under the settings ``cfg`` (sampling, exact metrics, policy rows), with
    one stacked policy per entry of ``draws`` (the environment draw, an ``env_seed``, of each seed of a stacked
    trainer; default one policy in ``cfg``'s draw). Built once per process for each distinct setting and draws:
    runs only read it, and its arrays are read-only."""
    keys = ("n_prompts", "difficulty_low", "difficulty_high", *ENV_KEYS[env])
    return _stacked_env(env, tuple((k, cfg[k]) for k in keys), tuple(draws or (cfg["env_seed"],)))


@functools.lru_cache(maxsize=2)  # a stacked environment holds every copy's arrays: only the latest ones kept
def _stacked_env(env: str, settings: tuple, draws: tuple[int, ...]):
    if len(draws) == 1:
        return _one_draw(env, settings, draws[0])
    stack = FeatureLM.stack if env == "feature_lm" else TableEnv.stack
    return _read_only(stack([_one_draw(env, settings, draw) for draw in draws]))


@functools.lru_cache(maxsize=32)
def _one_draw(env: str, settings: tuple, env_seed: int):
    kw = {**dict(settings), "env_seed": env_seed}
    if env == "feature_lm":
        return _read_only(FeatureLM(**kw))
    return _read_only(TableEnv(*(bandit if env == "bandit" else toy_lm).build(**kw)))


def _read_only(built):
    owners = [built] + ([built.aut] if isinstance(built, TableEnv) else [])
    for value in (v for owner in owners for v in vars(owner).values()):
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return built


def rewards_of(ro: Rollout, cfg: dict, rng: np.random.Generator | None = None) -> np.ndarray:
    """The reward scheme's value of each outcome, plus DAPO's soft overlong punishment (Eq. 13) if on.

    ``random``: 1 or 0 with probability 1/2 each, independent of the response (the spurious-reward control of
    Park et al. 2509.26114); needs ``rng`` (or one per stacked copy).
    """
    if cfg["reward"] == "random":
        r = (uniforms(rng, len(ro.outcome)) < 0.5).astype(float)
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


_ROW_FIELDS = [f for f in Rollout.__dataclass_fields__ if f != "prompts"]


def _split(ro: Rollout, copies: int) -> list[Rollout]:
    """A stacked rollout's part of each copy (equal shares, in copy order)."""
    if copies == 1:
        return [ro]
    n, b = len(ro.prompts) // copies, len(ro.outcome) // copies
    return [Rollout(ro.prompts[c * n:(c + 1) * n], *(getattr(ro, f)[c * b:(c + 1) * b] for f in _ROW_FIELDS))
            for c in range(copies)]


def _cuts(n: int, parts: int) -> list[tuple[int, int]]:
    """The (start, end) of each chunk of ``np.array_split(range(n), min(parts, n))``: the first ``n % parts`` one
    longer."""
    parts = min(parts, n)
    size, extra = divmod(n, parts)
    ends = [(i + 1) * size + min(i + 1, extra) for i in range(parts)]
    return list(zip([0] + ends, ends))


def _slices(sizes: list[int]) -> list[slice]:
    """Consecutive slices of the given sizes, from 0."""
    ends = list(itertools.accumulate(sizes))
    return [slice(b - n, b) for n, b in zip(sizes, ends)]


def _chunks(order: np.ndarray, parts: int) -> list[np.ndarray]:
    """``np.array_split(order, min(parts, len(order)))``."""
    return [order[a:b] for a, b in _cuts(len(order), parts)]


def _check_seeds(seeds) -> list[int]:
    if not isinstance(seeds, (list, tuple)) or not seeds or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ValueError(f"seeds: expected a non-empty list of integers >= 0, got {seeds!r}")
    return [int(s) for s in seeds]


def _check_draws(draws, seeds: list[int], default: int) -> tuple[int, ...]:
    """Each seed's environment draw: ``draws`` (one integer >= 0 per seed), or ``default`` for every seed."""
    if draws is None:
        return (default,) * len(seeds)
    if not isinstance(draws, (list, tuple)) or len(draws) != len(seeds) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in draws):
        raise ValueError(f"draws: expected one integer >= 0 per seed ({len(seeds)}), got {draws!r}")
    return tuple(int(d) for d in draws)


class Diverged(ValueError):
    """The trained parameters became non-finite (a learning rate too large for the optimiser): the run stops, and
    its metrics are never written as NaN or None."""


class Trainer:
    """Runs of one setting: an environment, the policies' parameters, reference, optimiser and advantage state.

    ``seeds``: a seed, or a list of them run as one stacked trainer: copies of the environment and
    the parameters, a random stream per seed, so each seed's numbers are those of its run alone while every array
    operation serves all of them. ``draws``: each seed's environment draw (its ``env_seed``; default the
    setting's for every seed), so one trainer serves seeds of different environment instances. ``steps`` (if
    known) makes the last step an exact evaluation whatever ``eval_every``.
    """

    def __init__(self, env: str, algo: str, seeds, overrides: dict | None = None, steps: int | None = None,
                 draws: list[int] | None = None):
        self.seeds = _check_seeds([seeds] if isinstance(seeds, (int, np.integer)) else seeds)
        self.env_name, self.algo, self.copies = env, algo, len(self.seeds)
        self.cfg = cfg = resolve(env, algo, overrides)
        self.env = build_env(env, cfg, _check_draws(draws, self.seeds, cfg["env_seed"]))
        self.info = self.env.info
        self.params = self.env.init.copy()
        if isinstance(self.env, TableEnv):  # the tabular policy's parameters are its logit table
            self.aut, self.logits = self.env.aut, self.params
        self.rngs = [np.random.default_rng(seed) for seed in self.seeds]
        kw = {"momentum": cfg["momentum"]} if cfg["optimizer"] == "sgd" else {}
        self.opt = optim.make(cfg["optimizer"], self.params, cfg["lr"], self.copies, **kw)
        self.sas = SmoothAdvantage() if cfg.get("adv") == "sas" else None
        if cfg.get("adv") == "gae":
            self.values = np.zeros(self.env.n_states)
            self.critic = optim.Adam(self.values, cfg["critic_lr"], blocks=self.copies)
        self.step_no, self.last_step = 0, None if steps is None else steps - 1
        self.history = deque(maxlen=cfg["staleness"] + 1)  # parameters at the start of the last steps
        self.history_updates = deque(maxlen=cfg["staleness"] + 1)  # each copy's optimiser updates by then
        self.snaps = self.env.snapshots(self.params)
        orders = [np.argsort(snap.success, kind="stable") for snap in self.snaps]  # each copy's draw's prompts
        third = max(1, len(orders[0]) // 3)
        self.hard, self.easy = [order[:third] for order in orders], [order[-third:] for order in orders]
        self.cov_sum = np.zeros(self.copies)
        if algo not in POLICY_ALGORITHMS:
            self._build_pairs()
        else:  # checked once here; each update calls the unchecked terms
            self.loss_hp = resolve_hparams(algo, cfg["loss"])

    # ---- rollouts ------------------------------------------------------------------------------------------
    def _collect(self, params):
        """Rollouts of G responses per prompt from the policy ``params``, each copy's prompts drawn by its own
        stream. With dynamic sampling, the copies still short of a full batch refill with new prompts, round by
        round (DAPO Sec. 3.2). Returns each copy's (responses generated, their rewards), and the training batches:
        (copies, their responses kept, stacked, rewards), copies with as many kept groups stacked together."""
        cfg, g, copies = self.cfg, self.cfg["group_size"], self.copies
        p, pool, ds = cfg["batch_prompts"], cfg["n_prompts"], cfg["dynamic_sampling"]
        orders = [rng.permutation(pool) for rng in self.rngs]
        if not ds:
            prompts = np.concatenate([order[:p] + c * pool for c, order in enumerate(orders)])
            ro = self.env.sample(params, prompts, g, self.rngs)
            r = rewards_of(ro, cfg, self.rngs)
            return list(zip(_split(ro, copies), r.reshape(copies, -1))), [(list(range(copies)), ro, r)]
        per_round = int(np.ceil(p * cfg["ds_oversample"]))
        seen, kept = [[] for _ in range(copies)], [[] for _ in range(copies)]
        active = list(range(copies))
        for k in range(cfg["ds_max_rounds"]):
            chunks = [orders[c][k * per_round:(k + 1) * per_round] + c * pool for c in active]
            if chunks[0].size == 0:  # the pool is spent (distinct prompts within a step)
                break
            gens = [self.rngs[c] for c in active]
            ro = self.env.sample(params, np.concatenate(chunks), g, gens)
            r = rewards_of(ro, cfg, gens)
            for c, ro_c, r_c in zip(list(active), _split(ro, len(active)), r.reshape(len(active), -1)):
                seen[c].append((ro_c, r_c))
                good = np.flatnonzero(dynamic_sampling_filter((ro_c.outcome == CORRECT).astype(float), g))
                have = sum(len(x.prompts) for x, _ in kept[c])
                if good.size:
                    take = good[:p - have]
                    kept[c].append((_select(ro_c, take, g), r_c.reshape(-1, g)[take].reshape(-1)))
                if have + min(good.size, p - have) == p:
                    active.remove(c)
            if not active:
                break
        by_size: dict[int, list[int]] = {}
        for c in range(copies):
            if kept[c]:
                by_size.setdefault(sum(len(x.prompts) for x, _ in kept[c]), []).append(c)
        batches = [(cs, concat_rollouts([x for c in cs for x, _ in kept[c]]),
                    np.concatenate([y for c in cs for _, y in kept[c]])) for cs in by_size.values()]
        return [(concat_rollouts([x for x, _ in part]), np.concatenate([y for _, y in part])) for part in seen], batches

    def _advantages(self, ro: Rollout, r: np.ndarray, ref_lp: np.ndarray, copies: int) -> np.ndarray:
        """Token advantages [B, T] per the configured estimator (sequence ones broadcast over tokens), of a batch
        of ``copies`` stacked copies."""
        cfg, g = self.cfg, self.cfg["group_size"]
        kind = cfg["adv"]
        if kind in ("grpo", "dr_grpo", "rloo", "gpg"):  # group by group; GPG's factor counts each copy's live groups
            seq = np.concatenate([group_advantages(x, g, kind, eps=cfg["adv_eps"], unbiased=cfg["adv_unbiased"])
                                  for x in (r.reshape(copies, -1) if kind == "gpg" else [r])])
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
    def step(self) -> list[dict]:
        """One rollout and its minibatch epochs; returns each seed's metrics of the step (exact ones on evaluation
        steps)."""
        recs = [{} for _ in self.seeds]
        if self.step_no % self.cfg["eval_every"] == 0 or self.step_no == self.last_step:
            snaps = self.env.snapshots(self.params) if self.step_no else self.snaps
            for rec, old, snap, cov, hard, easy in zip(recs, self.snaps, snaps, self.cov_sum, self.hard, self.easy):
                rec.update(exact_metrics(snap, hard, easy))
                if self.step_no:
                    rec.update(entropy_law(old, snap), cov_interval=cov)
            self.snaps, self.cov_sum = snaps, np.zeros(self.copies)
        self.history.append(self.params.copy() if self.cfg["staleness"] else self.params)
        self.history_updates.append(self.opt.t.copy())
        params = self._rollout_params()  # the policy ``staleness`` steps back, perturbed
        for rec, part in zip(recs, self._rl_step(params) if self.algo in POLICY_ALGORITHMS else
                             self._dpo_step(params)):
            rec.update(part, step=self.step_no)
        if not np.isfinite(np.add.reduce(self.params, axis=None)):  # a NaN or inf anywhere reaches the sum
            finite = np.isfinite(self.params.reshape(self.copies, -1)).all(1)
            raise Diverged(f"lr: the policy's parameters left the finite numbers at step {self.step_no} (seed(s) "
                           f"{', '.join(str(s) for s, ok in zip(self.seeds, finite) if not ok)}; "
                           f"{self.cfg['optimizer']}, lr {self.cfg['lr']:g}); expected a smaller lr")
        self.step_no += 1
        return [clean(rec) for rec in recs]

    def _rollout_params(self):
        """The rollout policy's parameters: the trainer's ``staleness`` steps back, plus N(0, rollout_noise^2)
        per parameter, drawn afresh each step by each copy's stream (a rollout engine that does not quite compute
        the trainer's policy)."""
        params, noise = self.history[0], self.cfg["rollout_noise"]
        if not noise:
            return params
        shape = (len(params) // self.copies, *params.shape[1:])
        return params + noise * np.concatenate([rng.standard_normal(shape) for rng in self.rngs])

    def _rl_step(self, params) -> list[dict]:
        g = self.cfg["group_size"]
        seen, batches = self._collect(params)
        recs = []
        for ro, r in seen:
            recs.append(rollout_metrics(ro, r, g))
            recs[-1].update(clip_frac=None, rur=None, gen_per_trained=None, loss=None, trained=0, generated=len(r))
        for copies, ro, r in batches:  # a copy with no informative group (dynamic sampling) is not trained
            for c, part in zip(copies, self._train(copies, ro, r)):
                recs[c].update(part, gen_per_trained=recs[c]["generated"] / part["trained"])
        return recs

    def _train(self, copies: list[int], ro: Rollout, r: np.ndarray) -> list[dict]:
        """The minibatch epochs on a batch of the ``copies`` listed, stacked (equal sizes); each copy's metrics."""
        cfg, g, k = self.cfg, self.cfg["group_size"], len(copies)
        rngs = [self.rngs[c] for c in copies]
        rollout_lp = ro.old_logp  # the engine's log-probs; the trainer's old policy is the unperturbed one
        if cfg["rollout_noise"]:
            ro = replace(ro, old_logp=self.env.rows(self.history[0], ro.states, ro.tokens, ro.mask)[0])
        ref_lp = self.env.ref_logp(ro.states, ro.tokens, ro.mask)
        adv = self._advantages(ro, r, ref_lp, k)
        mask = ro.mask * ~ro.truncated[:, None] if cfg["overlong_filter"] else ro.mask
        covs = [batch_cov(*x) for x in zip(*(y.reshape(k, -1, y.shape[1]) for y in (ro.old_logp, adv, mask)))]
        self.cov_sum[copies] += [0.0 if cov is None else cov for cov in covs]
        n_groups, trained = len(ro.prompts) // k, len(r) // k  # per copy
        clips = StepClips(self.algo, cfg["loss"], k)
        clip_sum, tok_sum, loss_sum = np.zeros((3, k))
        lag = self.opt.t[copies] - self.history_updates[0][copies]  # updates between sampler and learner
        extra_sums: dict = {}  # token-weighted sums of the stats some losses add (trunc_frac, cov_frac, rc_*)
        updates = 0
        alg, cuts = ALGORITHMS[self.algo], _cuts(n_groups, cfg["minibatches"])
        first_row = (np.arange(k) * trained)[:, None, None] + np.arange(g)  # of each copy's group, by response
        for _ in range(cfg["epochs"]):
            groups = np.stack([rng.permutation(n_groups) for rng in rngs])[:, :, None] * g + first_row
            # each minibatch's rows (each copy's share of it, stacked), the minibatches one after the other: the
            # epoch's arrays are gathered once and each update takes its slice
            order = np.concatenate([groups[:, a:b].reshape(-1) for a, b in cuts])
            epoch = [x[order] for x in (ro.states, ro.tokens, mask, ro.old_logp, adv, ref_lp, rollout_lp)]
            fork = self.env.at_fork(epoch[0])
            for mb in _slices([k * (b - a) * g for a, b in cuts]):
                st, tk, m, old, a, ref_mb, rollout_mb = (x[mb] for x in epoch)
                logp, visited = self.env.rows(self.params, st, tk, m)
                hp = self.loss_hp
                if alg.select == "clip_cov":  # Clip-Cov's random choice: a seed per update and copy
                    hp = {**hp, "cov_seed": [int(rng.integers(2**31 - 1)) for rng in rngs]}
                kept: dict = {}  # the token ratio (and DCPO's bounds) the loss computed, for StepClips
                loss, grad, stats = policy_terms(alg, hp, logp, old, a, m, g, ref_mb, rollout_mb, keep=kept,
                                                 blocks=k, shown_stats=False)
                on_policy = (lag == 0) & (updates == 0) & (cfg["rollout_noise"] == 0)  # r = 1 exactly
                zeroed = clips.add(logp, old, a, m, None if fork is None else fork[mb], on_policy=on_policy,
                                   **kept)
                for key in EXTRA_STATS:
                    if key in stats:
                        extra_sums[key] = extra_sums.get(key, 0.0) + stats[key] * stats["tokens"]
                extra_sums["ppo_zeroed_frac"] = extra_sums.get("ppo_zeroed_frac", 0.0) + zeroed
                self.opt.step(*self.env.grad(self.params, st, tk, m, visited, grad), only=copies)
                if cfg["adv"] == "gae":
                    self._critic_step(st, m, order[mb], copies)
                clip_sum += stats["clip_frac"] * stats["tokens"]
                tok_sum += stats["tokens"]
                loss_sum += loss
                updates += 1
        rur = (np.abs(adv) > 1e-12).any(1).reshape(k, -1).mean(1)
        tok_n = np.maximum(tok_sum, 1.0)
        clip_frac = None if alg.clip in NO_CLIP else clip_sum / tok_n
        return [{"clip_frac": None if clip_frac is None else clip_frac[i], "rur": float(rur[i]),
                 "loss": loss_sum[i] / updates, "trained": trained, "cov_logp_adv": covs[i],
                 "updates_per_batch": updates, "staleness": int(lag[i]), **clip_rec,
                 **{key: v[i] / tok_n[i] for key, v in extra_sums.items()}}
                for i, clip_rec in enumerate(clips.summary())]

    def _critic_step(self, st, m, rows, copies):
        """PPO's clipped value loss on the tabular critic V(s), chained to the table (each copy's minibatch
        averaged on its own)."""
        v = self.values[st] * m
        _, dv, _ = value_loss(v, self.old_values[rows], self.returns[rows], m, clip=self.cfg["vf_clip"],
                              blocks=len(copies))
        self.critic.step(np.bincount(st.reshape(-1), weights=(dv * m).reshape(-1), minlength=len(self.values)),
                         only=copies)

    # ---- DPO -----------------------------------------------------------------------------------------------
    def _build_pairs(self):
        """Preference pairs from G reference samples per pool prompt: i-th best vs i-th worst by reward (each
        copy its own, from its own samples)."""
        cfg, g, pool = self.cfg, self.cfg["group_size"], self.cfg["n_prompts"]
        prompts = np.concatenate([np.arange(pool) + c * pool for c in range(self.copies)])
        ro = self.env.sample(self.env.init, prompts, g, self.rngs)
        r = rewards_of(ro, cfg, self.rngs).reshape(-1, g)
        order = np.argsort(-r, axis=1, kind="stable")
        half = g // 2
        best, worst = order[:, :half], order[:, ::-1][:, :half]
        rows = np.arange(len(r))[:, None]
        ok = r[rows, best] > r[rows, worst]
        counts = block_count(ok, self.copies)
        if not counts.all():
            raise ValueError("group_size: no preference pairs: every reference group had equal rewards; "
                             "raise group_size or n_prompts")
        cuts = np.cumsum(counts)[:-1]
        self.chosen = np.split((rows * g + best)[ok], cuts)  # per copy: rows of the stacked reference samples
        self.rejected = np.split((rows * g + worst)[ok], cuts)
        self.pair_ro = ro
        self.ref_seq = self.env.ref_logp(ro.states, ro.tokens, ro.mask).sum(1)

    def _dpo_step(self, params) -> list[dict]:
        cfg, g, pool, p = self.cfg, self.cfg["group_size"], self.cfg["n_prompts"], self.cfg["batch_prompts"]
        prompts = np.concatenate([rng.permutation(pool)[:p] + c * pool for c, rng in enumerate(self.rngs)])
        eval_ro = self.env.sample(params, prompts, g, self.rngs)
        r = rewards_of(eval_ro, cfg, self.rngs)
        recs = [rollout_metrics(x, y, g) for x, y in zip(_split(eval_ro, self.copies), r.reshape(self.copies, -1))]
        by_pairs: dict[int, list[int]] = {}  # copies that train on as many pairs train stacked
        for c, chosen in enumerate(self.chosen):
            by_pairs.setdefault(min(len(chosen), p * g // 2), []).append(c)
        for n, copies in by_pairs.items():
            for c, loss in zip(copies, self._dpo_train(copies, n)):
                recs[c].update(clip_frac=None, rur=None, gen_per_trained=None, loss=loss, trained=2 * n,
                               generated=len(r) // self.copies)
        return recs

    def _dpo_train(self, copies: list[int], n: int) -> np.ndarray:
        """DPO's minibatch epochs on ``n`` pairs of each of the ``copies`` listed, stacked; their mean losses."""
        cfg, ro = self.cfg, self.pair_ro
        rngs = [self.rngs[c] for c in copies]
        loss_sum, updates = np.zeros(len(copies)), 0
        for _ in range(cfg["epochs"]):
            splits = [_chunks(rng.permutation(len(self.chosen[c]))[:n], cfg["minibatches"])
                      for c, rng in zip(copies, rngs)]
            for mbs in zip(*splits):  # as many pairs in each copy's minibatch
                rows = np.concatenate([x for c, mb in zip(copies, mbs) for x in (self.chosen[c][mb],
                                                                                 self.rejected[c][mb])])
                st, tk, m = ro.states[rows], ro.tokens[rows], ro.mask[rows]
                logp, visited = self.env.rows(self.params, st, tk, m)
                seq = logp.sum(1).reshape(len(copies), 2, -1)  # each copy's chosen, then rejected
                ref = self.ref_seq[rows].reshape(seq.shape)
                loss, grad_w, _ = dpo_terms(seq[:, 0], seq[:, 1], ref[:, 0], ref[:, 1], cfg["loss"]["beta"])
                loss_sum += loss
                grad = np.stack([grad_w, -grad_w], 1).reshape(-1, 1) * m  # d seq / d logp_t = 1 on response tokens
                self.opt.step(*self.env.grad(self.params, st, tk, m, visited, grad), only=copies)
                updates += 1
        return loss_sum / updates


def run(env: str, algo: str, seed: int, steps: int, overrides: dict | None = None,
        on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Train ``algo`` on ``env`` for ``steps`` steps; returns (and streams to ``on_step``) the per-step metrics."""
    return run_stack(env, algo, [seed], steps, overrides, on_step and (lambda _, rec: on_step(rec)))[0]


def run_stack(env: str, algo: str, seeds: list[int], steps: int, overrides: dict | None = None,
              on_step: Callable[[int, dict], None] | None = None, draws: list[int] | None = None) -> list[list[dict]]:
    """``run`` of each seed, all in one stacked trainer, the i-th seed in environment draw ``draws[i]`` (default:
    the setting's ``env_seed``); ``on_step(i, rec)`` gets the i-th seed's steps as they come. Each seed's metrics
    are those of its run alone (with ``{"env_seed": draws[i]}`` among its overrides)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive integer, got {steps!r}")
    trainer = Trainer(env, algo, seeds, overrides, steps, draws)
    records: list[list[dict]] = [[] for _ in trainer.seeds]
    for _ in range(steps):
        for i, rec in enumerate(trainer.step()):
            records[i].append(rec)
            if on_step is not None:
                on_step(i, rec)
    return records
