"""A shared-parameter toy LM: a log-linear policy over fixed context features, shared by every prompt and position.

``logits(c) = b(c) + phi(c) @ theta``: ``theta`` [F, V] is trained from 0, ``b`` is the frozen "pretrained" prior
(the log-linear / softmax policy of Cui et al. 2505.22617 Sec. 2, with features). An update from one prompt moves
every context whose features overlap: the bias, the position, the on/off-track flag and random directions.

A response is ``answer_len`` (K) answer tokens, then EOS. The prior is Zipfian over the vocabulary (token 0 is EOS)
plus a confident dominant token per context. At the prompt's ``forks`` forking positions ``n_correct`` tokens are
acceptable: the dominant token is wrong and the acceptable ones sit ``delta_p`` nats from it, delta spread from
hopeless (``difficulty_low``) to easy (``difficulty_high``). Every other answer position is free: any token but EOS
keeps the answer on track (so most of the entropy is among correct continuations, as in an LM). A wrong token leaves the
answer: the response continues in off-track contexts (shared by prompts, one per position) until EOS (wrong) or
``max_len`` (truncated: malformed). EOS before position K ends a short, wrong answer.

Rows of the logit table: on-track context (p, t <= K) is row p (K + 1) + t; off-track position t is row
P (K + 1) + t. Exact expectations come from a forward recursion over positions of the on- and off-track masses.
"""
from __future__ import annotations

import numpy as np

from .tabular import CORRECT, MALFORMED, WRONG, Rollout, Snapshot, tables, token_logit_grad, xlogx

EOS = 0


class FeatureLM:
    """The environment and its log-linear policy; ``theta`` is the trained parameter array."""

    def __init__(self, n_prompts=256, vocab=128, answer_len=4, max_len=8, n_correct=2, forks=2, n_features=32,
                 zipf=1.1, confidence=2.0, difficulty_low=-8.0, difficulty_high=4.0, env_seed=0):
        if max_len < answer_len + 1:
            raise ValueError(f"max_len: expected at least answer_len + 1 ({answer_len + 1}), got {max_len}")
        if n_correct + 2 > vocab:
            raise ValueError(f"n_correct: expected at most vocab - 2 ({vocab - 2}), got {n_correct}")
        if forks > answer_len:
            raise ValueError(f"forks: expected at most answer_len ({answer_len}), got {forks}")
        rng = np.random.default_rng(env_seed)
        P, K, T, V = n_prompts, answer_len, max_len, vocab
        self.P, self.K, self.T, self.vocab = P, K, T, V
        self.n_prompts = P
        self.off0 = P * (K + 1)
        self.n_rows = self.off0 + T
        # the prior: a Zipf background over the non-EOS tokens (one global ranking) plus a dominant token per row
        rank = np.empty(V - 1)
        rank[rng.permutation(V - 1)] = np.arange(1, V)
        zipf_p = rank ** -zipf / (rank ** -zipf).sum()
        base = np.zeros((self.n_rows, V))
        base[:, 1:] = -zipf * np.log(rank) + 0.5 * rng.standard_normal((self.n_rows, V - 1))
        dominant = 1 + rng.choice(V - 1, size=self.n_rows, p=zipf_p)
        base[np.arange(self.n_rows), dominant] = confidence
        pos = np.concatenate([np.tile(np.arange(K + 1), P), np.arange(T)])
        on_track = np.arange(self.n_rows) < self.off0
        base[:, EOS] = np.where(on_track, np.where(pos == K, confidence + 3.0, -2.0), confidence - 2.0 + pos - K)
        # acceptable tokens: the dominant one and synonyms, except at forks where the dominant token is wrong
        self.delta = rng.permutation(np.linspace(difficulty_low, difficulty_high, P))
        self.accept = np.zeros((P, K, V))
        fork = np.zeros((P, K), dtype=bool)
        for p in range(P):
            fork[p, rng.choice(K, size=forks, replace=False)] = True
            for k in range(K):
                row = p * (K + 1) + k
                others = 1 + rng.choice(V - 1, size=n_correct + 1, replace=False)
                others = [v for v in others if v != dominant[row]][:n_correct]
                if fork[p, k]:
                    good = others
                    base[row, good] = confidence + self.delta[p] - 2.0 * (np.arange(len(good)) > 0)
                else:  # a free position: every token but EOS keeps the answer on track
                    good = np.arange(1, V)
                self.accept[p, k, good] = 1.0
        self.fork = fork
        self.base = base
        # features: bias, position one-hot, on-track flag, random unit directions
        rand = rng.standard_normal((self.n_rows, n_features))
        rand /= np.linalg.norm(rand, axis=1, keepdims=True)
        self.phi = np.concatenate([np.ones((self.n_rows, 1)), np.eye(T)[pos], on_track[:, None].astype(float),
                                   rand], axis=1)
        self.init = np.zeros((self.phi.shape[1], V))
        self.ref = tables(base)[0]
        self.info = {"delta": self.delta, "fork": fork}

    # ---- the policy ---------------------------------------------------------------------------------------
    def logits(self, theta: np.ndarray, rows=None) -> np.ndarray:
        """b(c) + phi(c) theta for ``rows`` (all rows if None)."""
        if rows is None:
            return self.base + self.phi @ theta
        return self.base[rows] + self.phi[rows] @ theta

    def rows(self, theta, states, tokens, mask):
        """log pi(a_t | c_t) [B, T] of the response tokens, and pi of their rows."""
        on = mask > 0
        logp_rows, pi_rows = tables(self.logits(theta, states[on]))
        logp = np.zeros(mask.shape)
        logp[on] = logp_rows[np.arange(len(pi_rows)), tokens[on]]
        return logp, pi_rows

    def grad(self, theta, states, tokens, mask, pi_rows, grad_logp):
        """d loss / d theta = sum_t phi(c_t)^T d loss / d z(c_t) (chain rule through the log-linear logits)."""
        return self.phi[states[mask > 0]].T @ token_logit_grad(tokens, mask, pi_rows, grad_logp)

    def ref_logp(self, states, tokens, mask):
        return np.where(mask > 0, self.ref[states, tokens], 0.0)

    # ---- sampling -----------------------------------------------------------------------------------------
    def sampler(self, theta):
        """What ``sample`` draws from: the parameters (rows are computed for the drawn prompts only)."""
        return theta

    def sample(self, theta, prompts, group_size, rng) -> Rollout:
        """G responses per prompt, vectorised over the batch; rows of one prompt contiguous."""
        prompts = np.asarray(prompts)
        K, T = self.K, self.T
        on_rows = (prompts[:, None] * (K + 1) + np.arange(K + 1)).reshape(-1)
        logp_t, pi_t = tables(self.logits(theta, np.concatenate([on_rows, self.off0 + np.arange(T)])))
        cdf = np.cumsum(pi_t, axis=1)
        cdf[:, -1] = 1.0
        batch = len(prompts) * group_size
        who = np.repeat(np.arange(len(prompts)), group_size)
        pid = prompts[who]
        alive, on = np.ones(batch, dtype=bool), np.ones(batch, dtype=bool)
        states = np.zeros((batch, T), dtype=np.int64)
        tokens = np.zeros((batch, T), dtype=np.int64)
        mask = np.zeros((batch, T))
        old_logp = np.zeros((batch, T))
        outcome = np.full(batch, MALFORMED, dtype=np.int64)
        u = rng.random((batch, T))
        for t in range(T):
            rows = np.flatnonzero(alive)
            if rows.size == 0:
                break
            track = on[rows]
            local = np.where(track, who[rows] * (K + 1) + min(t, K), len(on_rows) + t)
            tok = np.minimum((u[rows, t, None] > cdf[local]).sum(1), self.vocab - 1)
            states[rows, t] = np.where(track, pid[rows] * (K + 1) + min(t, K), self.off0 + t)
            tokens[rows, t], mask[rows, t], old_logp[rows, t] = tok, 1.0, logp_t[local, tok]
            end = tok == EOS
            outcome[rows[end]] = np.where(track[end] & (t == K), CORRECT, WRONG)
            ok = self.accept[pid[rows], min(t, K - 1), tok] > 0 if t < K else np.zeros(len(rows), dtype=bool)
            on[rows] = track & ok
            alive[rows[end]] = False
        return Rollout(prompts, states, tokens, mask, old_logp, outcome, mask.sum(1).astype(np.int64), alive.copy())

    # ---- exact expectations -------------------------------------------------------------------------------
    def masses(self, pi):
        """Forward recursion: o[p, t] on-track and f[p, t] off-track probability of emitting token t."""
        P, K, T = self.P, self.K, self.T
        pi_on = pi[:self.off0].reshape(P, K + 1, -1)
        acc = (pi_on[:, :K] * self.accept).sum(-1)
        eos_on, eos_off = pi_on[:, :, EOS], pi[self.off0:, EOS]
        o, f = np.zeros((P, K + 1)), np.zeros((P, T))
        o[:, 0] = 1.0
        for t in range(T - 1):
            leave = 0.0
            if t < K:
                o[:, t + 1] = o[:, t] * acc[:, t]
                leave = o[:, t] * (1.0 - acc[:, t] - eos_on[:, t])
            elif t == K:
                leave = o[:, K] * (1.0 - eos_on[:, K])
            f[:, t + 1] = f[:, t] * (1.0 - eos_off[t]) + leave
        return o, f, acc, o[:, K] * eos_on[:, K]

    def snapshot(self, theta) -> Snapshot:
        """Exact metrics of the policy ``theta`` over the pool (each prompt equally likely)."""
        P, K = self.P, self.K
        z = self.logits(theta)
        logp, pi = tables(z)
        ent = -(pi * logp).sum(1)
        kl = (pi * (logp - self.ref)).sum(1)
        o, f, acc, success = self.masses(pi)
        eos = pi[:, EOS]
        decision = -(xlogx(eos) + xlogx(1.0 - eos))
        dec_on = decision[:self.off0].reshape(P, K + 1).copy()
        eos_on = eos[:self.off0].reshape(P, K + 1)[:, :K]
        dec_on[:, :K] = -(xlogx(acc) + xlogx(eos_on) + xlogx(np.maximum(1.0 - acc - eos_on, 0.0)))
        weight = np.concatenate([o.reshape(-1), f.sum(0)])
        per_prompt_tokens = o.sum(1) + f.sum(1)
        total = weight.sum()
        weight = weight / total
        prompt_entropy = ((o * ent[:self.off0].reshape(P, K + 1)).sum(1) + f @ ent[self.off0:]) / per_prompt_tokens
        # entropy among the acceptable tokens of answer positions reached on track
        pl_on = (pi * logp)[:self.off0].reshape(P, K + 1, -1)[:, :K]
        h_good = -(pl_on * self.accept).sum(-1) / np.maximum(acc, 1e-300) + np.log(np.maximum(acc, 1e-300))
        accuracy = float(success.mean())
        tokens = total / P
        values = {"accuracy_exact": accuracy, "entropy": float(weight @ ent), "kl_ref": float(weight @ kl),
                  "len_wrong_exact": (tokens - (K + 1) * accuracy) / (1 - accuracy) if accuracy < 1 else None,
                  "entropy_decision": float(weight @ np.concatenate([dec_on.reshape(-1), decision[self.off0:]])),
                  "entropy_correct": float((o[:, :K] * h_good).sum() / o[:, :K].sum())}
        values["entropy_within"] = values["entropy"] - values["entropy_decision"]
        return Snapshot(z, logp, pi, weight, success, prompt_entropy, values)
