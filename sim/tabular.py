"""Tabular softmax policies over a finite automaton: sampling, exact expectations and the logit gradient."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CORRECT, WRONG, MALFORMED = 1, 0, -1


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log pi(v|s) = z_sv - logsumexp_v z_s (row-wise, stable)."""
    return tables(logits)[0]


#: Tables at most this wide are reduced column by column (the toy LM's 8 tokens): NumPy's row reduction pays a
#: call per row there.
NARROW = 16


def row_sum(x: np.ndarray) -> np.ndarray:
    """``x.sum(1)`` of a [S, V] array; up to ``NARROW`` columns by columns, in NumPy's own order for a contiguous
    row (in order below 8 terms, else 8 running sums combined pairwise, then the rest), so bit-identical, faster."""
    V = x.shape[1]
    if V > NARROW:
        return x.sum(1)
    if V < 8:
        total = x[:, 0].copy()
        for v in range(1, V):
            total += x[:, v]
        return total
    done = V - V % 8
    acc = x[:, :8]
    for i in range(8, done, 8):
        acc = acc + x[:, i:i + 8]
    acc = acc[:, 0::2] + acc[:, 1::2]  # the pairwise tree ((0+1)+(2+3))+((4+5)+(6+7)), a level per call
    acc = acc[:, 0::2] + acc[:, 1::2]
    total = acc[:, 0] + acc[:, 1]
    for v in range(done, V):
        total += x[:, v]
    return total


def dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` over the last axis, by NumPy's pairwise sum: the same bits on every CPU (``@`` calls BLAS, whose
    kernel, and so whose rounding, depends on the CPU)."""
    return np.add.reduce(a * b, axis=-1)


def tables(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log pi, pi) of a [S, V] logit table with one exp: pi = softmax(z - max_v z) row-wise."""
    shifted, e, total = softmax_parts(logits)
    return shifted - np.log(total)[:, None], e / total[:, None]


def softmax_parts(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``tables``' parts of a [S, V] logit table: z - max_v z, its exponentials and their row sums (log pi =
    shifted - log total, pi = e / total), for a caller that needs only some entries of the tables."""
    narrow = logits.shape[1] <= NARROW
    if logits.shape[0] < 4096 and not narrow:
        top = logits.max(1)
    else:  # a column loop beats a reduction over the short last axis on big or narrow tables
        top = logits[:, 0].copy()
        for v in range(1, logits.shape[1]):
            np.maximum(top, logits[:, v], out=top)
    z = logits - top[:, None]
    e = np.exp(z)
    return z, e, row_sum(e)


@dataclass
class Automaton:
    """A deterministic automaton shared by the environments.

    ``next_state[s, v]`` is the state after token v in state s (-1: the response ends), ``outcome[s, v]`` the
    verdict of an ending transition (CORRECT, WRONG or MALFORMED), ``start[p]`` the first state of prompt p,
    ``max_len`` the generation budget T; a response still running after T tokens is truncated (MALFORMED).
    """

    next_state: np.ndarray
    outcome: np.ndarray
    start: np.ndarray
    max_len: int
    state_prompt: np.ndarray  # [S] the prompt each state belongs to (states are never shared)
    copies: int = 1  # disjoint copies stacked (one per simulated seed): copy c holds states c S/copies onwards

    @classmethod
    def stack(cls, auts: list["Automaton"]) -> "Automaton":
        """The automata ``auts`` (one per copy: environment draws of the same sizes, or one repeated) as disjoint
        copies in one: copy c's states and prompts are offset by c times one's counts."""
        n, p = auts[0].n_states, auts[0].n_prompts
        if any((a.n_states, a.n_prompts, a.vocab, a.max_len) != (n, p, auts[0].vocab, auts[0].max_len)
               for a in auts):
            raise ValueError("draws: expected environment draws of the same sizes (states, prompts, vocabulary, "
                             "max_len)")
        nxt = np.concatenate([np.where(a.next_state >= 0, a.next_state + c * n, -1) for c, a in enumerate(auts)])
        return cls(nxt, np.concatenate([a.outcome for a in auts]), np.concatenate([a.start + c * n
                                                                                   for c, a in enumerate(auts)]),
                   auts[0].max_len, np.concatenate([a.state_prompt + c * p for c, a in enumerate(auts)]),
                   sum(a.copies for a in auts))

    def __post_init__(self):
        self.n_states, self.vocab = self.next_state.shape
        self.n_prompts = len(self.start)
        n, flat_next = self.n_states, self.next_state.reshape(-1)
        # the class of each transition (s, v): its next state, or its outcome if it ends the response; the classes
        # that continue are the edges s -> s'
        code = np.where(flat_next >= 0, flat_next, n + 1 + self.outcome.reshape(-1))
        uniq, cls = np.unique(np.repeat(np.arange(n), self.vocab) * (n + 3) + code, return_inverse=True)
        self._cls, self._cls_state, to = cls.reshape(-1), uniq // (n + 3), uniq % (n + 3)
        self._edge_class = np.flatnonzero(to < n)
        self._edge_from, self._edge_to = self._cls_state[self._edge_class], to[self._edge_class]
        self._correct = np.flatnonzero((flat_next < 0) & (self.outcome.reshape(-1) == CORRECT))
        # per position t: the edges leaving the states reachable in exactly t steps (their slice of _step_edges),
        # their starts and their ends
        reach, self._steps, edges, at = self.start, [], [], 0
        for _ in range(self.max_len):
            on = np.zeros(self.n_states, dtype=bool)
            on[reach] = True
            e = np.flatnonzero(on[self._edge_from])
            self._steps.append((slice(at, at + len(e)), self._edge_from[e], self._edge_to[e]))
            edges.append(e)
            at, reach = at + len(e), self._edge_to[e]
        self._step_edges = np.concatenate(edges)


@dataclass
class Rollout:
    """G sampled responses per prompt, rows of one prompt contiguous; token arrays are [B, T]."""

    prompts: np.ndarray  # [P] prompt ids
    states: np.ndarray  # [B, T] int state of each token (0 at padding)
    tokens: np.ndarray  # [B, T] int sampled token (0 at padding)
    mask: np.ndarray  # [B, T] float 0/1
    old_logp: np.ndarray  # [B, T] log-prob under the sampling policy (0 at padding)
    outcome: np.ndarray  # [B] CORRECT, WRONG or MALFORMED
    lengths: np.ndarray  # [B] number of response tokens
    truncated: np.ndarray  # [B] bool: still running at max_len


def concat_rollouts(parts: list[Rollout]) -> Rollout:
    """The rollouts one after the other (prompts and rows in order)."""
    return Rollout(*(np.concatenate([getattr(p, f) for p in parts]) for f in Rollout.__dataclass_fields__))


def uniforms(rng, rows: int, cols: int | None = None) -> np.ndarray:
    """``rng.random((rows, cols))``; ``rng`` may be a list of generators, one per stacked copy, each drawing its
    copy's equal block of rows (so a stacked run draws what each copy would draw alone)."""
    if not isinstance(rng, (list, tuple)):
        rng = [rng]
    per = rows // len(rng)
    blocks = [g.random((per,) if cols is None else (per, cols)) for g in rng]
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def sample(aut: Automaton, table, prompts: np.ndarray, group_size: int, rng) -> Rollout:
    """Draw group_size responses per prompt, vectorised over the batch, from the policy ``table``: the full
    (log pi, pi) table, or the logit table (then only the drawn prompts' rows are computed). ``rng``: a generator,
    or one per stacked copy (see ``uniforms``; the prompts are then in copy order, equally many per copy)."""
    prompts = np.asarray(prompts)
    picked = np.zeros(aut.n_prompts, dtype=bool)
    picked[prompts] = True
    sel = np.flatnonzero(picked[aut.state_prompt])  # the drawn prompts' states: a response never leaves them
    if isinstance(table, tuple):
        logp_table, pi_sel = table[0], table[1].take(sel, axis=0)
    else:
        logp_sel, pi_sel = tables(table.take(sel, axis=0))
        logp_table = np.empty(table.shape)  # other prompts' rows are never read
        logp_table[sel] = logp_sel
    vocab = aut.vocab
    cdf = np.full((len(sel), -(-vocab // 8) * 8), np.inf)  # padded to whole 8-byte words of comparisons
    np.cumsum(pi_sel, axis=1, out=cdf[:, :vocab])
    cdf[:, vocab - 1] = 1.0  # above every u < 1, so the drawn token is below vocab
    cdf_table = np.empty((aut.n_states, cdf.shape[1]))
    cdf_table[sel] = cdf
    batch, horizon = len(prompts) * group_size, aut.max_len
    rows = np.arange(batch)  # the responses still running, and their states
    state = np.repeat(aut.start[prompts], group_size)
    u = uniforms(rng, batch, horizon).T.copy()  # position-major
    drawn = []  # per position: the running responses, their states and their tokens
    for t in range(horizon):
        below = u[t][rows, None] > cdf_table.take(state, axis=0)
        words = np.bitwise_count(below.view(np.uint64))  # per 8-byte word: how many cdf entries are below u
        tok = words[:, 0] if words.shape[1] == 1 else words.sum(1)
        drawn.append((rows, state, tok))
        nxt = aut.next_state[state, tok]
        running = nxt >= 0
        rows, state = rows[running], nxt[running]
        if rows.size == 0:
            break
    row, state, tok = (np.concatenate(x) for x in zip(*drawn))
    at = row * horizon + np.repeat(np.arange(len(drawn)), [len(r) for r, _, _ in drawn])  # flat [B, T] index
    states, tokens = np.zeros((2, batch * horizon), dtype=np.int64)
    mask, old_logp = np.zeros((2, batch * horizon))
    states[at], tokens[at], mask[at], old_logp[at] = state, tok, 1.0, logp_table[state, tok]
    states, tokens, mask, old_logp = (x.reshape(batch, horizon) for x in (states, tokens, mask, old_logp))
    lengths = mask.sum(1).astype(np.int64)
    truncated = np.zeros(batch, dtype=bool)
    truncated[rows] = True
    last = (np.arange(batch), lengths - 1)
    outcome = np.where(truncated, MALFORMED, aut.outcome[states[last], tokens[last]]).astype(np.int64)
    return Rollout(prompts, states, tokens, mask, old_logp, outcome, lengths, truncated)


def token_logp(logp_table: np.ndarray, states: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """log pi(a_t | s_t) of each sampled token from a log pi table (0 at padding)."""
    return np.where(mask > 0, logp_table[states, tokens], 0.0)


def distinct(ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for ids in [0, n), by a lookup table instead of a sort."""
    seen = np.zeros(n, dtype=bool)
    seen[ids] = True
    uniq = np.flatnonzero(seen)
    index = np.empty(n, dtype=np.intp)
    index[uniq] = np.arange(len(uniq))
    return uniq, index[ids]


def row_logp(logits: np.ndarray, states: np.ndarray, tokens: np.ndarray, mask: np.ndarray):
    """log pi(a_t | s_t) [B, T] from only the visited rows of ``logits`` (the softmax once per distinct state); also
    returns the visited rows: (their states, each token's index among them, their pi)."""
    on = mask > 0
    uniq, inv = distinct(states[on], len(logits))
    logp_u, pi_u = tables(logits.take(uniq, axis=0))
    logp = np.zeros(mask.shape)
    logp[on] = logp_u[inv, tokens[on]]
    return logp, (uniq, inv, pi_u)


def logit_grad(tokens: np.ndarray, mask: np.ndarray, visited, grad_logp: np.ndarray):
    """Chain rule d loss / d z_sv = sum_{t: s_t = s} g_t (1[v = a_t] - pi(v|s)) from g = d loss / d logp, on the
    rows ``row_logp`` visited (every other row's is 0): returns (the gradient's rows [N, V], their states)."""
    uniq, inv, pi_u = visited
    on = mask > 0
    g = grad_logp[on]
    contrib = -g[:, None] * pi_u.take(inv, axis=0)
    contrib[np.arange(len(g)), tokens[on]] += g
    vocab = pi_u.shape[1]
    flat = (inv[:, None] * vocab + np.arange(vocab)).reshape(-1)
    return np.bincount(flat, weights=contrib.reshape(-1), minlength=len(uniq) * vocab).reshape(-1, vocab), uniq


@dataclass
class Exact:
    """Exact expectations over the prompt pool (each prompt equally likely) of a policy's responses."""

    entropy: float  # expected per-token entropy: sum_s d(s) H(s) / sum_s d(s)
    kl_ref: float  # expected per-token KL(pi || ref) weighted the same way
    accuracy: float  # probability of a CORRECT ending
    length: float  # expected number of response tokens
    len_correct: float  # expected length of a correct response
    len_wrong: float  # expected length of an incorrect (wrong or malformed) response
    success: np.ndarray  # [P] per-prompt probability of a CORRECT ending
    visits: np.ndarray  # [S] expected visits of each state per prompt drawn
    row_entropy: np.ndarray  # [S] H(pi(.|s))


def exact(aut: Automaton, table: tuple[np.ndarray, np.ndarray], ref_logp: np.ndarray | None = None) -> Exact:
    """Forward dynamic programme over the T positions of the expected state visits d(s).

    ``table`` is the policy's (log pi, pi), ``ref_logp`` the reference's log pi table.
    """
    return exact_copies(aut, table, ref_logp)[0]


def class_mass(aut: Automaton, pi: np.ndarray) -> np.ndarray:
    """The probability of each transition class (next state, or ending outcome) of each state."""
    return np.bincount(aut._cls, weights=pi.reshape(-1), minlength=len(aut._cls_state))


def exact_copies(aut: Automaton, table, ref_logp=None, mass=None) -> list[Exact]:
    """``exact`` of each of a stacked automaton's copies, in one programme over all of them (``mass``: the
    table's ``class_mass``, if already computed)."""
    logp, pi = table
    terms = pi * logp
    ent = -row_sum(terms)
    if ref_logp is not None:
        np.subtract(logp, ref_logp, out=terms)
        terms *= pi
        kl_s = row_sum(terms)
    else:
        kl_s = np.zeros(aut.n_states)
    n, p = aut.n_states // aut.copies, aut.n_prompts // aut.copies  # per copy
    d = np.bincount(aut.start, minlength=aut.n_states) / p
    visits = np.zeros(aut.n_states)
    flat_pi = pi.reshape(-1)
    move = (class_mass(aut, pi) if mass is None else mass)[aut._edge_class]  # P(s -> s')
    p_win = np.bincount(aut._correct // aut.vocab, weights=flat_pi[aut._correct], minlength=aut.n_states)
    if np.isfinite(move).all():  # d is exactly 0 off the states reachable in t steps: only zeros are skipped
        moves, steps = move[aut._step_edges], aut._steps
    else:  # 0 * NaN is NaN: every edge, as the full sum spreads it
        moves, steps = move, [(slice(None), aut._edge_from, aut._edge_to)] * aut.max_len
    timed = np.zeros(aut.n_states)  # sum_t (t + 1) d_t: a response ending correctly at position t has t + 1 tokens
    for t, (part, src, dst) in enumerate(steps):
        visits += d
        timed += (t + 1) * d
        d = np.bincount(dst, weights=d[src] * moves[part], minlength=aut.n_states)
    success = np.bincount(aut.state_prompt, weights=visits * p_win, minlength=aut.n_prompts) * p
    out = []
    for c in range(aut.copies):
        s, pr = slice(c * n, (c + 1) * n), slice(c * p, (c + 1) * p)
        v = visits[s]
        win_len = float(dot(timed[s], p_win[s]))  # E[length * 1(correct)]
        tokens, acc = v.sum(), float(success[pr].mean())
        out.append(Exact(float(dot(v, ent[s]) / tokens), float(dot(v, kl_s[s]) / tokens), acc, float(tokens),
                         win_len / acc if acc > 0 else float("nan"),
                         (tokens - win_len) / (1 - acc) if acc < 1 else float("nan"), success[pr], v,
                         ent[s]))
    return out


def xlogx(x: np.ndarray) -> np.ndarray:
    """x log x with 0 log 0 = 0."""
    out = np.zeros(x.shape)
    pos = x > 0
    np.log(x, out=out, where=pos)
    return np.multiply(out, x, out=out, where=pos)


@dataclass
class Snapshot:
    """Exact quantities of one policy over the prompt pool, shared by every environment's exact metrics."""

    logits: np.ndarray  # [R, V] the policy's logit rows (a copy)
    logp: np.ndarray  # [R, V]
    pi: np.ndarray  # [R, V]
    weight: np.ndarray  # [R] share of the expected response tokens spent at each row (sums to 1)
    success: np.ndarray  # [P] probability of a correct response per prompt
    prompt_entropy: np.ndarray  # [P] expected per-token entropy of each prompt's responses
    row_entropy: np.ndarray  # [R] H(pi(.|row)) of each row
    values: dict  # the scalar exact metrics (accuracy_exact, entropy, kl_ref, entropy_decision, ...)


class TableEnv:
    """An automaton whose policy parameters are one logit row per state (the toy LM and the bandit).

    Tokens that lead to the same next state (or end with the same outcome) are interchangeable for the reward:
    the entropy of the choice among them is ``entropy_within``, the rest ``entropy_decision`` (chain rule).
    ``TableEnv.stack`` stacks disjoint copies (one per simulated seed, each in its environment draw, see
    ``Automaton.stack``): the parameters are the copies' tables one under the other, and ``snapshots`` evaluates
    every copy in one pass.
    """

    def __init__(self, aut: Automaton, init: np.ndarray, info: dict):
        self.aut, self.init, self.info, self.copies = aut, init, info, aut.copies
        self.n_states, self.n_prompts = aut.n_states, aut.n_prompts // aut.copies  # n_prompts: per copy
        self._local_prompt = aut.state_prompt[:aut.n_states // aut.copies]
        self.ref = tables(init)[0]

    @classmethod
    def stack(cls, draws: list[TableEnv]) -> TableEnv:
        """One environment of ``len(draws)`` copies, copy c in ``draws[c]``'s (one draw each, a draw may repeat):
        automata, initial tables and descriptions one copy after the other."""
        return cls(Automaton.stack([d.aut for d in draws]), np.concatenate([d.init for d in draws]),
                   {k: np.concatenate([d.info[k] for d in draws]) for k in draws[0].info})

    def sample(self, table, prompts, group_size, rng) -> Rollout:
        """G responses per prompt; with copies, ``prompts`` are stacked ids (copy c's prompt p is c P + p)."""
        return sample(self.aut, table, prompts, group_size, rng)

    def rows(self, params, states, tokens, mask):
        return row_logp(params, states, tokens, mask)

    def grad(self, params, states, tokens, mask, visited, grad_logp):
        """The gradient's rows and their states (``logit_grad``)."""
        return logit_grad(tokens, mask, visited, grad_logp)

    def ref_logp(self, states, tokens, mask):
        return token_logp(self.ref, states, tokens, mask)

    def at_fork(self, states):
        """Which tokens sit at forking positions: the automata have none."""
        return None

    def snapshot(self, params: np.ndarray) -> Snapshot:
        """The exact metrics of a single copy's policy ``params``."""
        return self.snapshots(params)[0]

    def snapshots(self, params: np.ndarray) -> list[Snapshot]:
        """Each copy's exact metrics, from one softmax and one dynamic programme over the stacked table."""
        logp, pi = tables(params)
        mass = class_mass(self.aut, pi)
        decision = -np.bincount(self.aut._cls_state, weights=xlogx(mass), minlength=self.n_states)
        n, out = self.n_states // self.copies, []
        for c, ex in enumerate(exact_copies(self.aut, (logp, pi), self.ref, mass)):
            rows = slice(c * n, (c + 1) * n)
            w = ex.visits / ex.visits.sum()
            per_prompt = np.bincount(self._local_prompt, weights=ex.visits * ex.row_entropy,
                                     minlength=self.n_prompts)
            per_prompt /= np.bincount(self._local_prompt, weights=ex.visits, minlength=self.n_prompts)
            values = {"accuracy_exact": ex.accuracy, "entropy": ex.entropy, "kl_ref": ex.kl_ref,
                      "len_wrong_exact": ex.len_wrong, "entropy_decision": float(dot(w, decision[rows]))}
            values["entropy_within"] = ex.entropy - values["entropy_decision"]
            out.append(Snapshot(params[rows].copy(), logp[rows], pi[rows], w, ex.success, per_prompt,
                                ex.row_entropy, values))
        return out
