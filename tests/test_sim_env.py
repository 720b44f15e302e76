"""The environments: exact expectations against brute-force enumeration and sampling, and the bandit's law."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import bandit, toy_lm
from sim.tabular import CORRECT, MALFORMED, WRONG, distinct, exact, sample, tables


def _enumerate(aut, logits, ref_logits):
    """Every token sequence of every prompt with its probability: per-token entropy, KL, accuracy, length."""
    logp, pi = tables(logits)
    ref_lp = tables(ref_logits)[0]
    ent_sum = kl_sum = tok_sum = acc = win_len = 0.0
    for p in range(aut.n_prompts):
        for seq in itertools.product(range(aut.vocab), repeat=aut.max_len):
            s, prob, ent, kl, n, outcome = aut.start[p], 1.0, 0.0, 0.0, 0, MALFORMED
            for v in seq:
                ent += -(pi[s] * logp[s]).sum()
                kl += (pi[s] * (logp[s] - ref_lp[s])).sum()
                prob *= pi[s, v]
                n += 1
                nxt = aut.next_state[s, v]
                if nxt < 0:
                    outcome = aut.outcome[s, v]
                    break
                s = nxt
            if n < aut.max_len and seq[n:] != (0,) * (aut.max_len - n):
                continue  # the tokens after the end are padding; count each response once
            ent_sum += prob * ent
            kl_sum += prob * kl
            tok_sum += prob * n
            acc += prob * (outcome == CORRECT)
            win_len += prob * n * (outcome == CORRECT)
    return (ent_sum / tok_sum, kl_sum / tok_sum, acc / aut.n_prompts, tok_sum / aut.n_prompts, win_len / acc,
            (tok_sum - win_len) / (aut.n_prompts - acc))


def test_exact_expectations_equal_enumeration():
    aut, logits, _ = toy_lm.build(n_prompts=2, max_len=4, n_think=1, n_answers=2, env_seed=3)
    ref = logits + np.random.default_rng(0).standard_normal(logits.shape)
    ex = exact(aut, tables(logits), tables(ref)[0])
    ent, kl, acc, length, len_correct, len_wrong = _enumerate(aut, logits, ref)
    assert ex.entropy == pytest.approx(ent, rel=1e-12)
    assert ex.kl_ref == pytest.approx(kl, rel=1e-12)
    assert ex.accuracy == pytest.approx(acc, rel=1e-12)
    assert ex.length == pytest.approx(length, rel=1e-12)
    assert ex.len_correct == pytest.approx(len_correct, rel=1e-12)
    assert ex.len_wrong == pytest.approx(len_wrong, rel=1e-12)


def test_sampling_matches_exact_per_prompt():
    aut, logits, _ = toy_lm.build(n_prompts=8, env_seed=1)
    ex = exact(aut, tables(logits))
    ro = sample(aut, tables(logits), np.arange(8), 4000, np.random.default_rng(0))
    success = (ro.outcome == CORRECT).reshape(8, -1).mean(1)
    se = np.sqrt(ex.success * (1 - ex.success) / 4000) + 1e-3
    assert np.all(np.abs(success - ex.success) < 5 * se)
    assert ro.lengths.mean() == pytest.approx(ex.length, rel=0.02)
    # the old log-probs are those of the sampled tokens under the sampling policy
    np.testing.assert_allclose(ro.old_logp[ro.mask > 0], tables(logits)[0][ro.states, ro.tokens][ro.mask > 0])


def test_toy_lm_format_rule_and_lengths():
    aut, logits, info = toy_lm.build(n_prompts=16, max_len=10, env_seed=2)
    ro = sample(aut, tables(logits), np.arange(16), 200, np.random.default_rng(1))
    toks, lens = ro.tokens, ro.lengths
    for i in range(0, len(lens), 97):
        seq = toks[i, :lens[i]]
        well_formed = (not ro.truncated[i] and len(seq) >= 3 and seq[-1] == toy_lm.EOS and seq[-3] == toy_lm.ANS
                       and seq[-2] >= 2 + 2 and toy_lm.ANS not in seq[:-3] and toy_lm.EOS not in seq[:-1])
        assert (ro.outcome[i] != MALFORMED) == well_formed
        if well_formed:
            answer = seq[-2] - (2 + 2)
            assert (ro.outcome[i] == CORRECT) == (answer == info["answers"][i // 200])
    assert lens.min() >= 1 and lens.max() == 10 and ro.truncated.any()
    assert set(np.unique(ro.outcome)) == {CORRECT, WRONG, MALFORMED}


def test_toy_lm_initial_success_spans_hard_to_easy():
    aut, logits, _ = toy_lm.build()
    s = exact(aut, tables(logits)).success
    assert s.min() < 0.01 and s.max() > 0.85
    assert ((s > 0.2) & (s < 0.8)).mean() > 0.2


@given(st.integers(0, 2**31 - 1), st.sampled_from([1e-3, 1e-2]))
def test_bandit_entropy_change_matches_covariance_to_first_order(seed, eta):
    """Cui et al. 2505.22617: under natural PG, dH = -eta Cov(log pi, A) + O(eta^2)."""
    rng = np.random.default_rng(seed)
    logits = 2 * rng.standard_normal((5, 6))
    rewards = rng.random((5, 6))
    exact_change, predicted = bandit.npg_entropy_check(logits, rewards, eta)
    # the second-order remainder is bounded by eta^2 times a constant of the logit scale
    assert np.all(np.abs(exact_change - predicted) <= 20 * eta**2)


def test_bandit_error_is_second_order():
    aut, logits, _ = bandit.build()
    r = (aut.outcome == CORRECT).astype(float)
    e1 = np.abs(np.subtract(*bandit.npg_entropy_check(logits, r, 1e-3))).sum()
    e2 = np.abs(np.subtract(*bandit.npg_entropy_check(logits, r, 1e-2))).sum()
    assert 60 < e2 / e1 < 140  # ten times eta, a hundred times the error


def test_bandit_exact_is_mean_entropy_and_success():
    aut, logits, info = bandit.build(n_prompts=10, n_arms=5)
    ex = exact(aut, tables(logits))
    pi = tables(logits)[1]
    assert ex.entropy == pytest.approx(bandit.entropy(logits).mean(), rel=1e-12)
    assert ex.accuracy == pytest.approx(pi[np.arange(10), info["answers"]].mean(), rel=1e-12)
    assert ex.length == 1


def test_row_sum_is_numpy_row_sum_bit_for_bit():
    """The column-wise row sum of narrow tables equals NumPy's own x.sum(1) exactly, for every width and scale."""
    from sim.tabular import row_sum
    rng = np.random.default_rng(3)
    for width in range(1, 41):
        for scale in (0.1, 3.0, 30.0):
            x = np.exp(scale * rng.standard_normal((257, width)))
            assert np.array_equal(row_sum(x), x.sum(1)), width


def _visits_over_every_edge(aut, pi):
    """The expected visits by the forward DP over every edge at every position (the reference)."""
    d = np.bincount(aut.start, minlength=aut.n_states) / aut.n_prompts
    visits = np.zeros(aut.n_states)
    move = np.array([pi[s][aut.next_state[s] == t].sum() for s, t in zip(aut._edge_from, aut._edge_to)])
    for _ in range(aut.max_len):
        visits += d
        d = np.bincount(aut._edge_to, weights=d[aut._edge_from] * move, minlength=aut.n_states)
    return visits


def test_exact_skips_only_zero_edges_bit_for_bit():
    """The DP's step t sums only the edges leaving states reachable in t steps; the visits equal the sum over every
    edge exactly, and a NaN probability spreads as it does there."""
    aut, logits, _ = toy_lm.build(n_prompts=6, max_len=9, env_seed=4)
    logits = logits + np.random.default_rng(2).standard_normal(logits.shape)
    assert np.array_equal(exact(aut, tables(logits)).visits, _visits_over_every_edge(aut, tables(logits)[1]))
    logits[aut.start[2] + 8, 3] = np.nan  # reached at the last position only; the full sum spreads 0 * NaN earlier
    got, want = exact(aut, tables(logits)).visits, _visits_over_every_edge(aut, tables(logits)[1])
    assert np.isnan(want).any() and np.array_equal(got, want, equal_nan=True)


def test_sampling_from_logits_equals_sampling_from_the_table():
    """Drawing from the logit table (the drawn prompts' rows only) gives the rollout of the full (log pi, pi)."""
    aut, logits, _ = toy_lm.build(n_prompts=12, env_seed=5)
    a = sample(aut, tables(logits), np.array([7, 2, 11]), 16, np.random.default_rng(4))
    b = sample(aut, logits, np.array([7, 2, 11]), 16, np.random.default_rng(4))
    for field in a.__dataclass_fields__:
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), field


def test_xlogx_is_zero_off_the_positive_reals():
    from sim.tabular import xlogx
    x = np.array([0.0, -0.0, -1.0, np.nan, -np.inf, 0.5, 1.0, np.inf])
    got = xlogx(x)
    assert got[:5].tobytes() == np.zeros(5).tobytes()
    assert got[5] == 0.5 * np.log(0.5) and got[6] == 0.0 and got[7] == np.inf


@pytest.mark.parametrize("n_think,n_answers", [(1, 2), (2, 4), (4, 5), (6, 12)])
def test_sample_draws_each_token_by_inverse_cdf(n_think, n_answers):
    """Every vocabulary width (below, at and above a multiple of 8): token t of response b is the number of CDF
    entries of pi(.|s_t) below u[b, t] (the last entry taken as 1), and the log-probs are those of the table."""
    aut, logits, _ = toy_lm.build(n_prompts=5, max_len=7, n_think=n_think, n_answers=n_answers, env_seed=6)
    logp, pi = tables(logits)
    ro = sample(aut, (logp, pi), np.array([4, 0, 2]), 9, np.random.default_rng(8))
    u = np.random.default_rng(8).random(ro.mask.shape)
    cdf = np.cumsum(pi, axis=1)
    cdf[:, -1] = 1.0
    on = ro.mask > 0
    assert np.array_equal(ro.tokens[on], (u[on][:, None] > cdf[ro.states[on]]).sum(1))
    assert np.array_equal(ro.old_logp[on], logp[ro.states[on], ro.tokens[on]])
    assert not ro.tokens[~on].any() and not ro.states[~on].any() and not ro.old_logp[~on].any()
    assert np.array_equal(ro.lengths, on.sum(1)) and np.array_equal(ro.states[:, 0], np.repeat(aut.start[[4, 0, 2]], 9))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=60))
def test_distinct_is_numpys_unique_with_inverse(ids):
    ids = np.array(ids)
    uniq, inv = distinct(ids, 31)
    want_uniq, want_inv = np.unique(ids, return_inverse=True)
    assert (uniq == want_uniq).all() and (inv == want_inv).all()
