"""The RL loop: rollout, reward, advantage, minibatch epochs with ``gpu.policy_loss`` (or ``dpo_loss``), metrics,
checkpoints and exact resume."""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import resource
import time
import weakref
from pathlib import Path

import numpy as np
import torch

import gpu

from . import checkpoint as ckpt
from .aggregation import agg_units
from .batch import build_batch, completion_values, last_token_rewards, token_logprobs
from spec.contract import resolve_hparams
from spec.registry import ALGORITHMS
from spec.records import writable_folder

from .config import Config
from .data import BOXED_ONLY, PromptStream, check_alphabet, load_problems, prompt_ids, relevant_token_ids
from .loggers import StepLoggers
from .models import ValueModel, load_policy, load_reference, load_tokenizer, resolve_model
from .rewards import VERIFIER, extract_answer, overlong_filter_mask, score
from .rollout import Rollouts, logprob_gap, make_engine
from .step_metrics import StepClips, batch_cov, rollout_metrics

#: The metrics that time a step or read the machine: they differ from one run of a config to the next, where every
#: other metric of a resumed run is the straight run's.
TIMING_METRICS = ("rollout_s", "train_s", "old_logp_s", "optimizer_s", "weight_sync_s", "step_time_s",
                  "gen_tokens_per_s", "tokens_per_s", "peak_mem_mb")


def _peak_mem_mb(device) -> float:
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak RSS of the process (Linux: KiB)


def _mean(xs):
    return float(np.mean(xs)) if len(xs) else 0.0


class Trainer:
    """One training run; ``engine`` may be passed in to share a running vLLM engine between runs (tests).
    The run owns ``run.out_dir`` (a lock) until :meth:`fit` ends or :meth:`close`. Resuming under a changed config
    is refused unless ``allow_config_change`` (then it is recorded); starting over (``run.resume: false``, or no
    checkpoint) supersedes an earlier run's checkpoint before anything else is written, and records that run."""

    def __init__(self, cfg: Config, engine=None, allow_config_change: bool = False):
        self.cfg = cfg
        self.out = writable_folder(cfg.run.out_dir, "run.out_dir")
        self._unlock = weakref.finalize(self, os.close, ckpt.own(self.out))
        try:
            self._start(engine, allow_config_change)
        except BaseException:
            self._unlock()
            raise

    def _start(self, engine, allow_config_change: bool) -> None:
        c = self.cfg
        found = ckpt.find(self.out) if c.run.resume else None
        change = ckpt.resume_config_change(found, c.to_dict(), allow_config_change) if found else None
        if c.run.threads:
            torch.set_num_threads(c.run.threads)
        random.seed(c.run.seed)
        np.random.seed(c.run.seed)
        torch.manual_seed(c.run.seed)
        self.dev = torch.device(c.model.device)
        self.path = resolve_model(c.model.name, c.model.cache_dir, c.model.tiny)
        self.tok = load_tokenizer(self.path)
        self.model = load_policy(self.path, device=c.model.device, lora=c.model.lora,
                                 train_top_layers=c.model.train_top_layers).train()
        self.hp = c.loss_hparams() if c.algo.name != "dpo" else {}
        beta = gpu_beta(c)
        self.ref = (load_reference(self.path, device=c.model.device)
                    if c.algo.name == "dpo" or beta > 0 or c.algo.kl_reward_coef > 0 else None)
        self.value = ValueModel(self.path, device=c.model.device) if c.algo.name == "ppo" else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        fused = {"fused": True} if self.dev.type in ("cpu", "cuda") else {}  # one kernel for every tensor
        self.opt = torch.optim.AdamW(params, lr=c.train.lr, weight_decay=c.train.weight_decay, **fused)
        self.vopt = (torch.optim.AdamW(self.value.parameters(), lr=c.train.value_lr, **fused)
                     if self.value else None)
        # the sampling policy: the trained model itself, or with train.staleness k a copy holding its weights of k
        # optimiser updates ago (the rollouts' pi_old); updates counts them, sampler_at is the sampler's count
        self.sampler = copy.deepcopy(self.model).eval() if c.train.staleness else self.model
        self.updates, self.sampler_at = 0, 0
        if c.algo.name != "dpo" and c.updates_per_batch == 1 and not c.train.staleness:
            logging.getLogger(__name__).warning(
                "train.epochs / train.minibatch_size: one optimiser update per rollout batch and train.staleness 0: "
                "every ratio is 1, so no clip binds (set train.epochs > 1, a train.minibatch_size below the batch, "
                "or train.staleness > 0)")
        data_kw = ({"n": c.data.n, "digits": c.data.digits, "terms": c.data.terms, "ops": c.data.ops,
                    "seed": c.run.seed} if c.data.source == "arithmetic" else
                   {"n": c.data.n, "digits": c.data.digits, "seed": c.run.seed} if c.data.source == "addition" else
                   {"path": c.data.path, "limit": c.data.limit} if c.data.source in ("gsm8k", "math") else
                   {"limit": c.data.limit})
        self.stream = PromptStream(load_problems(c.data.source, **data_kw), seed=c.run.seed)
        check_alphabet(self.tok, self.stream.problems, c.data.source)
        self.relevant = relevant_token_ids(self.tok, c.data.source)
        self.sas = gpu.SmoothAdvantage()
        self.verifier = VERIFIER  # one long-lived answer checker per process
        self.step = 0
        self.autocast = (torch.autocast(self.dev.type, dtype=getattr(torch, c.model.dtype))
                         if c.model.dtype != "float32" else contextlib.nullcontext())
        shared = engine is not None
        if not shared:
            engine = make_engine(c.rollout.engine, self.sampler, self.tok, self.path,
                                 **({"kv_cache_bytes": c.rollout.vllm_kv_cache_mb << 20, "seed": c.run.seed,
                                     "dtype": "float32"} if c.rollout.engine == "vllm" else {}))
        self.engine = engine
        self.prompt_budget = prompt_budget(c, getattr(engine, "max_model_len", None)
                                           or getattr(self.model.config, "max_position_embeddings", None))
        longest = max(self.stream.problems, key=lambda p: len(p.question))  # a prompt too long fails now, not later
        prompt_ids(self.tok, longest, c.data.system, self.prompt_budget)
        # everything is loaded and checked: only now does the folder change
        ckpt.tidy(self.out)
        if found:
            self._restore(found)
        else:
            ckpt.start_over(self.out)
        if shared or found:
            engine.update(self.sampler)
        if change:
            ckpt.record(self.out, change)
        resolved = {"reward": c.reward, "advantage": c.advantage,
                    "loss": (resolve_hparams(c.algo.name, self.hp) if c.algo.name != "dpo"
                             else {"beta": c.algo.dpo_beta})}
        ckpt.write_config(self.out, {**c.to_dict(), "resolved": resolved})
        self.loggers = StepLoggers(c, self.out, self.step)

    # -- checkpoints ------------------------------------------------------------------------------------------
    def _modules(self):
        return {"policy": self.model, **({"value": self.value} if self.value else {}),
                **({"sampler": self.sampler} if self.sampler is not self.model else {})}

    def _optims(self):
        return {"policy": self.opt, **({"value": self.vopt} if self.vopt else {})}

    def save(self):
        """Checkpoint everything resume needs."""
        ckpt.save(self.out, self.step, self._modules(), self._optims(),
                  {"stream": self.stream.state_dict(), "sas": self.sas.state_dict(),
                   "updates": {"done": self.updates, "sampler_at": self.sampler_at}}, self.cfg.to_dict())

    def _restore(self, found):
        state = ckpt.load(found, self._modules(), self._optims())
        self.step = state["step"]
        updates = state.get("updates", {"done": 0, "sampler_at": 0})
        self.updates, self.sampler_at = updates["done"], updates["sampler_at"]
        self.stream.load_state_dict(state["stream"], found / "state.json")
        try:
            self.sas.load_state_dict(state["sas"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise ValueError(f"{found / 'state.json'}: sas: expected {{'history': {{prompt id: [visits, mean, "
                             f"variance]}}}} ({type(exc).__name__}: {exc})") from None
        ckpt.trim_metrics(self.out / "metrics.jsonl", self.step)

    def close(self) -> None:
        """Release the run folder (and close the TensorBoard and W&B loggers)."""
        self.loggers.close()
        self._unlock()

    # -- rollout and reward -----------------------------------------------------------------------------------
    def _score(self, ro: Rollouts, probs):
        """(rewards, correct, malformed) of the rollouts: malformed when no answer can be read (with
        BOXED_ONLY sources, none in \\boxed{}) or the response ran out of budget."""
        G = self.cfg.rollout.group_size
        texts = self.tok.batch_decode(ro.completion_ids, skip_special_tokens=True)
        golds = [p.answer for p in probs for _ in range(G)]
        boxed_only = self.cfg.data.source in BOXED_ONLY
        rewards, correct = score(texts, golds, self.cfg.reward, self.verifier,  # each completion verified once
                                 boxed_only=boxed_only)
        malformed = torch.tensor([t or extract_answer(x, boxed_only) is None for x, t in zip(texts, ro.truncated)],
                                 dtype=torch.float32)
        a = self.cfg.algo
        if a.overlong_max_len is not None:
            lengths = torch.tensor([len(c) for c in ro.completion_ids], dtype=torch.float32)
            rewards = rewards + gpu.overlong_penalty(lengths, a.overlong_max_len, a.overlong_cache_len)
        return rewards, correct, malformed

    def _rollout(self):
        """Sample groups from the sampler. With dynamic sampling (DAPO 2503.14476 Sec. 3.2, Eq. 11, as its verl
        recipe runs it) each round samples rollout.gen_batch_factor x the step's prompts and keeps the groups with
        0 < #correct < G, until the step's prompts are filled (the surplus dropped) or rollout.max_rounds have
        run: a full batch but when every round is used up."""
        c = self.cfg
        P, G = c.rollout.prompts_per_step, c.rollout.group_size
        dynamic = c.algo.dynamic_sampling
        kept, probs_kept, rewards, correct = Rollouts([], [], [], []), [], [], []
        generated, all_correct, all_rewards, all_lens, all_bad = 0, [], [], [], []
        timeouts0 = self.verifier.timeouts
        rounds = c.rollout.max_rounds if dynamic else 1
        for rnd in range(rounds):
            probs = self.stream.next(c.rollout.gen_batch_factor * P if dynamic else P)
            prompts = [prompt_ids(self.tok, p, c.data.system, self.prompt_budget) for p in probs]
            ro = self.engine.generate(prompts, G, c.rollout.max_new_tokens, c.rollout.temperature,
                                      seed=c.run.seed * 1_000_003 + self.step * 101 + rnd)
            r, ok, bad = self._score(ro, probs)
            generated += len(ro)
            all_correct.append(ok)
            all_rewards.append(r)
            all_bad.append(bad)
            all_lens.append(torch.tensor([len(x) for x in ro.completion_ids], dtype=torch.float32))
            # DAPO Eq. 11 keeps a group iff 0 < #correct < G: filter on correctness, not the overlong-shaped reward
            keep = gpu.dynamic_sampling_filter(ok, G) if dynamic else torch.ones(len(probs), dtype=bool)
            for g in torch.nonzero(keep).squeeze(1).tolist()[:P - len(probs_kept)]:
                kept.extend(ro.select(range(g * G, (g + 1) * G)))
                probs_kept.append(probs[g])
                rewards.append(r[g * G:(g + 1) * G])
                correct.append(ok[g * G:(g + 1) * G])
            if len(probs_kept) >= P:
                break
        info = {"generated": generated, "rounds": rnd + 1, "sampled_accuracy": float(torch.cat(all_correct).mean()),
                "sampled_reward": float(torch.cat(all_rewards).mean()),
                "malformed": float(torch.cat(all_bad).mean()),
                "verify_timeouts": self.verifier.timeouts - timeouts0,
                **rollout_metrics(torch.cat(all_lens), torch.cat(all_correct), torch.cat(all_rewards), G,
                                  len(probs_kept) * G)}
        if not probs_kept:
            return kept, probs_kept, torch.zeros(0), torch.zeros(0), info
        return kept, probs_kept, torch.cat(rewards), torch.cat(correct), info

    # -- advantages -------------------------------------------------------------------------------------------
    def _advantages(self, rewards, probs, batch, old_logp, ref_logp):
        c, G = self.cfg, self.cfg.rollout.group_size
        kind = c.advantage
        if kind == "gae":
            with torch.no_grad(), self.autocast:
                old_values = completion_values(self.value, batch).float()
            tok_r = last_token_rewards(rewards, batch.mask)
            if self.ref is not None and c.algo.kl_reward_coef > 0:
                tok_r = tok_r - c.algo.kl_reward_coef * gpu.kl(old_logp, ref_logp, "k1") * batch.mask
            adv, returns = gpu.gae(tok_r, old_values, batch.mask, c.algo.gamma, c.algo.lam)
            return adv, old_values, returns
        if kind.startswith("reinforce_pp"):  # token returns with k1 in the reward, whitened over the batch
            beta = c.algo.kl_reward_coef if self.ref is not None else 0.0
            adv = gpu.reinforce_pp_advantages(rewards, batch.mask, logp=old_logp, ref_logp=ref_logp, beta=beta,
                                              group_size=G, baseline=kind == "reinforce_pp_baseline",
                                              gamma=c.algo.gamma)
            return adv, None, None
        if kind == "sas":
            seq = self.sas([p.id for p in probs], rewards, G)
        else:
            seq = gpu.group_advantages(rewards, G, kind=kind, unbiased=c.algo.unbiased_std)
        return seq[:, None] * batch.mask, None, None

    # -- forward passes ---------------------------------------------------------------------------------------
    def _no_grad_pass(self, model, batch):
        """(logp, entropy) [B, L-1] of the whole batch under ``model``, in one forward pass."""
        with torch.no_grad(), self.autocast:
            lp, ent = token_logprobs(model, batch, self.cfg.train.logprob_chunk, self.cfg.rollout.temperature)
        return lp.float(), ent.float()

    def _groups_split(self, n_groups, gen):
        """Minibatches (lists of micro-batches of row indices) over a shuffled group order."""
        c, G = self.cfg, self.cfg.rollout.group_size
        per_mb = (c.train.minibatch_size // G) if c.train.minibatch_size else n_groups
        order = torch.randperm(n_groups, generator=gen).tolist()
        mbs = []
        for s in range(0, n_groups, per_mb):
            groups = order[s:s + per_mb]
            k = max(1, len(groups) // c.train.grad_accum)
            micro = [groups[j:j + k] for j in range(0, len(groups), k)]
            mbs.append([torch.tensor([g * G + i for g in m for i in range(G)]) for m in micro])
        return mbs

    # -- one step ---------------------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One RL step; returns its metrics (also appended to metrics.jsonl)."""
        c = self.cfg
        t0 = time.perf_counter()
        ro, probs, rewards, correct, info = self._rollout()
        t_roll = time.perf_counter() - t0
        m = {"step": self.step + 1, "reward": info.pop("sampled_reward"), "accuracy": info.pop("sampled_accuracy"),
             "trained": len(ro), **info}
        gen_tokens = sum(map(len, ro.completion_ids))
        if probs:
            m.update(self._update(ro, probs, rewards, correct))
        t_train = time.perf_counter() - t0 - t_roll
        if probs:
            t1 = time.perf_counter()
            self.engine.update(self.sampler)
            m["weight_sync_s"] = time.perf_counter() - t1
        self.step += 1
        dt = time.perf_counter() - t0
        m.update({"rollout_s": t_roll, "train_s": t_train, "step_time_s": dt,
                  "gen_tokens_per_s": gen_tokens / max(t_roll, 1e-9),
                  "tokens_per_s": m.get("tokens", 0) / max(dt, 1e-9),
                  "peak_mem_mb": _peak_mem_mb(self.dev)})
        ckpt.append_metrics(self.out, m)
        self.loggers.log(m)
        if self.step % c.run.save_every == 0 or self.step == c.run.steps:
            self.save()
        return m

    def _update(self, ro, probs, rewards, correct) -> dict:
        """train.epochs passes over the batch in minibatches, one optimiser update each. pi_old is the sampler's
        (or with train.old_logp 'policy', the policy's before its first update): one forward pass over the batch,
        skipped when the only update is made by that policy itself, whose log-probs it then reads from that
        update's own pass."""
        c, G = self.cfg, self.cfg.rollout.group_size
        batch = build_batch(ro, self.tok.pad_token_id, self.dev)
        if c.algo.overlong_filter:
            batch.mask = overlong_filter_mask(ro.truncated, batch.mask)
        n_groups = len(probs)
        gen = torch.Generator().manual_seed(c.run.seed * 7919 + self.step)
        plan = [self._groups_split(n_groups, gen) for _ in range(c.train.epochs)]
        n_updates = sum(map(len, plan))
        old_model = self.sampler if c.train.old_logp == "sampler" else self.model
        single_update = n_updates == 1 and old_model is self.model
        t0 = time.perf_counter()
        old_logp, old_ent = (None, None) if single_update else self._no_grad_pass(old_model, batch)
        ref_logp = self._no_grad_pass(self.ref, batch)[0] if self.ref is not None else None
        if c.algo.name == "dpo":
            return self._dpo_update(batch, rewards, correct, ref_logp)
        if old_logp is None and (c.advantage == "gae" or c.advantage.startswith("reinforce_pp")):
            old_logp, old_ent = self._no_grad_pass(self.model, batch)
        # the step's time apart from generation: the passes without gradient (pi_old, pi_ref) and the optimiser
        timings = {"old_logp_s": time.perf_counter() - t0, "optimizer_s": 0.0}
        adv, old_values, returns = self._advantages(rewards, probs, batch, old_logp, ref_logp)
        stats, first_logp, first_ent = [], torch.zeros_like(batch.mask), torch.zeros_like(batch.mask)
        hp = resolve_hparams(c.algo.name, self.hp)
        clips, agg = StepClips(c.algo.name, hp), hp["agg"]
        if self.sampler is self.model:
            self.sampler_at = self.updates
        start, staleness = self.updates, self.updates - self.sampler_at
        # the sampler of the next batch: the policy train.staleness updates behind this batch's last one
        snapshot_at = n_updates - min(c.train.staleness, n_updates)
        if self.sampler is not self.model and snapshot_at == 0:
            self._sync_sampler()
        for epoch, mbs in enumerate(plan):
            for micro in mbs:
                on_policy = self.updates == start and staleness == 0  # the policy is still this batch's sampler
                # each micro-batch weighs its share of the minibatch's aggregation units: exact accumulation
                mb_mask = batch.mask[torch.cat(micro)]
                total = agg_units(mb_mask, agg, G).clamp(min=1.0)
                v_total = agg_units(mb_mask, "token_mean").clamp(min=1.0)
                for idx in micro:
                    sub = batch.rows(idx)
                    with self.autocast:
                        logp, entropy = token_logprobs(self.model, sub, c.train.logprob_chunk, c.rollout.temperature)
                    logp = logp.float()
                    old = logp.detach() if old_logp is None else old_logp[idx, :logp.shape[1]]
                    T = logp.shape[1]
                    ref = ref_logp[idx, :T] if ref_logp is not None else None
                    # the engine's log-probs for a rollout correction (TIS / MIS on the engine/trainer gap), and
                    # a fresh, reproducible seed for Clip-Cov's random choice
                    extra = {"rollout_logp": sub.engine_logp[:, :T]} if self.hp.get("rollout_correction") else {}
                    if ALGORITHMS[c.algo.name].select == "clip_cov":
                        extra["cov_seed"] = int(torch.randint(2**31 - 1, (1,), generator=gen))
                    loss, st = gpu.policy_loss(c.algo.name, logp, old, adv[idx, :T], sub.mask, group_size=G,
                                               ref_logp=ref, **{**self.hp, **extra})
                    if self.value is not None:
                        with self.autocast:
                            v = completion_values(self.value, sub).float()
                        vloss, vst = gpu.value_loss(v, old_values[idx, :T], returns[idx, :T], sub.mask,
                                                    clip=c.algo.value_clip)
                        st = {**st, "value_loss": float(vloss.detach()), "value_clip_frac": vst["clip_frac"]}
                    weighted = loss * agg_units(sub.mask, agg, G) / total
                    if self.value is not None:
                        weighted = weighted + vloss * agg_units(sub.mask, "token_mean") / v_total
                        loss = loss + vloss
                    weighted.backward()
                    clips.add(logp, old, adv[idx, :T], sub.mask, on_policy=on_policy)
                    st["loss"] = float(loss.detach())
                    stats.append(st)
                    if epoch == 0:
                        first_logp[idx, :T] = logp.detach()
                        first_ent[idx, :T] = entropy.detach().float()
                t0 = time.perf_counter()
                st = self._optim_step()
                timings["optimizer_s"] += time.perf_counter() - t0
                stats[-1].update(st)
                self.updates += 1
                if self.sampler is not self.model and self.updates - start == snapshot_at:
                    self._sync_sampler()
        ent = first_ent if old_ent is None else old_ent
        return {**self._step_metrics(batch, ro, rewards, correct, adv, stats, ent, first_logp, old_logp, ref_logp),
                **clips.summary(), "updates_per_batch": n_updates, "staleness": staleness, **timings}

    def _sync_sampler(self) -> None:
        """The sampler takes the trained model's current weights (train.staleness > 0)."""
        with torch.no_grad():
            for dst, src in zip(self.sampler.parameters(), self.model.parameters()):
                dst.copy_(src)
        self.sampler_at = self.updates

    def _optim_step(self) -> dict:
        c = self.cfg
        norm = torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad],
                                              c.train.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        out = {"grad_norm": float(norm)}
        if self.vopt is not None:
            torch.nn.utils.clip_grad_norm_(self.value.parameters(), c.train.max_grad_norm)
            self.vopt.step()
            self.vopt.zero_grad(set_to_none=True)
        return out

    def _dpo_update(self, batch, rewards, correct, ref_logp) -> dict:
        """DPO on pairs from each group: its best response (chosen) against its worst (rejected)."""
        c, G = self.cfg, self.cfg.rollout.group_size
        pairs = []
        for g in range(len(rewards) // G):
            r = rewards[g * G:(g + 1) * G]
            if r.max() > r.min():
                pairs.append((g * G + int(r.argmax()), g * G + int(r.argmin())))
        m = {"reward_mean": float(rewards.mean()), "accuracy_trained": float(correct.mean()), "pairs": len(pairs),
             "rur": 2 * len(pairs) / len(rewards), "tokens": int(batch.mask.sum())}
        if not pairs:
            return m
        ref_seq = (ref_logp * batch.mask).sum(1)
        stats = []
        for _ in range(c.train.epochs):
            idx = torch.tensor([i for p in pairs for i in p])
            sub = batch.rows(idx)
            with self.autocast:
                logp, ent = token_logprobs(self.model, sub, c.train.logprob_chunk, c.rollout.temperature)
            seq = (logp.float() * sub.mask).sum(1)
            loss, st = gpu.dpo_loss(seq[0::2], seq[1::2], ref_seq[idx[0::2]], ref_seq[idx[1::2]], beta=c.algo.dpo_beta)
            loss.backward()
            st.update(self._optim_step(), loss=float(loss.detach()))
            stats.append(st)
        gap = logprob_gap(sub.engine_logp, logp.detach().float(), sub.mask)
        m.update({k: _mean([s[k] for s in stats]) for k in stats[0]}, **gap,
                 entropy=float((ent.detach() * sub.mask).sum() / sub.mask.sum()))
        return m

    def _step_metrics(self, batch, ro, rewards, correct, adv, stats, ent, first_logp, old_logp, ref_logp) -> dict:
        """``ent``: the sampler's per-token entropy [B, T] on the step's responses."""
        mask = batch.mask
        old = first_logp if old_logp is None else old_logp
        lens = torch.tensor([len(x) for x in ro.completion_ids], dtype=torch.float32)
        seq_adv = (adv.abs() * mask).sum(1)
        m = {"reward_mean": float(rewards.mean()), "accuracy_trained": float(correct.mean()),
             "rur": float((seq_adv > 1e-8).float().mean()), "entropy": _masked_mean(ent, mask),
             "entropy_relevant": (None if self.relevant is None else
                                  _masked_mean(ent, mask * torch.isin(batch.input_ids[:, 1:], self.relevant))),
             "len_mean": float(lens.mean()), "len_max": float(lens.max()),
             "truncated_frac": float(np.mean(ro.truncated)), "tokens": int(mask.sum())}
        n_tok = [s["tokens"] for s in stats if "clip_frac" in s]
        if sum(n_tok):  # the simulator's clip_frac: token-weighted over the step's updates
            m["tcr"] = float(np.dot([s["clip_frac"] for s in stats if "clip_frac" in s], n_tok) / sum(n_tok))
        m["cov_logp_adv"] = batch_cov(old, adv, mask)
        for k in ("loss", "ratio_mean", "grad_norm", "value_loss", "value_clip_frac", "kl_mean",
                  "trunc_frac", "cov_frac", "rc_weight_mean", "rc_cut_frac"):
            vals = [s[k] for s in stats if k in s]
            if vals:
                m[k] = _mean(vals)
        m.update(logprob_gap(batch.engine_logp, old, mask))
        if ref_logp is not None:
            m["kl_ref"] = float((gpu.kl(old, ref_logp, "k3") * mask).sum() / mask.sum().clamp(min=1))
        return m

    # -- the loop ---------------------------------------------------------------------------------------------
    def fit(self) -> Path:
        """Train until ``run.steps``; returns the run folder."""
        from tqdm import tqdm
        bar = tqdm(total=self.cfg.run.steps, initial=self.step, disable=not self.cfg.run.progress, desc="train")
        try:
            while self.step < self.cfg.run.steps:
                m = self.train_step()
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward']:.3f}", acc=f"{m['accuracy']:.2f}", s=f"{m['step_time_s']:.1f}")
        finally:
            bar.close()
            self.close()
        return self.out


def gpu_beta(cfg: Config) -> float:
    """The KL weight the policy loss will use (registry default unless overridden)."""
    if cfg.algo.name == "dpo":
        return 0.0
    from spec.registry import ALGORITHMS
    return float(cfg.loss_hparams().get("beta", ALGORITHMS[cfg.algo.name].defaults["beta"]))


def prompt_budget(cfg: Config, context: int | None) -> int:
    """The most tokens a prompt may have: ``data.max_prompt_tokens``, at most the engine's context (the model's
    positions, or vLLM's max_model_len) less ``rollout.max_new_tokens``, which is the default."""
    limit = cfg.data.max_prompt_tokens
    if context is None:
        if limit is None:
            raise ValueError("data.max_prompt_tokens: the model does not state its context length "
                             "(max_position_embeddings); set a limit")
        return limit
    room = context - cfg.rollout.max_new_tokens
    if room < 1:
        raise ValueError(f"rollout.max_new_tokens: expected less than the context of {context} tokens, got "
                         f"{cfg.rollout.max_new_tokens}")
    if limit is not None and limit > room:
        raise ValueError(f"data.max_prompt_tokens: expected at most {room} (a context of {context} tokens less "
                         f"rollout.max_new_tokens), got {limit}")
    return room if limit is None else limit


def _masked_mean(x, mask) -> float | None:
    """The mean of ``x`` over the tokens ``mask`` holds (None when it holds none)."""
    n = float(mask.sum())
    return float((x * mask).sum()) / n if n else None




def train(cfg: Config, engine=None, allow_config_change: bool = False) -> Path:
    """Run (or resume) the training described by ``cfg``; returns the run folder with metrics.jsonl."""
    return Trainer(cfg, engine=engine, allow_config_change=allow_config_change).fit()
