"""The RL loop: every algorithm runs, determinism, DAPO's sampling, GSPO = GSPO-token, PPO's critic, bad configs."""
import numpy as np
import pytest

from sim import config
from sim.loop import Diverged, Trainer, build_env, run, run_stack
from sim.tabular import exact, tables
from spec.registry import ALGORITHMS

SMALL = {"n_prompts": 16, "batch_prompts": 4, "group_size": 4}


@pytest.mark.parametrize("env", ["toy_lm", "bandit"])
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_runs_with_sane_metrics(env, algo):
    recs = run(env, algo, 0, 4, SMALL)
    for r in recs:
        assert 0 <= r["entropy"] <= np.log(8) + 1e-12  # 8 tokens (toy LM) or 8 arms (bandit) by default
        assert r["kl_ref"] >= -1e-12 and 0 <= r["accuracy_exact"] <= 1 and 0 <= r["accuracy"] <= 1
        for key in ("clip_frac", "rur", "zero_grad_frac"):
            assert r[key] is None or 0 <= r[key] <= 1
        assert (r["gen_per_trained"] is None) == (algo == "dpo") or r["trained"] == 0
    assert recs[0]["kl_ref"] == pytest.approx(0, abs=1e-12)  # the policy starts at the reference
    assert recs[-1]["kl_ref"] > 0


def test_runs_are_deterministic_per_seed():
    a = run("toy_lm", "dcpo", 7, 6, SMALL)
    b = run("toy_lm", "dcpo", 7, 6, SMALL)
    c = run("toy_lm", "dcpo", 8, 6, SMALL)
    assert a == b
    assert a != c


def test_gspo_and_gspo_token_train_identically():
    """GSPO Eq. 13-14: with a constant advantage per sequence, GSPO-token has GSPO's value and gradient."""
    a = run("toy_lm", "gspo", 1, 8, SMALL)
    b = run("toy_lm", "gspo_token", 1, 8, SMALL)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == (None if y[k] is None else pytest.approx(y[k], rel=1e-9, abs=1e-12)), k


def test_dynamic_sampling_trains_only_mixed_groups_and_counts_generations():
    t = Trainer("toy_lm", "dapo", [0, 1, 2], {**SMALL, "n_prompts": 32})  # three seeds stacked
    for _ in range(20):
        seen, batches = t._collect(t.params)
        for copies, ro, r in batches:
            correct = (ro.outcome == 1).reshape(-1, 4)
            assert np.all(correct.any(1) & ~correct.all(1))  # 0 < #correct < G in every trained group
            groups = len(ro.prompts) // len(copies)  # copies batched together kept as many groups
            assert groups <= 4 and len(set(ro.prompts.tolist())) == len(ro.prompts)
            assert all(ro.prompts[i * groups:(i + 1) * groups].min() >= c * 32 for i, c in enumerate(copies))
            assert all(len(seen[c][1]) >= groups * 4 for c in copies)
        for rec in t.step():
            if rec["trained"]:
                assert rec["gen_per_trained"] == pytest.approx(rec["generated"] / rec["trained"])
                assert rec["gen_per_trained"] >= 1


def test_dynamic_sampling_oversamples_by_whole_rounds():
    t = Trainer("toy_lm", "dapo", 0, {**SMALL, "n_prompts": 32, "ds_oversample": 2.0})
    for _ in range(5):
        rec, = t.step()
        assert rec["generated"] % (8 * 4) == 0 and rec["generated"] <= 32 * 4 and rec["trained"] <= 4 * 4


def test_dapo_overlong_shaping_follows_eq13():
    t = Trainer("toy_lm", "dapo", 0, SMALL)
    (ro, _), = t._collect(t.params)[0]
    from sim.loop import rewards_of
    shaped = rewards_of(ro, t.cfg)
    plain = rewards_of(ro, {**t.cfg, "overlong": False})
    lmax, cache = t.cfg["max_len"], t.cfg["overlong_cache"]
    expected = np.where(ro.lengths <= lmax - cache, 0.0, (lmax - cache - ro.lengths) / cache)
    np.testing.assert_allclose(shaped - plain, expected)


def test_ppo_critic_learns_the_success_probability():
    """With gamma = 1 and a 0/1 terminal reward, V(start of prompt p) estimates p's success probability."""
    t = Trainer("toy_lm", "ppo", 0, {"n_prompts": 16, "batch_prompts": 8, "lr": 0.01, "critic_lr": 0.05})
    for _ in range(150):
        t.step()
    success = exact(t.aut, tables(t.logits)).success
    v_start = t.values[t.aut.start]
    assert np.corrcoef(v_start, success)[0, 1] > 0.9
    assert np.abs(v_start - success).mean() < 0.15


def test_dpo_prefers_the_chosen_responses():
    t = Trainer("toy_lm", "dpo", 0, SMALL)
    before = exact(t.aut, tables(t.logits)).accuracy
    for _ in range(40):
        t.step()
    assert exact(t.aut, tables(t.logits)).accuracy > before


def test_any_setting_is_overridable():
    t = Trainer("toy_lm", "grpo", 0, {"eps_high": 0.28, "beta": 0.0, "agg": "token_mean", "optimizer": "sgd",
                                      "lr": 0.5, "reward": "ternary", "adv": "dr_grpo"})
    assert t.cfg["loss"]["eps_high"] == 0.28 and t.cfg["loss"]["agg"] == "token_mean"
    assert t.cfg["adv"] == "dr_grpo" and type(t.opt).__name__ == "SGD"
    t.step()


@pytest.mark.parametrize("env,algo,over,field", [
    ("atari", "grpo", {}, "env"),
    ("toy_lm", "reinforce", {}, "algos"),
    ("toy_lm", "grpo", {"learning_rate": 0.1}, "set"),
    ("bandit", "grpo", {"max_len": 8}, "set"),
    ("toy_lm", "grpo", {"group_size": 1}, "group_size"),
    ("toy_lm", "dcpo", {"group_size": 1}, "group_size"),
    ("toy_lm", "dpo", {"group_size": 1}, "group_size"),
    ("toy_lm", "grpo", {"batch_prompts": 100, "n_prompts": 10}, "batch_prompts"),
    ("toy_lm", "grpo", {"group_size": 0}, "group_size"),
    ("toy_lm", "grpo", {"max_len": 2}, "max_len"),
    ("toy_lm", "grpo", {"minibatches": 32}, "minibatches"),
    ("toy_lm", "grpo", {"reward": "gold"}, "reward"),
    ("toy_lm", "grpo", {"adv": "vtrace"}, "adv"),
    ("toy_lm", "grpo", {"eps_low": -0.1}, "eps_low"),
    ("toy_lm", "grpo", {"agg": "sum"}, "agg"),
    ("toy_lm", "grpo", {"lr": 0}, "lr"),
    ("toy_lm", "grpo", {"optimizer": "lion"}, "optimizer"),
    ("toy_lm", "dapo", {"overlong_cache": 99}, "overlong_cache"),
    ("toy_lm", "dpo", {"eps_high": 0.3}, "set"),
    ("bandit", "grpo", {"n_arms": 1}, "n_arms"),
])
def test_bad_configs_name_the_field(env, algo, over, field):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        Trainer(env, algo, 0, over)


def test_ppo_runs_with_a_single_response_per_prompt():
    recs = run("toy_lm", "ppo", 0, 2, {**SMALL, "group_size": 1})
    assert len(recs) == 2


@pytest.mark.parametrize("text,expected", [
    (["lr=0.01,0.05", "epochs=2"], {"lr": [0.01, 0.05], "epochs": [2]}),
    (["overlong=false", "dual_clip=None", "agg=token_mean"], {"overlong": [False], "dual_clip": [None],
                                                              "agg": ["token_mean"]}),
])
def test_parse_sets(text, expected):
    assert config.parse_sets(text) == expected


@pytest.mark.parametrize("bad", [["lr"], ["=3"], ["lr="], ["lr=1", "lr=2"]])
def test_parse_sets_rejects_malformed_items(bad):
    with pytest.raises(ValueError, match="^set:"):
        config.parse_sets(bad)


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="^steps:"):
        run("toy_lm", "grpo", 0, 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow on the way, before the check stops it
def test_parameters_that_diverge_stop_the_run_with_an_error_naming_lr():
    """SGD at lr 10 on 16 updates a batch sends feature_lm's parameters past the floats at its first step: an
    error naming lr and the seeds, not metrics of NaN (written as None) or a silent accuracy 0."""
    with pytest.raises(Diverged, match=r"^lr: the policy's parameters left the finite numbers at step 0 \(seed\(s\) "
                       r"0, 1; sgd, lr 10\); expected a smaller lr$"):
        run_stack("feature_lm", "grpo", [0, 1], 5, {"optimizer": "sgd", "lr": 10.0, "minibatches": 16,
                                                     "epochs": 4, "n_features": 32})
    assert issubclass(Diverged, ValueError)  # so that cliplab prints it as a one-line error (exit 2)
    recs = run_stack("feature_lm", "grpo", [0, 1], 5, {"optimizer": "sgd", "lr": 1.0})  # a finite run goes on
    assert all(r["accuracy"] is not None and np.isfinite(r["accuracy"]) for seed in recs for r in seed)


@pytest.mark.parametrize("env", ["bandit", "toy_lm", "feature_lm"])
def test_runs_share_one_read_only_environment_per_setting(env):
    a, b = Trainer(env, "grpo", 0), Trainer(env, "grpo", 1)
    assert a.env is b.env
    assert Trainer(env, "grpo", 0, {"env_seed": 1}).env is not a.env
    arrays = [v for v in vars(a.env).values() if isinstance(v, np.ndarray)]
    assert arrays and not any(x.flags.writeable for x in arrays)
    with pytest.raises(ValueError, match="read-only"):
        arrays[0][...] = 0
    a.step(), b.step()  # training writes only its own parameters
    assert a.params.flags.writeable and build_env(env, a.cfg) is a.env
