"""The config schemas (gpu and sim): every setting has a Rule; values drawn over the schema are accepted inside it
and refused outside it with a one-line ValueError that names the key; accepted values run; the known bad values
of the reliability audit fail at load time, and the CLI says `error: ...` with exit code 2."""
import dataclasses
import json
import math
import re
from typing import Union, get_args, get_origin, get_type_hints

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpu import config as gcfg
from gpu_helpers import tiny_config, tiny_path  # noqa: F401  (fixture)
from harness.cli import app
from sim import config as scfg
from sim.loop import run as sim_run
from spec.schema import Rule

ONE_LINE = re.compile(r"^[\w.\-]+: [^\n]+$")


def _lo(rule):
    return rule.ge if rule.ge is not None else rule.gt


def _hi(rule):
    return rule.le if rule.le is not None else rule.lt


def valid(rule: Rule, cap: float | None = None):
    """Values the rule accepts (numbers capped at ``cap`` for runs that must stay small)."""
    if rule.choices:
        s = st.sampled_from(rule.choices)
    elif rule.type is bool:
        s = st.booleans()
    elif rule.type is int:
        lo = rule.ge if rule.ge is not None else None if rule.gt is None else rule.gt + 1
        hi = rule.le if rule.le is not None else None if rule.lt is None else rule.lt - 1
        if cap is not None:
            hi = min(hi, max(cap, lo)) if hi is not None else max(cap, lo)
        s = st.integers(lo, hi)
    elif rule.type is float:
        hi = _hi(rule) if cap is None else min(x for x in (_hi(rule), cap) if x is not None)
        s = st.floats(_lo(rule), hi, exclude_min=rule.gt is not None, exclude_max=rule.lt is not None,
                      allow_nan=False, allow_infinity=False)
    elif rule.type is str:
        s = st.text(min_size=1).filter(str.strip)
    else:
        s = st.just({})
    return st.one_of(st.none(), s) if rule.optional else s


def invalid(rule: Rule):
    """Values the rule refuses: wrong types, NaN and infinities, numbers just outside the range, other words."""
    bad = [st.just([1]), st.just(object())]
    if not rule.optional:
        bad.append(st.none())
    if rule.choices:
        bad.append(st.text().filter(lambda s: s not in rule.choices))
    elif rule.type in (int, float):
        bad += [st.sampled_from([math.nan, math.inf, -math.inf, "abc", True, "Infinity", "NaN"])]
        if rule.type is int:
            bad.append(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)))
        lo, hi = _lo(rule), _hi(rule)
        if lo is not None:
            bad.append(st.just(lo if rule.gt is not None else lo - 1))
            bad.append(st.floats(-1e300, lo, exclude_max=True) if rule.type is float else st.integers(max_value=lo - 1))
        if hi is not None:
            bad.append(st.just(hi if rule.lt is not None else hi + 1))
            bad.append(st.floats(hi, 1e300, exclude_min=True) if rule.type is float else st.integers(min_value=hi + 1))
    elif rule.type is bool:
        bad.append(st.sampled_from([0, 1, "yes", "true", 1.0]))
    elif rule.type is str:
        bad += [st.just(""), st.just("   "), st.integers()]
    else:
        bad.append(st.text())
    return st.one_of(bad)


GPU = gcfg.schema()
SIM = {env: scfg.schema(env) for env in scfg.ENVS}


def _nested(key, value):
    section, name = key.split(".")
    return {section: {name: value}}


# -- the schemas are complete -----------------------------------------------------------------------------------

def test_every_gpu_field_has_a_rule_of_its_type_and_its_default_passes():
    default = gcfg.Config()
    for sec in dataclasses.fields(gcfg.Config):
        hints = get_type_hints(sec.default_factory)
        for f in dataclasses.fields(sec.default_factory):
            rule = f.metadata["rule"]
            hint = hints[f.name]
            if get_origin(hint) is Union:
                hint = next(t for t in get_args(hint) if t is not type(None))
                assert rule.optional, f.name
            assert rule.type is hint, (sec.name, f.name)
            value = getattr(getattr(default, sec.name), f.name)
            assert rule.check(f"{sec.name}.{f.name}", value) == value


def test_every_sim_setting_has_a_rule_and_its_default_passes():
    for env in scfg.ENVS:
        for algo in scfg.ALGO_SETTINGS:
            cfg = scfg.resolve(env, algo)
            for key, rule in SIM[env].items():
                assert rule.check(key, cfg[key]) == cfg[key]
    assert set(SIM["toy_lm"]) == set(scfg.SETTINGS) | set(scfg.ENV_SETTINGS["toy_lm"])


# -- generated values over the schemas --------------------------------------------------------------------------

@settings(max_examples=400, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_gpu_values_outside_a_rule_are_refused_naming_the_field(data):
    key = data.draw(st.sampled_from(sorted(GPU)))
    value = data.draw(invalid(GPU[key]))
    with pytest.raises(ValueError) as e:
        gcfg.from_dict(_nested(key, value))
    assert str(e.value).startswith(f"{key}:") and ONE_LINE.match(str(e.value)), str(e.value)


@settings(max_examples=150, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_gpu_values_inside_a_rule_are_kept_or_refused_by_a_named_cross_check(data):
    key = data.draw(st.sampled_from(sorted(GPU)))
    value = data.draw(valid(GPU[key]))
    assert GPU[key].check(key, value) == value
    try:
        cfg = gcfg.from_dict(_nested(key, value))
    except ValueError as e:  # a value that depends on another field, or a name that must exist
        section = str(e).split(":")[0].split(".")[0]
        assert ONE_LINE.match(str(e)) and section in ("model", "data", "algo", "train", "run"), e
    else:
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value


@settings(max_examples=400, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_sim_values_outside_a_rule_are_refused_naming_the_key(data):
    env = data.draw(st.sampled_from(scfg.ENVS))
    key = data.draw(st.sampled_from(sorted(SIM[env])))
    value = data.draw(invalid(SIM[env][key]))
    algo = data.draw(st.sampled_from(list(scfg.ALGO_SETTINGS)))
    with pytest.raises(ValueError) as e:
        scfg.resolve(env, algo, {key: value})
    assert str(e.value).startswith(f"{key}:") and ONE_LINE.match(str(e.value)), str(e.value)


SMALL = {"n_prompts": 12, "batch_prompts": 4, "group_size": 4, "epochs": 2, "minibatches": 4, "ds_max_rounds": 3,
         "ds_oversample": 3, "max_len": 8, "n_think": 4, "n_answers": 6, "n_arms": 8, "overlong_cache": 8}


@settings(max_examples=60, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_sim_configs_drawn_inside_the_schema_run_with_finite_metrics(data):
    env = data.draw(st.sampled_from(scfg.ENVS))
    algo = data.draw(st.sampled_from(list(scfg.ALGO_SETTINGS)))
    keys = data.draw(st.lists(st.sampled_from(sorted(SIM[env])), max_size=6, unique=True))
    over = {k: data.draw(valid(SIM[env][k], cap=SMALL.get(k)), label=k) for k in keys}
    over = {k: v for k, v in over.items() if v is not None}
    try:
        scfg.resolve(env, algo, over)
    except ValueError as e:  # a cross-field check (e.g. batch_prompts > n_prompts) names its key
        assert ONE_LINE.match(str(e)) and str(e).split(":")[0] in SIM[env], e
        return
    records = sim_run(env, algo, seed=0, steps=2, overrides=over)
    values = [v for r in records for v in r.values() if isinstance(v, float)]
    assert values and np.isfinite(values).all()


# -- the audit's cases ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("adv_eps", math.nan), ("adv_eps", -5), ("adv_eps", -0.5), ("env_seed", "abc"), ("ds_oversample", math.inf),
    ("reward_kl", math.nan), ("momentum", "fast"), ("lr", 1e308), ("beta", math.inf)])
def test_sim_audit_values_fail_at_load_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"^{key}: "):
        scfg.resolve("toy_lm", "dpo" if key == "beta" else "ppo", {key: value})


@pytest.mark.parametrize("item", ["train.lr=.inf", "train.lr=.nan", "train.lr=1e308", "train.max_grad_norm=.nan",
                                  "rollout.temperature=.nan", "run.seed=abc", "model.device=bogus",
                                  "model.name=/no/such/model", "model.lora={bogus_key: 1}", "model.lora={r: -1}",
                                  "model.tiny={heads: 3}", "algo.gamma=.nan", "data.ops=/"])
def test_gpu_audit_values_fail_at_load_naming_the_field(tmp_path, item):
    p = tmp_path / "c.yaml"
    p.write_text("algo: {name: grpo}\n")
    with pytest.raises(ValueError) as e:
        gcfg.load_config(p, [item])
    key = item.split("=")[0]
    assert str(e.value).startswith(key) and ONE_LINE.match(str(e.value)), str(e.value)


@pytest.mark.parametrize("text, words", [
    ("", "holds no settings"), ("# only a comment\n", "holds no settings"), ("{}\n", "holds no settings"),
    ("run: {steps: 3\n", "not valid YAML (line 2"), ("run: !!python/object/apply:os.system [ls]\n", "not valid YAML"),
    ("- a list\n", "must be a mapping")])
def test_bad_config_files_are_one_line_errors(tmp_path, text, words):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        gcfg.load_config(p)
    assert str(e.value).startswith("config: ") and words in str(e.value) and "\n" not in str(e.value)


def test_a_set_value_that_does_not_parse_names_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo: {name: grpo}\n")
    for item in ("train.lr={a", "train.lr=!!python/object/apply:os.system [ls]"):
        with pytest.raises(ValueError, match=r"^--set train.lr: not valid YAML"):
            gcfg.load_config(p, [item])


def test_cli_prints_one_error_line_and_exits_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["sim", "--set", "adv_eps=nan", "--out", str(tmp_path / "s"), "--steps", "2"])
    assert res.exit_code == 2 and "error: adv_eps: expected a finite number" in res.output
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    res = runner.invoke(app, ["train", "--config", str(empty)])
    assert res.exit_code == 2 and "error: config: " in res.output and "holds no settings" in res.output
    assert "Traceback" not in res.output


def test_in_range_extremes_train_without_nan(tmp_path, tiny_path):
    from gpu.train import Trainer
    raw = tiny_config(tmp_path / "extreme", "grpo", steps=2, rollout={"temperature": 1e-3},
                      train={"lr": 1.0, "weight_decay": 1.0, "max_grad_norm": 1e300})
    tr = Trainer(gcfg.from_dict(raw))
    tr.fit()
    ms = [json.loads(x) for x in (tr.out / "metrics.jsonl").read_text().splitlines()]
    assert len(ms) == 2 and all(math.isfinite(v) for m in ms for v in m.values()
                                if v is not None)  # None: a mean over an empty subset (no wrong answer)
