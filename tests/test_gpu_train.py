"""Every algorithm through the whole loop on a tiny random model (transformers engine); kill-and-resume is exact."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from gpu.config import from_dict
from gpu.train import Trainer
from gpu_helpers import EvenVerifier, tiny_config, tiny_path  # noqa: F401  (fixture)
from spec.registry import ALGORITHMS

ROOT = Path(__file__).parents[1]
KEYS = {"reward", "accuracy", "rur", "entropy", "len_mean", "gap_mean_abs", "tokens_per_s", "step_time_s",
        "peak_mem_mb", "loss", "grad_norm"}


def _metrics(run):
    return [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_runs_the_loop(algo, tmp_path, tiny_path):
    extra = {"dapo": {"algo": {"dynamic_sampling": True, "overlong_max_len": 10, "overlong_cache_len": 4}},
             "ppo": {"train": {"minibatch_size": 4}},
             "gspo": {"train": {"epochs": 2}}}.get(algo, {})
    tr = Trainer(from_dict(tiny_config(tmp_path / algo, algo, **extra)))
    if algo == "dapo":
        tr.verifier = EvenVerifier()  # mixed correctness from a random model, so dynamic sampling keeps groups
    before = {k: v.clone() for k, v in tr.model.named_parameters()}
    tr.fit()
    ms = _metrics(tr.out)
    assert [m["step"] for m in ms] == [1, 2]
    m = ms[-1]
    assert KEYS <= set(m) or (algo == "dpo" and {"loss", "pairs", "reward"} <= set(m)), sorted(m)
    assert all(v == v for v in m.values()), m  # no NaN
    assert m["gap_mean_abs"] < 1e-3  # generate's log-probs are the trainer's (same weights, float32)
    assert m["generated"] >= m["trained"] > 0
    changed = any(not torch.equal(before[k], v) for k, v in tr.model.named_parameters())
    assert changed, "an optimiser step must move the weights"
    if algo == "ppo":
        assert "value_loss" in m and m["value_loss"] > 0
    if algo == "dpo":
        assert m["pairs"] > 0
    assert (tr.out / "checkpoint" / "policy.safetensors").exists()


def test_lora_and_top_layers_train_only_what_they_should(tmp_path, tiny_path):
    raw = tiny_config(tmp_path / "lora", "grpo", steps=1,
                      model={"lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
                      algo={"hp": {"beta": 0.0}})
    tr = Trainer(from_dict(raw))
    names = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    tr.fit()
    raw = tiny_config(tmp_path / "top", "grpo", steps=1, model={"train_top_layers": 1}, algo={"hp": {"beta": 0.0}})
    tr = Trainer(from_dict(raw))
    trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert trainable and all(".layers.1." in n or n.endswith("norm.weight") for n in trainable)


def test_bf16_autocast_runs(tmp_path, tiny_path):
    tr = Trainer(from_dict(tiny_config(tmp_path / "bf16", "dr_grpo", steps=1, model={"dtype": "bfloat16"})))
    tr.fit()
    assert next(tr.model.parameters()).dtype == torch.float32  # fp32 master weights, bf16 compute
    assert _metrics(tr.out)[-1]["loss"] == _metrics(tr.out)[-1]["loss"]


def test_killed_run_resumes_exactly(tmp_path, tiny_path):
    raw = tiny_config(tmp_path / "killed", "dcpo", steps=6, run={"save_every": 2, "resume": True, "threads": 1})
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "HF_HUB_OFFLINE": "1"}
    code = f"from harness.runs.train import train_command; train_command({str(cfg_path)!r}, [])"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed: " + proc.stderr.read().decode()[-500:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 2 <= len(metrics.read_text().splitlines()) < 6
    resumed = Trainer(from_dict(raw))
    assert resumed.step in (2, 4)
    resumed.fit()
    clean_raw = {**raw, "run": {**raw["run"], "out_dir": str(tmp_path / "clean")}}
    clean = Trainer(from_dict(clean_raw))
    clean.fit()
    a, b = _metrics(tmp_path / "killed"), _metrics(tmp_path / "clean")
    assert [m["step"] for m in a] == list(range(1, 7))
    for x, y in zip(a, b):
        for k in ("reward", "loss", "rur", "len_mean", "grad_norm"):
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)
    wa = load_file(tmp_path / "killed" / "checkpoint" / "policy.safetensors")
    wb = load_file(tmp_path / "clean" / "checkpoint" / "policy.safetensors")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
    ha, hb = (json.loads((tmp_path / d / "checkpoint" / "state.json").read_text())["sas"]["history"]
              for d in ("killed", "clean"))
    assert ha and ha.keys() == hb.keys() and all(ha[k] == pytest.approx(hb[k]) for k in ha)


def test_resume_under_a_changed_config_is_refused_unless_allowed_and_then_recorded(tmp_path, tiny_path):
    raw = tiny_config(tmp_path / "run", "grpo", steps=1, run={"resume": True})
    Trainer(from_dict(raw)).fit()
    metrics = tmp_path / "run" / "metrics.jsonl"
    with metrics.open("a") as f:  # a kill while the next step's line was being written
        f.write('{"step": 2, "reward": 0.')
    changed = {**raw, "run": {**raw["run"], "steps": 2}, "algo": {**raw["algo"], "name": "dapo"},
               "train": {"lr": 2e-3}}
    with pytest.raises(ValueError, match=r"^run.out_dir: .* step 1 .*algo.name: 'grpo' -> 'dapo'; "
                                         r"train.lr: 0.001 -> 0.002\); pass --allow-config-change"):
        Trainer(from_dict(changed))
    assert not (tmp_path / "run" / "config_history.jsonl").exists()
    with pytest.warns(UserWarning, match=r"run/metrics.jsonl: dropped a half-written last line"):
        tr = Trainer(from_dict(changed), allow_config_change=True)
    tr.fit()
    assert [m["step"] for m in _metrics(tmp_path / "run")] == [1, 2]
    history = [json.loads(x) for x in (tmp_path / "run" / "config_history.jsonl").read_text().splitlines()]
    assert len(history) == 1 and history[0]["from_step"] == 1
    assert history[0]["changes"] == {"algo.name": ["grpo", "dapo"], "train.lr": [1e-3, 2e-3]}
    assert history[0]["previous"]["algo"]["name"] == "grpo"
    now = json.loads((tmp_path / "run" / "config.json").read_text())
    assert now["algo"]["name"] == "dapo" and now["train"]["lr"] == 2e-3
    longer = {**changed, "run": {**changed["run"], "steps": 3}}  # more steps is no change of what is trained
    Trainer(from_dict(longer)).fit()
    assert [m["step"] for m in _metrics(tmp_path / "run")] == [1, 2, 3]
    assert len((tmp_path / "run" / "config_history.jsonl").read_text().splitlines()) == 1


def test_config_changes_name_nested_fields_and_leave_out_what_does_not_change_training():
    from gpu.checkpoint import config_changes
    old = from_dict({"algo": {"name": "grpo"}}).to_dict()
    new = from_dict({"algo": {"name": "grpo", "hp": {"eps_high": 0.28}}, "run": {"steps": 99, "threads": 1}})
    assert config_changes(old, new.to_dict()) == {"algo.hp.eps_high": [None, 0.28]}
    assert config_changes(old, from_dict({}).to_dict()) == {}


def test_an_out_dir_that_is_a_file_is_named_before_the_model_loads(tmp_path, tiny_path, monkeypatch):
    import gpu.train

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before run.out_dir was checked")
    monkeypatch.setattr(gpu.train, "load_policy", no_model)
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "run"):
        with pytest.raises(ValueError, match=f"^run.out_dir: {tmp_path / 'f'} is a file"):
            Trainer(from_dict(tiny_config(out, "grpo")))


@pytest.mark.parametrize("advantage", ["rloo", "gpg", "reinforce_pp", "reinforce_pp_baseline"])
def test_the_new_advantages_train(advantage, tmp_path, tiny_path):
    """RLOO, GPG and REINFORCE++ (with its k1 reward term, so the reference model is loaded) in the real loop."""
    algo = {"advantage": advantage, "hp": {"beta": 0.0}, "kl_reward_coef": 0.05}
    tr = Trainer(from_dict(tiny_config(tmp_path / advantage, "grpo", steps=1, algo=algo)))
    tr.fit()
    m = _metrics(tr.out)[-1]
    assert tr.ref is not None and all(v == v for v in m.values()), m
    assert json.loads((tr.out / "config.json").read_text())["resolved"]["advantage"] == advantage


@pytest.mark.parametrize("algo,agg", [("dapo", "token_mean"), ("grpo", None), ("dcpo", None)])
def test_gradient_accumulation_gives_the_whole_batch_gradient(algo, agg, tmp_path, tiny_path):
    """Micro-batches of one group each, weighted by their share of the aggregation's units, accumulate the
    gradient of the whole batch at once (same seed, same rollouts). Unequal shares are covered, without a
    model, by tests/test_gpu_accumulation.py."""
    grads = []
    for accum in (1, 2):
        raw = tiny_config(tmp_path / f"{algo}{accum}", algo, steps=1, train={"grad_accum": accum},
                          rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 10, "temperature": 1.5},
                          algo={"hp": {} if agg is None else {"agg": agg}})
        tr = Trainer(from_dict(raw))
        seen = []
        step = tr._optim_step

        def record(step=step, tr=tr, seen=seen):
            seen.append(torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None]))
            return step()
        tr._optim_step = record
        tr.fit()
        grads.append(seen[0])
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-7)


def test_an_exponent_without_a_dot_is_a_number_in_a_config_and_in_set(tmp_path):
    """YAML 1.1 (PyYAML's safe_load) reads 1e6 as a string; the config reads it as YAML 1.2 does, a float."""
    from gpu.config import load_config
    path = tmp_path / "c.yaml"
    path.write_text("algo: {name: grpo, hp: {eps_high: 1e6}}\ntrain: {lr: 2E-5}\n")
    cfg = load_config(path)
    assert cfg.algo.hp["eps_high"] == 1e6 and cfg.train.lr == 2e-5
    cfg = load_config(path, ["algo.hp.eps_high=1e6", "algo.hp.eps_low=1.5e-1", "run.out_dir=1e6x"])
    assert cfg.algo.hp["eps_high"] == 1e6 and cfg.algo.hp["eps_low"] == 0.15 and cfg.run.out_dir == "1e6x"


def test_the_schedule_counts_updates_and_on_policy_tokens(tmp_path, tiny_path):
    """2 epochs x 2 minibatches: 4 updates a batch; the first is made by the sampler itself (r = 1), so the on-policy
    share of token updates is the first minibatch's tokens over twice the batch's, strictly between 0 and 1/2."""
    raw = tiny_config(tmp_path / "r", "grpo", steps=1, train={"epochs": 2, "minibatch_size": 4}, run={"threads": 1})
    m = Trainer(from_dict(raw)).train_step()
    assert m["updates_per_batch"] == 4 and m["staleness"] == 0 and 0 < m["on_policy_frac"] < 0.5
    assert m["decision_dev_q50"] is not None and m["zero_adv_frac"] is not None


def test_a_schedule_that_cannot_clip_warns_naming_its_keys(tmp_path, tiny_path, caplog):
    Trainer(from_dict(tiny_config(tmp_path / "r", "grpo", steps=1, run={"threads": 1})))
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("train.epochs / train.minibatch_size: one optimiser update per rollout") and "\n" not in line
    caplog.clear()
    Trainer(from_dict(tiny_config(tmp_path / "q", "grpo", steps=1, train={"staleness": 1}, run={"threads": 1})))
    assert not caplog.records
    with pytest.raises(ValueError, match=r"^train.staleness: expected at most .* = 2, got 3"):
        from_dict(tiny_config(tmp_path / "s", "grpo", train={"minibatch_size": 4, "staleness": 3}))


def test_staleness_samples_from_the_policy_k_updates_old_and_resumes_exactly(tmp_path, tiny_path):
    """train.staleness 1 with 2 updates a batch: each batch after the first is sampled by the weights the model had
    after the previous batch's first update, and pi_old is that sampler's (the engine's log-probs match it, the
    current policy's ratios do not start at 1). Resumed from a checkpoint, the run continues exactly."""
    raw = tiny_config(tmp_path / "run", "grpo", steps=3, run={"save_every": 1, "threads": 1},
                      train={"minibatch_size": 4, "staleness": 1}, algo={"hp": {"beta": 0.0}})
    tr = Trainer(from_dict(raw))
    assert tr.engine.model is tr.sampler and tr.sampler is not tr.model
    after, sampled = [], []
    step, generate = tr._optim_step, tr.engine.generate

    def record_update():
        out = step()
        after.append([p.detach().clone() for p in tr.model.parameters()])
        return out

    def record_sampler(*args, **kwargs):
        sampled.append([p.detach().clone() for p in tr.engine.model.parameters()])
        return generate(*args, **kwargs)
    tr._optim_step, tr.engine.generate = record_update, record_sampler
    tr.fit()
    ms = _metrics(tmp_path / "run")
    assert len(after) == 6 and [m["staleness"] for m in ms] == [0, 1, 1]
    for k in (1, 2):  # batch k's sampler: the weights after update 2k - 1 (the previous batch's first)
        assert all(torch.equal(a, b) for a, b in zip(sampled[k], after[2 * k - 2]))
        assert not all(torch.equal(a, b) for a, b in zip(sampled[k], after[2 * k - 1]))
    assert ms[0]["on_policy_frac"] > 0 and ms[1]["on_policy_frac"] == ms[2]["on_policy_frac"] == 0
    assert all(m["gap_mean_abs"] < 1e-4 for m in ms)  # pi_old is the sampler's, as the engine sampled
    assert ms[1]["ratio_dev_median"] > 1e-4  # the policy one update ahead of its sampler
    short = {**raw, "run": {**raw["run"], "out_dir": str(tmp_path / "resumed"), "steps": 1, "resume": True}}
    Trainer(from_dict(short)).fit()
    Trainer(from_dict({**short, "run": {**short["run"], "steps": 3}})).fit()
    for x, y in zip(ms, _metrics(tmp_path / "resumed")):
        for k in ("reward", "loss", "ratio_dev_median", "grad_norm", "staleness"):
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)


def test_pi_old_recomputed_by_the_policy_leaves_a_stale_samplers_mismatch_to_a_rollout_correction(tmp_path, tiny_path):
    """train.old_logp 'policy' (verl's recompute): the engine's log-probs are the stale sampler's, pi_old the policy's
    at the batch's first update, so the two differ and TIS weighs the difference; 'sampler' leaves none."""
    gaps = {}
    for old in ("policy", "sampler"):
        raw = tiny_config(tmp_path / old, "grpo", steps=2, train={"minibatch_size": 4, "staleness": 1, "old_logp": old},
                          algo={"hp": {"beta": 0.0, "rollout_correction": "tis"}}, run={"threads": 1})
        Trainer(from_dict(raw)).fit()
        ms = _metrics(tmp_path / old)
        assert ms[1]["staleness"] == 1 and "rc_weight_mean" in ms[1]
        gaps[old] = ms[1]["gap_mean_abs"]
    assert gaps["policy"] > 1e-3 > 1e-4 > gaps["sampler"]
