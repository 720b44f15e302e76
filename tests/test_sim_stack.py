"""Stacked seeds: a trainer over several seeds, in one environment draw or several, gives each seed exactly the
numbers of its run alone, and each part it is built from (per-block aggregation and loss terms, StepClips,
optimisers, stacked automata and environments, per-copy random draws, the sweep's jobs) equals the same part applied
to each block alone."""
import json

import numpy as np
import pytest

from harness.verify.cases import make_case
from sim import loop, optim, sweep, toy_lm
from sim.aggregation import agg_weights
from sim.feature_lm import FeatureLM
from sim.losses import policy_terms
from sim.metrics import StepClips
from sim.tabular import Automaton, exact, exact_copies, tables, uniforms
from spec.contract import resolve_hparams
from spec.registry import AGG_MODES, ALGORITHMS, POLICY_ALGORITHMS, get_algorithm

SMALL = {"n_prompts": 16, "batch_prompts": 4, "group_size": 4, "minibatches": 2}


@pytest.mark.parametrize("env", ["toy_lm", "feature_lm", "bandit"])
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_stacked_seeds_equal_their_runs_alone(env, algo):
    seeds = [3, 0, 7]
    alone = [loop.run(env, algo, s, 5, SMALL) for s in seeds]
    assert loop.run_stack(env, algo, seeds, 5, SMALL) == alone


@pytest.mark.parametrize("env", ["toy_lm", "feature_lm", "bandit"])
@pytest.mark.parametrize("algo", ["grpo", "dapo", "ppo", "dpo", "sapo"])
def test_seeds_stacked_across_environment_draws_have_the_bytes_of_their_runs_in_each_draw(env, algo):
    seeds, draws = [3, 0, 7, 4], [2, 0, 2, 1]
    alone = [loop.run(env, algo, s, 5, {**SMALL, "env_seed": d}) for s, d in zip(seeds, draws)]
    stacked = loop.run_stack(env, algo, seeds, 5, SMALL, draws=draws)
    assert [json.dumps(run) for run in stacked] == [json.dumps(run) for run in alone]
    assert json.dumps(alone[1]) != json.dumps(loop.run(env, algo, 0, 5, {**SMALL, "env_seed": 2}))  # draws differ


@pytest.mark.parametrize("draws", [[0], [0, 1, -1], [0.5, 1, 2], "012"])
def test_bad_draws_name_the_argument(draws):
    with pytest.raises(ValueError, match="^draws:"):
        loop.run_stack("toy_lm", "grpo", [0, 1, 2], 2, SMALL, draws=draws)


@pytest.mark.parametrize("env,algo,over,differ", [
    # dynamic sampling: copies keep different numbers of groups, some none (untrained), so their Adam counts part
    ("toy_lm", "dapo", {"n_prompts": 16, "batch_prompts": 2, "group_size": 2, "ds_max_rounds": 1}, "trained"),
    ("feature_lm", "dapo", {"n_prompts": 24, "batch_prompts": 8, "ds_max_rounds": 2, "optimizer": "sgd",
                            "momentum": 0.5, "lr": 0.3}, "trained"),
    # DPO: copies with different numbers of preference pairs train apart
    ("toy_lm", "dpo", {"n_prompts": 12, "batch_prompts": 12, "group_size": 4, "minibatches": 3, "reward": "random"},
     "trained"),
    # stale, noisy rollouts with a correction, and PPO's critic
    ("feature_lm", "grpo", {**SMALL, "staleness": 1, "rollout_noise": 0.2, "rollout_correction": "seq_mis"}, "loss"),
    ("toy_lm", "ppo", {**SMALL, "epochs": 3, "minibatches": 4, "reward_kl": 0.05}, "loss"),
])
def test_stacked_seeds_equal_their_runs_alone_when_their_batches_differ(env, algo, over, differ):
    seeds = [0, 1, 2]
    alone = [loop.run(env, algo, s, 12, over) for s in seeds]
    assert any(len({run[i][differ] for run in alone}) > 1 for i in range(12))  # the copies do part
    assert loop.run_stack(env, algo, seeds, 12, over) == alone


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_policy_terms_over_blocks_equal_each_block_alone(name, agg):
    cases = [make_case(seed, prompts=2, group_size=3, length=4) for seed in (11, 12, 13)]
    extra = {"cov_seed": [5, 6, 7]} if ALGORITHMS[name].select == "clip_cov" else {}  # a seed per block
    hp = {**resolve_hparams(name, {"agg": agg, "max_len": 4, "beta": 0.04}), **extra}  # with the KL term
    alg = get_algorithm(name)
    stack = [np.concatenate([getattr(c, f) for c in cases]) for f in ("logp", "old_logp", "adv", "mask", "ref_logp")]
    loss, grad, stats = policy_terms(alg, hp, *stack[:4], 3, stack[4], blocks=3)
    for i, c in enumerate(cases):
        one = {**hp, "cov_seed": extra["cov_seed"][i]} if extra else hp
        l1, g1, s1 = policy_terms(alg, one, c.logp, c.old_logp, c.adv, c.mask, 3, c.ref_logp)
        assert loss[i] == l1[0] and np.array_equal(grad[6 * i:6 * (i + 1)], g1)
        assert {k: v[i] for k, v in stats.items()} == {k: v[0] for k, v in s1.items()}


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_policy_terms_without_the_shown_stats_keep_every_other_number(name):
    """The simulator's call leaves out ratio_mean and kl_mean and changes no other bit."""
    c = make_case(21, prompts=2, group_size=3, length=4)
    hp = resolve_hparams(name, {"beta": 0.04, "cov_seed": 5, "max_len": 4})
    args = (get_algorithm(name), hp, c.logp, c.old_logp, c.adv, c.mask, 3, c.ref_logp)
    (loss, grad, stats), (l1, g1, s1) = policy_terms(*args), policy_terms(*args, shown_stats=False)
    assert np.array_equal(loss, l1) and np.array_equal(grad, g1)
    assert {k: v for k, v in stats.items() if k not in ("ratio_mean", "kl_mean")} == s1 and "ratio_mean" in stats


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregation_weights_over_blocks_normalise_each_block(agg):
    masks = [make_case(seed, prompts=2, group_size=2, length=5).mask for seed in range(3)]
    masks[1][:] = 0.0  # a block with no tokens at all gets weight 0
    w = agg_weights(np.concatenate(masks), agg, 2, 5, blocks=3)
    for i, m in enumerate(masks):
        assert np.array_equal(w[4 * i:4 * (i + 1)], agg_weights(m, agg, 2, 5))


def test_step_clips_over_blocks_equal_each_block_alone():
    cases = [make_case(seed, prompts=2, group_size=2, length=4) for seed in (3, 4)]
    both = StepClips("dcpo", resolve_hparams("dcpo", {}), blocks=2)
    alone = [StepClips("dcpo", resolve_hparams("dcpo", {})) for _ in cases]
    for _ in range(2):  # two updates of the same step
        both.add(*(np.concatenate([getattr(c, f) for c in cases]) for f in ("logp", "old_logp", "adv", "mask")))
        for clips, c in zip(alone, cases):
            clips.add(c.logp, c.old_logp, c.adv, c.mask)
    assert both.summary() == [clips.summary()[0] for clips in alone]


@pytest.mark.parametrize("name,kw", [("adam", {}), ("sgd", {"momentum": 0.9})])
def test_blocked_optimisers_step_only_the_copies_listed_each_with_its_own_count(name, kw):
    rng = np.random.default_rng(0)
    params = rng.standard_normal((6, 3))
    copies = [params[2 * c:2 * (c + 1)].copy() for c in range(3)]
    both = optim.make(name, params, 0.1, 3, **kw)
    alone = [optim.make(name, p, 0.1, **kw) for p in copies]
    for only in ([0, 1, 2], [1], [0, 2], [0, 1, 2], [2], [0, 1, 2]):
        grad = rng.standard_normal((6, 3))
        both.step(grad, only=only)
        for c in only:
            alone[c].step(grad[2 * c:2 * (c + 1)])
    assert np.array_equal(params, np.concatenate(copies))
    if name == "adam":
        assert both.t.tolist() == [4, 4, 5]


def test_a_stacked_automaton_evaluates_each_copy_exactly_in_its_own_draw():
    built = [toy_lm.build(n_prompts=5, max_len=7, env_seed=draw) for draw in (2, 3, 2)]
    rng = np.random.default_rng(1)
    per_copy = [init + rng.standard_normal(init.shape) for _, init, _ in built]
    stacked = exact_copies(Automaton.stack([aut for aut, _, _ in built]), tables(np.concatenate(per_copy)))
    for ex, logits, (aut, _, _) in zip(stacked, per_copy, built):
        one = exact(aut, tables(logits))
        for field in ("entropy", "accuracy", "length", "len_correct", "len_wrong"):
            assert getattr(ex, field) == pytest.approx(getattr(one, field), rel=1e-12)
        assert np.array_equal(ex.visits, one.visits) and np.array_equal(ex.success, one.success)


def test_a_stacked_feature_lm_samples_differentiates_and_evaluates_each_copy_as_alone_in_its_draw():
    draws = [FeatureLM(n_prompts=6, vocab=16, n_features=4, env_seed=s) for s in (0, 1)]
    both = FeatureLM.stack(draws)
    rng = np.random.default_rng(0)
    thetas = [0.5 * rng.standard_normal(draws[0].init.shape) for _ in range(2)]
    prompts = [np.array([4, 1]), np.array([0, 5])]
    ro = both.sample(np.concatenate(thetas), np.concatenate([prompts[0], prompts[1] + 6]), 3,
                     [np.random.default_rng(s) for s in (7, 8)])
    g = np.random.default_rng(3).standard_normal(ro.mask.shape) * ro.mask
    logp, rows = both.rows(np.concatenate(thetas), ro.states, ro.tokens, ro.mask)
    grad, _ = both.grad(np.concatenate(thetas), ro.states, ro.tokens, ro.mask, rows, g)
    snaps = both.snapshots(np.concatenate(thetas))
    for c, alone in enumerate(draws):
        one = alone.sample(thetas[c], prompts[c], 3, np.random.default_rng(7 + c))
        part = slice(6 * c, 6 * (c + 1))
        assert np.array_equal(one.tokens, ro.tokens[part]) and np.array_equal(one.old_logp, ro.old_logp[part])
        assert np.array_equal(one.states + c * alone.n_rows * one.mask.astype(int), ro.states[part])
        lp1, rows1 = alone.rows(thetas[c], one.states, one.tokens, one.mask)
        assert np.array_equal(lp1, logp[part])
        g1, _ = alone.grad(thetas[c], one.states, one.tokens, one.mask, rows1, g[part])
        assert np.array_equal(g1, grad[len(g1) * c:len(g1) * (c + 1)])
        assert np.array_equal(alone.ref_logp(one.states, one.tokens, one.mask),
                              both.ref_logp(ro.states[part], ro.tokens[part], ro.mask[part]))
        on = one.mask > 0  # padding sits at state 0, copy 0's first context
        assert np.array_equal(alone.at_fork(one.states)[on], both.at_fork(ro.states[part])[on])
        snap = alone.snapshot(thetas[c])
        assert snaps[c].values == snap.values and np.array_equal(snaps[c].success, snap.success)
    assert not np.array_equal(draws[0].base, draws[1].base)  # two environments, not one


def test_uniforms_draw_each_copys_block_from_its_own_generator():
    got = uniforms([np.random.default_rng(1), np.random.default_rng(2)], 6, 3)
    assert np.array_equal(got, np.concatenate([np.random.default_rng(s).random((3, 3)) for s in (1, 2)]))
    assert np.array_equal(uniforms(np.random.default_rng(4), 5), np.random.default_rng(4).random(5))


def test_a_sweep_runs_each_labels_seeds_over_every_draw_as_one_job_dynamic_sampling_first():
    tasks = sweep.plan("toy_lm", ["grpo", "dapo", "dpo"], 12, 5, {})  # seeds 0-11: three environment draws
    grouped = sweep.jobs(tasks)
    assert [job[0]["label"] for job in grouped] == ["dapo", "grpo", "dpo"]
    for job in grouped:
        assert len({t["label"] for t in job}) == 1 and [t["seed"] for t in job] == list(range(12))
        assert {t["settings"]["env_seed"] for t in job} == {0, 1, 2}
    shared = sweep.jobs(tasks, workers=2)  # the last label's seeds shared by the two workers
    assert [[t["seed"] for t in job] for job in shared] == [list(range(12))] * 2 + [list(range(6)),
                                                                                    list(range(6, 12))]


@pytest.mark.parametrize("labels,workers,sizes", [(1, 2, [10, 10]), (1, 3, [6, 7, 7]), (2, 3, [10, 10, 10, 10]),
                                                  (3, 3, [20, 20, 20])])
def test_fewer_labels_than_workers_share_each_labels_seeds_among_them(labels, workers, sizes):
    tasks = sweep.plan("bandit", ["grpo", "dr_grpo", "gspo"][:labels], 20, 5, {})
    grouped = sweep.jobs(tasks, workers)
    assert [len(job) for job in grouped] == sizes
    assert sorted(t["id"] for job in grouped for t in job) == sorted(t["id"] for t in tasks)  # each task once


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_sweep_with_every_run_done_has_no_job(workers):
    assert sweep.jobs([], workers) == []  # a resumed sweep whose runs are all done


@pytest.mark.parametrize("seeds", [[], [1, -1], [0.5], "0"])
def test_bad_seed_lists_name_the_argument(seeds):
    with pytest.raises(ValueError, match="^seeds:"):
        loop.run_stack("toy_lm", "grpo", seeds, 2, SMALL)


@pytest.mark.parametrize("n,parts", [(1, 1), (5, 2), (7, 3), (8, 8), (3, 5), (16, 4)])
def test_minibatch_chunks_are_numpys_array_split(n, parts):
    from sim.loop import _chunks
    order = np.random.default_rng(n).permutation(n)
    got, want = _chunks(order, parts), np.array_split(order, min(parts, n))
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("name,kw", [("adam", {}), ("sgd", {"momentum": 0.9})])
def test_a_gradient_given_on_its_rows_steps_as_the_full_one(name, kw):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 3))
    b = a.copy()
    full_opt, rows_opt = optim.make(name, a, 0.1, 2, **kw), optim.make(name, b, 0.1, 2, **kw)
    for only in (None, None, [1], None):  # a step of one copy alone too
        rows = np.sort(rng.choice(6, 3, replace=False))
        grad = rng.standard_normal((3, 3))
        full = np.zeros((6, 3))
        full[rows] = grad
        full_opt.step(full, only=only)
        rows_opt.step(grad, rows, only=only)
    assert np.array_equal(a, b)
