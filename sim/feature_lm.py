"""A shared-parameter toy LM: a log-linear policy over fixed context features, shared by every prompt and position.

``logits(c) = b(c) + phi(c) @ theta``: ``theta`` [F, V] is trained from 0, ``b`` is the frozen "pretrained" prior
(the log-linear / softmax policy of Cui et al. 2505.22617 Sec. 2, with features). An update from one prompt moves
every context whose features overlap: the bias, the position, the on/off-track flag and random directions.

The format decision, EOS or not, has its own parameters, as an instruct model's format is robust to what RL
teaches about the task: pi(EOS | c) = sigmoid(f(c)) and the other tokens share 1 - pi(EOS) by the softmax of their
logits (a two-level softmax, Morin and Bengio 2005). The format logit f(c) = f_0(c) + theta[slot(c), EOS] has one
parameter per format slot (on track at position t, off track at position t), which the task features do not
drive; the task features drive the other tokens only. As one softmax: z_EOS = f(c) + logsumexp_{v != EOS} z_v(c),
so ``theta``'s EOS column is read on the slot features and its other columns on the task features (the rest of
``theta`` stays 0: ``trained`` masks its gradient). ``f_0`` keeps the prior's EOS probability: at theta = 0 the
policy is ``softmax(b)``. Without this split, the tokens RL pushes up through shared features (bias, position,
random directions) rose in off-track contexts too, until a wrong answer no longer ended: 65-83% of responses were
truncated by step 45 under a binary reward.

A response is ``answer_len`` (K) answer tokens, then EOS. The prior is Zipfian over the vocabulary (token 0 is EOS;
one global ranking of the other tokens) plus a confident dominant token per context, drawn from the Zipf head. Each
answer position accepts ``n_correct`` tokens; any other keeps the response going off track. At an ordinary position
the dominant token is acceptable and its ``n_correct - 1`` synonyms are uniform draws from the vocabulary (mostly
the Zipf tail: correct but improbable). At the prompt's ``forks`` forking positions the dominant token is wrong:
the acceptable tokens are drawn from a pool of ``4 n_correct`` improbable tokens shared by all prompts (Zipf ranks
from 8 on, the "exploration tokens"); the first sits ``delta_p`` nats from the dominant one (delta spread from
hopeless, ``difficulty_low``, to easy, ``difficulty_high``), the others keep their Zipf logit. Suppressing the tail
through the shared parameters makes every prompt surer and cuts the improbable alternatives that hard prompts need.
A wrong token leaves the answer: the response continues in off-track contexts (shared by prompts, one per position)
until EOS (wrong) or ``max_len`` (truncated: malformed). EOS before position K ends a short, wrong answer. The
policy starts as an instruct model does, well formatted: off track, EOS sits ``offtrack_eos`` nats above the
dominant token at position K (one more per later position), so a wrong answer ends and almost none is truncated
(``malformed_exact`` at step 0 about 5e-10 at the defaults), and it stays so under RL: the format decision has its
own parameters (above).

Rows of the logit table: on-track context (p, t <= K) is row p (K + 1) + t; off-track position t is row
P (K + 1) + t. Exact expectations come from a forward recursion over positions of the on- and off-track masses.

``FeatureLM.stack`` stacks independent policies (one per simulated seed), each in its own environment draw or in
a shared one: the parameters are the copies' ``theta`` one under the other, copy c's contexts and prompts are
numbered from c R and c P (R contexts, P prompts) and its prior, features and acceptable tokens are its draw's, and
``rows`` and ``grad`` serve every copy's tokens in one call.
"""
from __future__ import annotations

import numpy as np

from spec.regime import EXPLORE_SETTINGS

from .tabular import (CORRECT, MALFORMED, WRONG, Rollout, Snapshot, distinct, dot, softmax_parts, tables, uniforms,
                      xlogx)

EOS = 0
#: The random features sit on a grid of 2^-PHI_BITS (|phi| <= 1), so that their products are exact in float64.
PHI_BITS = 12
#: Kinds of context, for the entropy's attribution: answer positions (ordinary, forking), the EOS decision after
#: the answer, and off-track contexts.
PARTS = ("ordinary", "fork", "end", "offtrack")
#: Where the tokens RL must raise sit (``explore``, spec.regime.EXPLORE_SETTINGS). "sharpening": ordinary answer
#: positions start about as sure of their dominant token as of its runners-up, and a fork's first acceptable token
#: carries its difficulty, so RL mostly raises tokens that are already likely. "exploration": the dominant token of
#: ordinary positions is SURE nats surer (near-certain: it cannot clip up), and a fork accepts 2 n_correct pool tokens
#: that share the mass of one at delta, so the tokens that rise are improbable ones (most up-clipped tokens have pi_old
#: < 0.2, DAPO 2503.14476 Fig. 3a).
SURE = 3.0


def fixed_point(x: np.ndarray, top: np.ndarray, bits: int) -> np.ndarray:
    """``x`` [n, V] as two fixed-point slices stacked [2, n, V] (hi, lo), hi + lo = x up to q 2^-bits / 2 per row:
    hi on the grid q = 2^(e - bits), |hi| <= 2^bits q, and lo on the grid q 2^-bits, |lo| <= q / 2, for ``top``
    (each row's bound on |x|, shared by the rows of one copy) < 2^e <= 2^1000. Each slice is rounded to its grid,
    ties to even, by adding and subtracting 1.5 * 2^52 grid steps (the sum's last bit is one step, as |slice| <
    2^51 steps), and the differences are exact, so are the slices (the error-free splitting of Ozaki, Ogita, Oishi
    and Rump 2012, Numer. Algorithms 59). Every operation is on whole contiguous arrays (NumPy is slower on a
    broadcast column)."""
    out = np.empty((2, *x.shape))
    hi, lo = out
    shift = np.repeat(np.ldexp(1.5, np.frexp(top)[1] + (52 - bits)), x.shape[1]).reshape(x.shape)  # 1.5 2^52 q
    np.add(x, shift, out=hi)
    hi -= shift
    np.subtract(x, hi, out=lo)
    shift *= 2.0 ** -bits
    lo += shift
    lo -= shift
    return out


def combine(products: np.ndarray) -> np.ndarray:
    """``phi @ x`` from ``phi @ (hi, lo)`` of ``fixed_point``'s slices [2, ...]: their sum, in that order."""
    return products[0] + products[1]


def padded(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of ``sizes`` rows (k of them, one after the other) laid out in a [k, m] grid, m the largest size:
    (each grid cell's row, row 0 in the padding; each row's flat cell), so one batched product serves every block."""
    sizes = np.asarray(sizes)
    k, m = len(sizes), int(sizes.max())
    block = np.repeat(np.arange(k), sizes)
    cell = block * m + np.arange(len(block)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    grid = np.zeros(k * m, dtype=np.intp)
    grid[cell] = np.arange(len(block))
    return grid.reshape(k, m), cell


def logsumexp(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log sum_v exp(z_v) of each row of ``z`` [n, V], stable (the row's maximum taken out first), and the rows'
    softmax from the same exponentials (as ``tables`` computes it)."""
    top = z.max(1)
    e = np.exp(z - top[:, None])
    total = e.sum(1)
    return top + np.log(total), e / total[:, None]


def product_bits(inner: int) -> int:
    """Bits of a slice such that ``inner`` products of phi (2^-PHI_BITS grid, |phi| <= 1) with slice integers,
    and every partial sum of them, are integers below 2^53 in one quantum: exact in float64 whatever order BLAS
    adds them in, so the product has the same bits under every BLAS kernel."""
    return 53 - PHI_BITS - int(np.ceil(np.log2(max(inner, 2))))


class FeatureLM:
    """The environment and its log-linear policy; ``theta`` is the trained parameter array."""

    def __init__(self, n_prompts=256, vocab=128, answer_len=4, max_len=8, n_correct=2, forks=2, n_features=32,
                 zipf=1.1, confidence=2.0, offtrack_eos=4.0, difficulty_low=-8.0, difficulty_high=4.0,
                 explore="sharpening", env_seed=0):
        if max_len < answer_len + 1:
            raise ValueError(f"max_len: expected at least answer_len + 1 ({answer_len + 1}), got {max_len}")
        if n_correct + 2 > vocab:
            raise ValueError(f"n_correct: expected at most vocab - 2 ({vocab - 2}), got {n_correct}")
        if forks > answer_len:
            raise ValueError(f"forks: expected at most answer_len ({answer_len}), got {forks}")
        if explore not in EXPLORE_SETTINGS:
            raise ValueError(f"explore: expected one of {', '.join(EXPLORE_SETTINGS)}, got {explore!r}")
        if explore == "exploration" and n_correct > (vocab - 2) // 2:
            raise ValueError(f"n_correct: explore=exploration (forks accept 2 n_correct tokens) needs at most "
                             f"(vocab - 2) // 2 ({(vocab - 2) // 2}), got {n_correct}")
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
        base[:, EOS] = np.where(on_track, np.where(pos == K, confidence + 3.0, -2.0), confidence + offtrack_eos + pos - K)
        # acceptable tokens: the dominant one and improbable synonyms; at forks the dominant is wrong and the
        # acceptable ones come from a shared pool of 4 n_correct improbable tokens (Zipf ranks from 8 on)
        size = min(4 * n_correct, V - 1)
        start = min(8, V - size)
        pool = 1 + np.flatnonzero((rank >= start) & (rank < start + size))
        self.delta = rng.permutation(np.linspace(difficulty_low, difficulty_high, P))
        self.accept = np.zeros((P, K, V))
        fork = np.zeros((P, K), dtype=bool)
        for p in range(P):
            fork[p, rng.choice(K, size=forks, replace=False)] = True
            for k in range(K):
                row = p * (K + 1) + k
                if fork[p, k]:
                    if explore == "exploration":  # twice as many, sharing the mass of one at delta
                        good = rng.choice(pool[pool != dominant[row]], size=2 * n_correct, replace=False)
                        base[row, good] = confidence + self.delta[p] - np.log(2 * n_correct)
                    else:
                        good = rng.choice(pool[pool != dominant[row]], size=n_correct, replace=False)
                        base[row, good[0]] = confidence + self.delta[p]
                else:
                    others = 1 + rng.choice(V - 1, size=n_correct, replace=False)
                    good = np.concatenate([[dominant[row]], others[others != dominant[row]][:n_correct - 1]])
                self.accept[p, k, good] = 1.0
        if explore == "exploration":
            ordinary = np.flatnonzero(np.concatenate([~fork, np.zeros((P, 1), dtype=bool)], axis=1).reshape(-1))
            base[ordinary, dominant[ordinary]] += SURE
        self.fork = fork
        self.base = base
        on_part = np.concatenate([fork.astype(np.int64), np.full((P, 1), 2)], axis=1).reshape(-1)
        self.part = np.concatenate([on_part, np.full(T, 3)])  # index into PARTS of each row
        # features: bias, position one-hot, on-track flag, random unit directions
        rand = rng.standard_normal((self.n_rows, n_features))
        rand = np.rint(rand / np.linalg.norm(rand, axis=1, keepdims=True) * 2.0 ** PHI_BITS) / 2.0 ** PHI_BITS
        task = np.concatenate([np.ones((self.n_rows, 1)), np.eye(T)[pos], on_track[:, None].astype(float), rand],
                              axis=1)
        # format slots: on track at position t (0..K), off track at position t (K + 1 + t)
        slot = np.where(on_track, pos, K + 1 + pos)
        self.phi = np.concatenate([task, np.eye(K + 1 + T)[slot]], axis=1)
        self.copies, self.n_states, self.n_features = 1, self.n_rows, self.phi.shape[1]
        # theta's parameters (1): the task rows of the non-EOS columns and the slot rows of the EOS column
        self.trained = np.zeros((self.n_features, V))
        self.trained[:task.shape[1], EOS + 1:] = 1.0
        self.trained[task.shape[1]:, EOS] = 1.0
        self.lse_base = logsumexp(base[:, EOS + 1:])[0]  # f_0(c) = b(c, EOS) - lse_base(c)
        # slices of theta (a product over the features) and of a gradient (a product over one copy's contexts)
        self.theta_bits, self.grad_bits = product_bits(self.n_features), product_bits(self.n_rows)
        self.init = np.zeros((self.n_features, V))
        self.ref = tables(base)[0]
        self.info = {"delta": self.delta, "fork": fork}

    @classmethod
    def stack(cls, draws: list[FeatureLM]) -> FeatureLM:
        """One environment of ``len(draws)`` copies, copy c in ``draws[c]``'s environment (one draw each, built
        with the same sizes; a draw may repeat): the per-context arrays (prior, features, reference, kinds) one
        copy under the other, the per-prompt ones (acceptable tokens, difficulty, forks) likewise."""
        first = draws[0]
        sizes = ("P", "K", "T", "vocab", "n_features")
        if any(getattr(d, k) != getattr(first, k) for d in draws for k in sizes):
            raise ValueError("draws: expected environment draws of the same sizes (" + ", ".join(sizes) + ")")
        out = cls.__new__(cls)
        out.__dict__.update(vars(first))
        for name in ("base", "phi", "ref", "part", "accept", "delta", "fork", "trained", "lse_base"):
            setattr(out, name, np.concatenate([getattr(d, name) for d in draws]))
        out.copies, out.n_states = len(draws), len(draws) * first.n_rows
        out.init = np.zeros((len(draws) * first.n_features, first.vocab))
        out.info = {"delta": out.delta, "fork": out.fork}
        return out

    # ---- the policy ---------------------------------------------------------------------------------------
    def logits(self, theta: np.ndarray, rows=None, copy: int = 0) -> np.ndarray:
        """b(c) + phi(c) theta of one copy's ``theta`` for that copy's local ``rows`` (all rows if None)."""
        local = np.arange(self.n_rows) if rows is None else np.asarray(rows)
        return self._logits(theta, self._layout([(0, copy * self.n_rows + local)]))[0]

    def _copy(self, theta, c):
        """Copy c's ``theta`` in the stacked parameters."""
        return theta[c * self.n_features:(c + 1) * self.n_features]

    def _by_copy(self, ids):
        """Sorted stacked context ids -> (copy, its slice of ``ids``) for each copy present."""
        cuts = np.searchsorted(ids, np.arange(self.copies + 1) * self.n_rows)
        return [(c, slice(a, b)) for c, (a, b) in enumerate(zip(cuts, cuts[1:])) if b > a]

    @staticmethod
    def _layout(blocks) -> tuple:
        """(copies, stacked context ids, ``padded`` grid and cells) of ``blocks``, each a (copy c of ``theta``, its
        stacked context ids) one under the other: where ``_logits`` and ``grad`` find each copy's rows."""
        return ([c for c, _ in blocks], np.concatenate([r for _, r in blocks]),
                *padded([len(r) for _, r in blocks]))

    def _logits(self, theta, layout) -> tuple[np.ndarray, np.ndarray]:
        """The logits of the rows of ``layout`` (``_layout``), each copy with its own ``theta``: phi theta by
        fixed-point slices (``fixed_point``, split once for every copy, one quantum per copy) with one batched BLAS
        product over the copies (``padded``), the same bits on every CPU; then EOS's logit set from the format
        logit, z_EOS = f + logsumexp of the other tokens' logits. Also the softmax of the other tokens' logits.
        ``layout`` may instead be one copy's number, ``theta`` its alone: every row of that copy, in order, read in
        place (the same values as through a layout of them)."""
        F, V = self.n_features, self.vocab
        top = np.abs(theta).reshape(len(theta) // F, -1).max(1)
        parts = fixed_point(theta, np.repeat(top, F), self.theta_bits).reshape(2, -1, F, V)
        if isinstance(layout, int):
            rows = slice(layout * self.n_rows, (layout + 1) * self.n_rows)
            z = combine(np.matmul(self.phi[rows], parts[:, 0]))
            z += self.base[rows]
        else:
            copies, rows, grid, cell = layout
            if copies != list(range(parts.shape[1])):
                parts = parts[:, copies]
            products = combine(np.matmul(self.phi[rows[grid]], parts)).reshape(-1, V)
            z = self.base[rows] + products[cell]
        lse, q = logsumexp(z[:, EOS + 1:])
        z[:, EOS] += lse - self.lse_base[rows]
        return z, q

    def rows(self, theta, states, tokens, mask):
        """log pi(a_t | c_t) [B, T] of the response tokens, and (contexts visited, token -> context, their pi(EOS),
        the softmax of their non-EOS logits): the softmax is computed once per distinct context, the logits copy by
        copy."""
        on = mask > 0
        uniq, inv = distinct(states[on], self.n_states)
        blocks = self._by_copy(uniq)
        layout = self._layout([(c, uniq[part]) for c, part in blocks])
        z, q = self._logits(theta, layout)
        shifted, e, total = softmax_parts(z)  # only the tokens' entries of log pi, and pi(EOS), are read
        logp = np.zeros(mask.shape)
        logp[on] = shifted[inv, tokens[on]] - np.log(total)[inv]
        return logp, (uniq, inv, e[:, EOS] / total, q, blocks, layout)

    def grad(self, theta, states, tokens, mask, rows, grad_logp):
        """d loss / d theta = sum_c phi(c)^T dz(c), masked by ``trained``, summed per distinct context ``c``, per
        copy; returned with rows None (every row of theta). With G(c) = sum_{t: c_t = c} g_t and n_v(c) the sum of
        g_t over the tokens v there, the two-level softmax gives dz_EOS = n_EOS - G sigmoid(f) (the format
        logit's Bernoulli gradient) and dz_v = n_v - (G - n_EOS) q_v for the other tokens, q their softmax."""
        uniq, inv, eos_u, q_u, blocks, (present, _, grid, cell) = rows
        on = mask > 0
        g = grad_logp[on]
        n, V = len(uniq), self.vocab
        dz = np.bincount(inv * V + tokens[on], weights=g, minlength=n * V).reshape(n, V)
        total = np.bincount(inv, weights=g, minlength=n)
        dz[:, EOS + 1:] -= (total - dz[:, EOS])[:, None] * q_u
        dz[:, EOS] -= total * eos_u
        F = self.n_features
        # phi^T dz by fixed-point slices of dz (``fixed_point``), one quantum per copy, in one batched product over
        # the copies (the rows' ``padded`` grid, the padding's dz 0): the same bits on every CPU
        top = np.maximum.reduceat(np.abs(dz).max(1), [part.start for _, part in blocks])
        parts = np.zeros((2, grid.size, V))
        parts[:, cell] = fixed_point(dz, np.repeat(top, [part.stop - part.start for _, part in blocks]),
                                     self.grad_bits)
        products = np.matmul(self.phi[uniq[grid]].transpose(0, 2, 1), parts.reshape(2, *grid.shape, V))
        if present == list(range(self.copies)):
            out = combine(products).reshape(-1, V)
        else:  # copies without tokens here get no gradient
            out = np.zeros((self.copies * F, V))
            out.reshape(self.copies, F, V)[present] = combine(products)
        out *= self.trained
        return out, None

    def ref_logp(self, states, tokens, mask):
        return np.where(mask > 0, self.ref[states, tokens], 0.0)

    def at_fork(self, states):
        """Which tokens sit at forking positions."""
        return self.part[states] == 1

    # ---- sampling -----------------------------------------------------------------------------------------
    def sample(self, theta, prompts, group_size, rng) -> Rollout:
        """G responses per prompt; rows of one prompt contiguous. Each (response, position) draws its token in both
        contexts it could be in (on track, off track) by inverse CDF in one search over the stacked CDFs; running
        logical ands and ors over positions then say which context each token is in and where EOS ended it.

        With copies, ``prompts`` are stacked ids in copy order, equally many per copy, and ``rng`` one generator
        per copy (``uniforms``); each copy draws what it would draw alone."""
        gens = rng if isinstance(rng, (list, tuple)) else [rng]
        prompts = np.asarray(prompts)
        K, T, V, copies = self.K, self.T, self.vocab, len(gens)
        n = len(prompts) // copies  # prompts per copy
        width = n * (K + 1) + T  # rows of one copy's table: its prompts' on-track contexts, then the off-track ones
        copy_of = prompts // self.P
        pid = prompts % self.P
        on_rows = (prompts[:, None] * (K + 1) + copy_of[:, None] * T + np.arange(K + 1)).reshape(copies, -1)
        shifted, e, total = softmax_parts(self._logits(theta, self._layout(
            [(c, np.concatenate([on_rows[i], c * self.n_rows + self.off0 + np.arange(T)]))
             for i, c in enumerate(copy_of[::n])]))[0])  # ``tables``, log pi read at the drawn tokens only
        cdf = np.cumsum(e / total[:, None], axis=1)
        cdf[:, -1] = 1.0
        cdf += (np.arange(len(cdf)) % width)[:, None]  # row r of a copy's table shifted into [r, r + 1]
        stacked = cdf.reshape(copies, -1)
        batch = n * group_size
        who = np.repeat(np.arange(n), group_size)
        on_local = who[:, None] * (K + 1) + np.minimum(np.arange(T), K)
        off_local = np.broadcast_to(n * (K + 1) + np.arange(T), (batch, T))
        u = uniforms(gens, copies * batch, T).reshape(copies, batch, T)

        def draw(local):  # each copy searches its own table
            x = local + u
            found = np.stack([np.searchsorted(stacked[i], x[i]) for i in range(copies)])
            return np.clip(found - local * V, 0, V - 1).reshape(copies * batch, T)
        tok_on, tok_off = draw(on_local), draw(off_local)
        row_pid = np.repeat(pid, group_size)
        row_copy = np.repeat(copy_of, group_size)[:, None]
        # on track at position t: every earlier answer token acceptable (never after the answer); alive: no EOS yet
        on = np.zeros((copies * batch, T), dtype=bool)
        on[:, 0] = True
        good = self.accept[np.repeat(prompts, group_size)[:, None], np.arange(K), tok_on[:, :K]] > 0
        on[:, 1:K + 1] = np.logical_and.accumulate(good, axis=1)[:, :T - 1]
        tok = np.where(on, tok_on, tok_off)
        eos = tok == EOS
        ended = np.logical_or.accumulate(eos, axis=1)
        mask = np.ones((copies * batch, T))
        mask[:, 1:] = ~ended[:, :-1]
        alive = ~ended[:, -1]
        tokens = np.where(mask > 0, tok, 0)
        states = np.where(on, row_pid[:, None] * (K + 1) + np.minimum(np.arange(T), K), self.off0 + np.arange(T))
        states += row_copy * self.n_rows
        states *= mask.astype(np.int64)
        local = np.where(on, np.tile(on_local, (copies, 1)), np.tile(off_local, (copies, 1))) + \
            (np.arange(copies * batch) // batch * width)[:, None]
        first = eos.argmax(1)  # the position of the EOS that ended the response (if any)
        at_answer = (first == K) & on[np.arange(copies * batch), first]
        outcome = np.where(alive, MALFORMED, np.where(at_answer, CORRECT, WRONG))
        old_logp = np.where(mask > 0, shifted[local, tokens] - np.log(total)[local], 0.0)
        return Rollout(prompts, states, tokens, mask, old_logp, outcome, mask.sum(1).astype(np.int64), alive)

    # ---- exact expectations -------------------------------------------------------------------------------
    def masses(self, pi, copy: int = 0):
        """Forward recursion: o[p, t] on-track and f[p, t] off-track probability of emitting token t, of one copy's
        policy ``pi``."""
        P, K, T = self.P, self.K, self.T
        pi_on = pi[:self.off0].reshape(P, K + 1, -1)
        acc = (pi_on[:, :K] * self.accept[copy * P:(copy + 1) * P]).sum(-1)
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

    def snapshots(self, theta) -> list[Snapshot]:
        """Each copy's exact metrics, one copy at a time (its tables stay in the cache)."""
        return [self.snapshot(self._copy(theta, c), c) for c in range(self.copies)]

    def snapshot(self, theta, copy: int = 0) -> Snapshot:
        """Exact metrics of one copy's policy ``theta`` over its pool (each prompt equally likely)."""
        P, K = self.P, self.K
        rows = slice(copy * self.n_rows, (copy + 1) * self.n_rows)
        z = self._logits(theta, copy)[0]
        logp, pi = tables(z)
        pi_logp = pi * logp
        ent = -pi_logp.sum(1)
        kl = (pi * (logp - self.ref[rows])).sum(1)
        o, f, acc, success = self.masses(pi, copy)
        eos = pi[:, EOS]
        decision = -(xlogx(eos) + xlogx(1.0 - eos))
        dec_on = decision[:self.off0].reshape(P, K + 1).copy()
        eos_on = eos[:self.off0].reshape(P, K + 1)[:, :K]
        dec_on[:, :K] = -(xlogx(acc) + xlogx(eos_on) + xlogx(np.maximum(1.0 - acc - eos_on, 0.0)))
        weight = np.concatenate([o.reshape(-1), f.sum(0)])
        per_prompt_tokens = o.sum(1) + f.sum(1)
        total = weight.sum()
        weight = weight / total
        prompt_entropy = ((o * ent[:self.off0].reshape(P, K + 1)).sum(1) + dot(f, ent[self.off0:])) / per_prompt_tokens
        # entropy among the acceptable tokens of answer positions reached on track
        pl_on = pi_logp[:self.off0].reshape(P, K + 1, -1)[:, :K]
        accept = self.accept[copy * P:(copy + 1) * P]
        h_good = -(pl_on * accept).sum(-1) / np.maximum(acc, 1e-300) + np.log(np.maximum(acc, 1e-300))
        accuracy = float(success.mean())
        truncated = f[:, -1] * (1.0 - pi[-1, EOS])  # alive at the last position without ending there
        tokens = total / P
        values = {"accuracy_exact": accuracy, "entropy": float(dot(weight, ent)), "kl_ref": float(dot(weight, kl)),
                  "len_wrong_exact": (tokens - (K + 1) * accuracy) / (1 - accuracy) if accuracy < 1 else None,
                  "entropy_decision": float(dot(weight, np.concatenate([dec_on.reshape(-1), decision[self.off0:]]))),
                  "entropy_correct": float((o[:, :K] * h_good).sum() / o[:, :K].sum()),
                  "malformed_exact": float(truncated.mean())}
        values["entropy_within"] = values["entropy"] - values["entropy_decision"]
        share = np.bincount(self.part[rows], weights=weight * ent, minlength=len(PARTS))
        values.update({f"entropy_{name}": float(v) for name, v in zip(PARTS, share)})
        values["entropy_relevant"] = values["entropy_ordinary"] + values["entropy_fork"]
        return Snapshot(z, logp, pi, weight, success, prompt_entropy, ent, values)
