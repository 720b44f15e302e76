"""feature_lm: exact metrics against enumeration, sampling against exact, determinism, autograd, the entropy law."""
import itertools

import numpy as np
import pytest
import torch

import gpu
from sim import optim, policy_loss
from sim.advantages import group_advantages
from sim.feature_lm import EOS, FeatureLM
from sim.loop import Trainer, run, run_stack
from sim.metrics import entropy_law, exact_metrics
from sim.tabular import CORRECT, MALFORMED, WRONG, TableEnv, tables
from sim import toy_lm
from spec.registry import ALGORITHMS, POLICY_ALGORITHMS

SMALL = dict(n_prompts=3, vocab=8, answer_len=2, max_len=4, n_correct=2, forks=1, n_features=4, env_seed=5,
             difficulty_low=-3.0, difficulty_high=2.0)


def _entropy(q):
    q = q[q > 0]
    return float(-(q * np.log(q)).sum())


def _walk(env, p, seq):
    """The documented rules, token by token: (rows visited, outcome, length)."""
    K, on, rows = env.K, True, []
    for t, v in enumerate(seq):
        rows.append(p * (K + 1) + t if on else env.off0 + t)
        if v == EOS:
            return rows, CORRECT if on and t == K else WRONG, t + 1
        on = on and t < K and env.accept[p, t, v] > 0
    return rows, MALFORMED, len(seq)


def _consequence(env, p, t, on, v):
    """Where token v leads from position t: the next context, or the outcome it ends with."""
    if v == EOS:
        return ("end", CORRECT if on and t == env.K else WRONG)
    return ("on" if on and t < env.K and env.accept[p, t, v] > 0 else "off", t + 1)


def _enumerate(env, theta):
    """Every full response of every prompt with its probability; per-token averages computed by brute force."""
    logp, pi = tables(env.logits(theta))
    ref = env.ref
    P, T = env.P, env.T
    success, tok_p, ent_p = np.zeros(P), np.zeros(P), np.zeros(P)
    kl = dec = good_ent = good_w = 0.0
    by_part = np.zeros(4)
    for p in range(P):
        for seq in itertools.product(range(env.vocab), repeat=T):
            rows, outcome, n = _walk(env, p, seq)
            if seq[n:] != (0,) * (T - n):
                continue  # tokens after the end are padding: count each response once
            prob = float(np.prod([pi[r, v] for r, v in zip(rows, seq)]))
            success[p] += prob * (outcome == CORRECT)
            tok_p[p] += prob * n
            on = True
            for t, (r, v) in enumerate(zip(rows, seq[:n])):
                ent_p[p] += prob * _entropy(pi[r])
                kind = "offtrack" if not on else ("end" if t == env.K else ("fork" if env.fork[p, t] else "ordinary"))
                by_part[["ordinary", "fork", "end", "offtrack"].index(kind)] += prob * _entropy(pi[r])
                kl += prob * float((pi[r] * (logp[r] - ref[r])).sum())
                groups = {}
                for w in range(env.vocab):
                    key = _consequence(env, p, t, on, w)
                    groups[key] = groups.get(key, 0.0) + pi[r, w]
                dec += prob * _entropy(np.array(list(groups.values())))
                if on and t < env.K:
                    good = env.accept[p, t] > 0
                    good_ent += prob * _entropy(pi[r, good] / pi[r, good].sum())
                    good_w += prob
                on = _consequence(env, p, t, on, v)[0] == "on"
    tokens = tok_p.sum()
    return {"success": success, "entropy": ent_p.sum() / tokens, "kl_ref": kl / tokens,
            "entropy_decision": dec / tokens, "entropy_correct": good_ent / good_w,
            "prompt_entropy": ent_p / tok_p, "length": tokens / P, "by_part": by_part / tokens,
            "len_wrong": (tokens / P - (env.K + 1) * success.mean()) / (1 - success.mean())}


def test_exact_metrics_equal_enumeration():
    env = FeatureLM(**SMALL)
    theta = 0.7 * np.random.default_rng(0).standard_normal(env.init.shape)
    snap = env.snapshot(theta)
    brute = _enumerate(env, theta)
    np.testing.assert_allclose(snap.success, brute["success"], rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(snap.prompt_entropy, brute["prompt_entropy"], rtol=1e-11)
    for key in ("entropy", "kl_ref", "entropy_decision", "entropy_correct"):
        assert snap.values[key] == pytest.approx(brute[key], rel=1e-11), key
    assert snap.values["len_wrong_exact"] == pytest.approx(brute["len_wrong"], rel=1e-11)
    parts = [snap.values[f"entropy_{k}"] for k in ("ordinary", "fork", "end", "offtrack")]
    np.testing.assert_allclose(parts, brute["by_part"], rtol=1e-11, atol=1e-15)
    assert sum(parts) == pytest.approx(brute["entropy"], rel=1e-11) and min(parts) > 0
    assert snap.values["accuracy_exact"] == pytest.approx(brute["success"].mean(), rel=1e-11)
    m = exact_metrics(snap, np.array([0]), np.array([2]))
    for k in (1, 8, 64):
        assert m[f"pass@{k}"] == pytest.approx(np.mean(1 - (1 - brute["success"]) ** k), rel=1e-11)
    assert m["entropy_hard"] == pytest.approx(brute["prompt_entropy"][0], rel=1e-11)


def test_toy_lm_entropy_split_equals_grouping_by_consequence():
    """Decision entropy: the entropy of where the token leads (next state or outcome), visit-weighted."""
    aut, logits, _ = toy_lm.build(n_prompts=3, max_len=5, n_think=2, n_answers=2, env_seed=1)
    logits = logits + np.random.default_rng(2).standard_normal(logits.shape)
    env = TableEnv(aut, logits, {})
    snap = env.snapshot(logits)
    pi = tables(logits)[1]
    dec = np.zeros(aut.n_states)
    for s in range(aut.n_states):
        groups = {}
        for v in range(aut.vocab):
            key = (aut.next_state[s, v], aut.outcome[s, v] if aut.next_state[s, v] < 0 else None)
            groups[key] = groups.get(key, 0.0) + pi[s, v]
        dec[s] = _entropy(np.array(list(groups.values())))
    assert snap.values["entropy_decision"] == pytest.approx(snap.weight @ dec, rel=1e-12)
    assert 0 < snap.values["entropy_within"] < snap.values["entropy"]


def test_sampling_matches_exact():
    env = FeatureLM(n_prompts=6, vocab=16, env_seed=2, difficulty_low=-2.0, difficulty_high=3.0,
                    offtrack_eos=-2.0)  # a format that truncates some responses, to sample every outcome
    theta = 0.3 * np.random.default_rng(1).standard_normal(env.init.shape)
    snap = env.snapshot(theta)
    n = 4000
    ro = env.sample(theta, np.arange(6), n, np.random.default_rng(0))
    freq = (ro.outcome == CORRECT).reshape(6, n).mean(1)
    se = np.sqrt(snap.success * (1 - snap.success) / n) + 1e-3
    assert np.all(np.abs(freq - snap.success) < 5 * se)
    o, f, _, _ = env.masses(snap.pi)
    assert ro.lengths.mean() == pytest.approx((o.sum() + f.sum()) / 6, rel=0.02)
    np.testing.assert_allclose(ro.old_logp[ro.mask > 0], snap.logp[ro.states, ro.tokens][ro.mask > 0], rtol=1e-12)
    assert set(np.unique(ro.outcome)) == {CORRECT, WRONG, MALFORMED}
    assert ro.lengths.min() < env.K + 1 < ro.lengths.max()  # variable length: short, complete and long answers


def test_prior_is_zipfian_confidently_wrong_on_hard_prompts_and_spans_difficulty():
    env = FeatureLM()
    snap = env.snapshot(env.init)
    assert env.vocab >= 128
    s = snap.success
    assert s.min() < 1e-4 and s.max() > 0.3 and ((s > 0.05) & (s < 0.3)).mean() > 0.1
    hard = np.argsort(env.delta)[:20]
    assert s[hard].max() < 1e-3
    for p in hard:  # at a fork of a hard prompt the prior's most likely token is wrong, and confident
        k = int(np.flatnonzero(env.fork[p])[0])
        row = snap.pi[p * (env.K + 1) + k]
        assert env.accept[p, k, row.argmax()] == 0 and row.max() > 0.4
        assert row @ env.accept[p, k] < row.max() / 20
    # the background is Zipfian: log-frequency of the mean prior falls linearly in log-rank with slope ~ -zipf
    mean_pi = np.sort(snap.pi[:, 1:].mean(0))[::-1]
    slope = np.polyfit(np.log(np.arange(10, 100)), np.log(mean_pi[9:99]), 1)[0]
    assert -1.6 < slope < -0.7


def test_forks_need_improbable_tokens_from_a_shared_pool_and_ordinary_positions_accept_the_dominant_one():
    """Forking positions: the acceptable tokens come from one small pool shared by every prompt, and all but the
    first (whose logit sets the prompt's difficulty) are improbable; elsewhere the dominant token is acceptable."""
    env = FeatureLM()
    pi = tables(env.base)[1]
    K = env.K
    fork_tokens, others = set(), []
    for p in range(env.P):
        for k in range(K):
            row = p * (K + 1) + k
            good = np.flatnonzero(env.accept[p, k])
            assert len(good) == 2 and EOS not in good
            top = env.base[row, 1:].argmax() + 1  # the dominant token
            if env.fork[p, k]:
                fork_tokens |= set(good.tolist())
                set_by_delta = np.isclose(env.base[row, good], env.base[row, top] + env.delta[p])
                if env.delta[p] < 0:  # (an easy prompt's first token becomes the dominant one)
                    assert set_by_delta.sum() == 1
                    others += pi[row, good[~set_by_delta]].tolist()
            else:
                assert env.accept[p, k, top] == 1
    assert env.fork.sum(1).tolist() == [2] * env.P
    assert len(fork_tokens) <= 4 * 2  # the pool: 4 n_correct tokens
    assert np.median(others) < 0.05


def test_runs_are_deterministic_and_parameters_are_shared():
    over = {"n_prompts": 32, "batch_prompts": 4, "group_size": 4, "staleness": 1, "eval_every": 2, "minibatches": 2}
    a, b = run("feature_lm", "grpo", 3, 5, over), run("feature_lm", "grpo", 3, 5, over)
    assert a == b and a != run("feature_lm", "grpo", 4, 5, over)
    t = Trainer("feature_lm", "grpo", 0, over)
    before = t.env.snapshot(t.params).success
    t.step()
    moved = np.abs(t.env.snapshot(t.params).success - before) > 1e-12
    assert moved.sum() > over["batch_prompts"]  # one step on 4 prompts moves prompts it never saw
    assert a[-1]["entropy"] is not None and a[1].get("entropy") is None  # exact every 2 steps and at the end


def test_staleness_samples_from_the_old_policy():
    over = {"n_prompts": 16, "batch_prompts": 4, "group_size": 4, "staleness": 2, "beta": 0.0, "minibatches": 2}
    t = Trainer("feature_lm", "grpo", 0, over)
    snaps = []
    for _ in range(4):
        snaps.append(t.params.copy())
        t.step()
    assert len(t.history) == 3 and np.array_equal(t.history[0], snaps[1])  # step 3 sampled from step 1's policy


def _batch(seed, g=4):
    rng = np.random.default_rng(seed)
    env = FeatureLM(n_prompts=5, vocab=16, answer_len=3, max_len=6, n_features=6, env_seed=seed)
    theta0 = 0.2 * rng.standard_normal(env.init.shape) * env.trained
    ro = env.sample(theta0, np.arange(5), g, rng)
    r = (ro.outcome == CORRECT).astype(float) + 0.1 * rng.standard_normal(len(ro.outcome))
    adv = np.broadcast_to(group_advantages(r, g)[:, None], ro.mask.shape) * ro.mask
    theta = theta0 + 0.3 * rng.standard_normal(theta0.shape) * env.trained
    return env, theta, ro, adv, env.ref_logp(ro.states, ro.tokens, ro.mask)


def _torch_logp(env, theta, ro):
    """The two-level softmax written out: pi(EOS|c) = sigmoid(f(c)), f = b_EOS - logsumexp(b_other) + theta's slot
    parameter; the other tokens share 1 - pi(EOS) by the softmax of b + phi theta over them."""
    th = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    u = torch.as_tensor(env.base) + torch.as_tensor(env.phi) @ (th * torch.as_tensor(env.trained))
    b = torch.as_tensor(env.base)
    f = u[:, EOS] - torch.logsumexp(b[:, EOS + 1:], 1)
    logp_all = torch.cat([torch.nn.functional.logsigmoid(f)[:, None],
                          torch.nn.functional.logsigmoid(-f)[:, None] + torch.log_softmax(u[:, EOS + 1:], 1)], 1)
    logp = logp_all[torch.as_tensor(ro.states), torch.as_tensor(ro.tokens)]
    return th, logp * torch.as_tensor(ro.mask)


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_parameter_gradient_matches_torch_autograd(name):
    env, theta, ro, adv, ref_lp = _batch(1)
    hp = {"max_len": env.T, "beta": 0.04}
    logp, pi_rows = env.rows(theta, ro.states, ro.tokens, ro.mask)
    loss, g, _ = policy_loss(name, logp, ro.old_logp, adv, ro.mask, group_size=4, ref_logp=ref_lp, **hp)
    grad, _ = env.grad(theta, ro.states, ro.tokens, ro.mask, pi_rows, g)
    th, t_logp = _torch_logp(env, theta, ro)
    t_loss, _ = gpu.policy_loss(name, t_logp, torch.as_tensor(ro.old_logp), torch.as_tensor(adv),
                                torch.as_tensor(ro.mask), group_size=4, ref_logp=torch.as_tensor(ref_lp), **hp)
    t_loss.backward()
    assert loss == pytest.approx(float(t_loss.detach()), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(grad, th.grad.numpy(), rtol=1e-9, atol=1e-13)
    assert np.abs(grad).max() > 0


def test_one_adam_update_matches_torch():
    """DAPO's clipped objective (2503.14476 Eq. 8) through the log-linear policy, one Adam step, float64."""
    env, theta, ro, adv, _ = _batch(2)
    params = theta.copy()
    opt = optim.make("adam", params, 0.05)
    logp, pi_rows = env.rows(params, ro.states, ro.tokens, ro.mask)
    _, g, _ = policy_loss("dapo", logp, ro.old_logp, adv, ro.mask, group_size=4)
    opt.step(*env.grad(params, ro.states, ro.tokens, ro.mask, pi_rows, g))
    th, t_logp = _torch_logp(env, theta, ro)
    t_opt = torch.optim.Adam([th], lr=0.05)
    m, a = torch.as_tensor(ro.mask), torch.as_tensor(adv)
    ratio = torch.exp(t_logp - torch.as_tensor(ro.old_logp))
    surr = -torch.minimum(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a) * m
    groups = surr.reshape(-1, 4 * surr.shape[1]).sum(1) / m.reshape(-1, 4 * m.shape[1]).sum(1)
    groups.mean().backward()
    t_opt.step()
    np.testing.assert_allclose(params, th.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_entropy_law_is_first_order():
    """Cui et al. Lemma 1: the error of -Cov(log pi, dz) shrinks as the square of the step."""
    env = FeatureLM(n_prompts=16, vocab=32, env_seed=3)
    theta = 0.2 * np.random.default_rng(0).standard_normal(env.init.shape)
    d = np.random.default_rng(1).standard_normal(theta.shape)
    old = env.snapshot(theta)
    errs = []
    for eps in (1e-3, 1e-4):  # (the EOS decision's logsumexp curves the logits: at 1e-2 the error is ~11%)
        law = entropy_law(old, env.snapshot(theta + eps * d))
        errs.append(abs(law["entropy_change_pred"] - law["entropy_change_rows"]))
        assert law["entropy_change_pred"] == pytest.approx(law["entropy_change_rows"], rel=0.05)
    assert 50 < errs[0] / errs[1] < 200


@pytest.mark.parametrize("algo", ["grpo", "dapo", "dr_grpo"])
def test_upper_and_lower_clip_shares_add_up_to_the_loss_clip_fraction(algo):
    """Without dual clip, the loss's clipped tokens are exactly the up- and the low-clipped ones."""
    recs = run("feature_lm", algo, 0, 6, {"n_prompts": 32, "batch_prompts": 8, "group_size": 4, "staleness": 2,
                                          "minibatches": 8, "lr": 0.1})
    for r in recs:
        if r["clip_frac"] is not None:
            assert r["clip_up_frac"] + r["clip_low_frac"] == pytest.approx(r["clip_frac"], abs=1e-12)
    assert any(r["clip_frac"] for r in recs)


def test_random_reward_ignores_the_answer():
    t = Trainer("feature_lm", "grpo", 0, {"n_prompts": 32, "batch_prompts": 8, "reward": "random"})
    rec, = t.step()
    assert 0.3 < rec["reward"] < 0.7 and rec["accuracy"] < 0.5


@pytest.mark.parametrize("over,field", [
    ({"vocab": 4}, "vocab"), ({"zipf": float("nan")}, "zipf"), ({"zipf": "big"}, "zipf"),
    ({"confidence": -1.0}, "confidence"), ({"confidence": float("inf")}, "confidence"),
    ({"staleness": -1}, "staleness"), ({"staleness": 1.5}, "staleness"), ({"eval_every": 0}, "eval_every"),
    ({"answer_len": 8}, "max_len"), ({"forks": 5}, "forks"), ({"n_correct": 200}, "n_correct"),
    ({"n_features": True}, "n_features"), ({"reward": "gold"}, "reward"), ({"explore": "wander"}, "explore"),
    ({"explore": "exploration", "vocab": 8, "n_correct": 4}, "n_correct"),
])
def test_bad_feature_lm_settings_name_the_key(over, field):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        Trainer("feature_lm", "grpo", 0, over)


def test_unknown_environment_lists_the_known_ones():
    with pytest.raises(ValueError, match="bandit, toy_lm, feature_lm"):
        Trainer("atari", "grpo", 0)


def test_step_clips_by_hand():
    """GRPO's bounds [0.8, 1.2]: which tokens clip up or down, their pi_old, and the up-clipped share at forks."""
    from sim.metrics import StepClips
    old = np.log(np.array([[0.1, 0.5, 0.3, 0.9], [0.05, 0.6, 0.25, 0.5]]))
    ratio = np.array([[1.5, 1.1, 1.3, 0.7], [2.0, 0.5, 1.25, 1.0]])
    adv = np.array([[1.0, 1.0, 1.0, -1.0], [1.0, -1.0, 1.0, 1.0]])
    mask = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    fork = np.array([[True, False, False, False], [False, False, True, False]])
    clips = StepClips("grpo", {"eps_low": 0.2, "eps_high": 0.2})
    clips.add(old + np.log(ratio), old, adv, mask, fork)
    s, = clips.summary()
    # up: A > 0 and r > 1.2 -> (0,0) p 0.1 fork, (0,2) p 0.3, (1,0) p 0.05, (1,2) p 0.25 fork; low: (0,3), (1,1)
    assert s["clip_up_frac"] == pytest.approx(4 / 7) and s["clip_low_frac"] == pytest.approx(2 / 7)
    assert s["upclip_pold_median"] == pytest.approx(0.175) and s["upclip_pold_lt02"] == pytest.approx(2 / 4)
    assert s["upclip_fork_share"] == pytest.approx(2 / 4)
    assert s["freed_frac"] == 0.0  # eps_high 0.2 frees nothing


@pytest.mark.parametrize("env_seed", [0, 1, 2, 3])
def test_starts_as_an_instruct_model_well_formatted(env_seed):
    """At step 0 at most 2% of responses are malformed (issue 19), exactly."""
    env = FeatureLM(env_seed=env_seed)
    assert env.snapshot(env.init).values["malformed_exact"] <= 0.02


def test_exact_malformed_share_matches_sampling():
    """malformed_exact against the sampled share of truncated responses, with the old format (EOS off track 2 nats
    below the dominant token) where about 14% are truncated: within 4 binomial standard errors."""
    env = FeatureLM(n_prompts=64, offtrack_eos=-2.0)
    exact = env.snapshot(env.init).values["malformed_exact"]
    ro = env.sample(env.init, np.arange(64), 400, np.random.default_rng(0))
    share, n = float(np.mean(ro.outcome == MALFORMED)), len(ro.outcome)
    assert 0.05 < exact < 0.3
    assert abs(share - exact) < 4 * np.sqrt(exact * (1 - exact) / n)


def test_reward_relevant_entropy_is_ordinary_plus_fork():
    env = FeatureLM(n_prompts=32)
    values = env.snapshot(env.init).values
    assert values["entropy_relevant"] == values["entropy_ordinary"] + values["entropy_fork"]


def test_format_decision_has_its_own_parameters():
    """pi(EOS | c) depends on c's format slot parameter only: any change of the task parameters (every column but
    EOS) leaves it as it was in every context, and one slot's parameter moves its own contexts' EOS only."""
    env = FeatureLM(n_prompts=16, vocab=32, env_seed=4)
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(env.init.shape) * env.trained
    task = np.zeros_like(theta)
    task[:, EOS + 1:] = 3.0 * rng.standard_normal((len(theta), env.vocab - 1))
    eos = tables(env.logits(theta))[1][:, EOS]
    moved = tables(env.logits(theta + task * env.trained))[1]
    np.testing.assert_allclose(moved[:, EOS], eos, rtol=1e-12)
    assert np.abs(moved[:, EOS + 1:] - tables(env.logits(theta))[1][:, EOS + 1:]).max() > 0.1
    slot = np.zeros_like(theta)
    slot[-1, EOS] = 1.0  # the last slot: off track at the last position
    changed = np.abs(tables(env.logits(theta + slot))[1][:, EOS] - eos) > 0
    assert np.flatnonzero(changed).tolist() == [env.n_rows - 1]


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_format_holds_under_rl_at_the_main_settings(algo):
    """At the main settings with beta 0 (DPO: its own beta, its preference temperature), a binary reward keeps its
    instruct format for 300 steps: at most 3% of responses malformed at every evaluated step, exactly, in every
    seed's draw, while the policy algorithms' accuracy rises (DPO's, offline on pairs sampled once from the reference
    policy, fell from 0.075 to 0.05 when measured). When the format shared the task's features, GRPO, Dr.GRPO,
    GSPO(-token), GMPO and SAPO rose to 65-83% malformed within 50 steps. Two held-out seeds in two environment
    draws, about 2 CPU-s an algorithm."""
    seeds = [101, 263]
    recs = run_stack("feature_lm", algo, seeds, 300, {} if algo == "dpo" else {"beta": 0.0},
                     draws=[s // 5 for s in seeds])
    for rs in recs:
        evaluated = [r for r in rs if r.get("malformed_exact") is not None]
        assert len(evaluated) == 31 and max(r["malformed_exact"] for r in evaluated) <= 0.03
        assert algo not in POLICY_ALGORITHMS or evaluated[0]["accuracy_exact"] < 0.15 < evaluated[-1]["accuracy_exact"]
