"""TRL's GRPOTrainer with cliplab's losses: the loss it optimises is gpu.policy_loss (exact spec values), it trains
a tiny model end to end, and bad settings fail before a model is built."""
import os

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

import spec  # noqa: E402
from harness.conform.cases import Batch  # noqa: E402
from harness.conform.targets.trl import make_trainer, trl_run  # noqa: E402


@pytest.fixture(scope="module")
def plugin():
    from harness.conform.targets.trl import _import_trl
    _import_trl()  # TRL without its optional vLLM client
    from gpu.integrations import trl_plugin
    return trl_plugin


@pytest.mark.parametrize("algorithm, hparams", [("dcpo", {}), ("dapo", {"agg": "token_mean"}),
                                                ("gspo", {}), ("sapo", {}), ("grpo", {"beta": 0.04}),
                                                ("dr_grpo", {})])
def test_the_trainer_optimises_cliplabs_loss(plugin, algorithm, hparams):
    config = {"beta": 0.04} if hparams.get("beta") else {}
    trainer = make_trainer(plugin.CliplabGRPOTrainer, {"algorithm": algorithm, "hparams": hparams}, **config)
    rng = np.random.default_rng(5)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], float)
    log_ratio = rng.normal(0, 0.3, mask.shape)
    adv = np.repeat(rng.normal(size=(4, 1)), 4, 1)
    b = Batch(np.zeros_like(mask), -log_ratio, adv, mask, rng.normal(0, 0.3, mask.shape), 2,
              {"ids": rng.integers(0, 60, mask.shape)})
    loss, grad, used = trl_run(trainer)(b)
    hp = {"max_len": 8, **hparams} if algorithm == "dr_grpo" else hparams
    e_loss, e_grad = spec.policy_loss(algorithm, used.logp, used.old_logp, used.adv, used.mask, group_size=2,
                                      ref_logp=used.ref_logp, **hp)
    assert loss == pytest.approx(float(e_loss), rel=1e-6, abs=1e-9)
    assert grad == pytest.approx(e_grad.astype(float), rel=1e-6, abs=1e-9)


def test_two_training_steps_on_a_tiny_model(plugin):
    def reward(completions, **kwargs):  # longer completions score higher: some groups are not all-equal
        return [float(len(c)) for c in completions]
    trainer = make_trainer(plugin.CliplabGRPOTrainer, {"algorithm": "dcpo", "hparams": {}}, reward=reward,
                           freeze=False, max_steps=2, learning_rate=1e-2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    out = trainer.train()
    assert out.global_step == 2 and np.isfinite(out.training_loss)
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.model.parameters()))


def test_bad_settings_fail_before_a_model_is_built(plugin):
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        plugin.CliplabGRPOTrainer(algorithm="nope")
    with pytest.raises(ValueError, match="unknown aggregation mode 'sum'"):
        plugin.CliplabGRPOTrainer(algorithm="dapo", hparams={"agg": "sum"})
    with pytest.raises(ValueError, match="beta > 0 needs reference log-probs"):
        make_trainer(plugin.CliplabGRPOTrainer, {"algorithm": "grpo", "hparams": {"beta": 0.04}})


def test_accumulated_micro_batches_and_processes_give_the_gradient_of_one(tmp_path):
    """One optimiser step on a global batch of 8 completions (4 groups of 2; 17 tokens spread unevenly, an empty
    completion and an empty group): 2 processes (``accelerate launch``, gloo DDP) with 2 accumulated micro-batches
    each, and 1 process with 4 accumulated micro-batches, give the gradient of 1 process on the whole batch in one
    micro-batch, for a token mean, a mean over sequences and both group means (tests/trl_ddp_worker.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    runs = ["dapo:token_mean", "grpo", "dapo", "dcpo"]
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    worker = str(repo / "tests" / "trl_ddp_worker.py")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              str(29500 + os.getpid() % 1000), worker, str(tmp_path), "two:2", *runs]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in (launch, [sys.executable, worker, str(tmp_path), "one:1,accum:4", *runs])]
    for p in procs:
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out[-3000:]
    one, two, accum = (torch.load(tmp_path / f"{name}.pt") for name in ("one", "two", "accum"))
    for run in runs:  # TRL's log-probs are float32: agreement to float32 rounding, relative to the whole gradient
        a = torch.cat([g.flatten() for g in one[run].values()])
        for other in (two, accum):
            b = torch.cat([g.flatten() for g in other[run].values()])
            assert float(a.norm()) > 0 and float((a - b).norm() / a.norm()) < 1e-5, (run, float((a - b).norm()))


def test_each_micro_batch_is_weighted_by_its_share_of_its_steps_units(plugin):
    """P * u / U: U summed over the step's micro-batches (weigh_windows) and the processes (a stand-in for
    accelerate's reduce: the other process holds micro-batches with the same units)."""
    from types import SimpleNamespace
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])  # 7 tokens, 2 rows, 1 group of 2
    other = torch.tensor([[1.0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])  # 2 tokens, 1 row, 1 group
    cases = [("token_mean", None, 2 * 7 / 18, 2 * 2 / 18), ("seq_mean_token_mean", None, 2 * 2 / 6, 2 * 1 / 6),
             ("group_token_mean", 2, 2 * 1 / 4, 2 * 1 / 4)]  # (mode, G, the two micro-batches' shares)
    acc = SimpleNamespace(num_processes=2, reduce=lambda t, reduction: 2 * t)
    for agg, group_size, share, share_other in cases:
        fake = SimpleNamespace(accelerator=acc, cliplab_agg=agg, cliplab_group_size=group_size,
                               args=SimpleNamespace(gradient_accumulation_steps=2),
                               _loss_mask=plugin.CliplabGRPOTrainer._loss_mask)
        batches = [{"completion_mask": mask}, {"completion_mask": other}]
        plugin.CliplabGRPOTrainer.weigh_windows(fake, batches)
        got = [float(plugin.CliplabGRPOTrainer._share(fake, b["completion_mask"], b)) for b in batches]
        assert got == pytest.approx([share, share_other])


def test_the_shuffle_moves_whole_groups(plugin):
    ids = torch.arange(12)
    out = plugin.shuffle_whole_groups({"ids": ids, "texts": [f"r{i}" for i in range(12)], "n": torch.tensor(3),
                                       "none": None}, 3)
    groups = out["ids"].reshape(4, 3)
    assert sorted(out["ids"].tolist()) == list(range(12)) and out["n"] == 3 and out["none"] is None
    assert (groups % 3 == torch.arange(3)).all() and (groups[:, 1:] - groups[:, :-1] == 1).all()
    assert out["texts"] == [f"r{i}" for i in out["ids"].tolist()]


def sas_trainer(plugin, tmp_path, seen, **config):
    """DCPO on the tiny model with two prompts per step, one group of 2 each, in two micro-batches (accumulated):
    a prompt's first group scores [1, 0], its later ones [1, 1]."""
    from datasets import Dataset

    def reward(prompts, completions, **kwargs):
        out = []
        for i in range(0, len(prompts), 2):
            out += [1.0, 1.0] if prompts[i] in seen else [1.0, 0.0]
        seen.update(prompts)
        return out
    trainer = make_trainer(plugin.CliplabGRPOTrainer, {"algorithm": "dcpo", "hparams": {}}, reward=reward,
                           freeze=False, gradient_accumulation_steps=2, output_dir=str(tmp_path), **config)
    trainer.train_dataset = Dataset.from_dict({"prompt": ["t1 t2 t3", "t4 t5"]})
    trained = []
    original = trainer._compute_loss

    def compute_loss(model, inputs):
        trained.append((trainer.state.global_step, inputs["advantages"].detach().clone()))
        return original(model, inputs)
    trainer._compute_loss = compute_loss
    return trainer, trained


def test_dcpo_trains_with_sas_history_across_steps_and_resumes_it(plugin, tmp_path):
    """Step 1 visits both prompts first ([1, 0]: SAS = GRPO's z-score with the population std, +-1); step 2 revisits
    them all-equal ([1, 1]): pooled mean 3/4, variance (0 + 1/4) / 2 + (1/4)(1/2)^2 = 3/16, so both responses get
    A_total / 2 = (1 - 3/4) / sqrt(3/16) / 2 where TRL's z-score gives 0 (DCPO Eq. 11-12). A run resumed from the
    step-1 checkpoint continues the history (cliplab_sas.json in checkpoint-1)."""
    want = (1 - 3 / 4) / (3 / 16) ** 0.5 / 2
    seen: set = set()
    trainer, trained = sas_trainer(plugin, tmp_path, seen, max_steps=2, save_strategy="steps", save_steps=1)
    trainer.train()
    first = torch.cat([a for step, a in trained if step == 0])
    second = torch.cat([a for step, a in trained if step == 1])
    assert sorted(first.tolist()) == pytest.approx([-1, -1, 1, 1], abs=1e-6)
    assert second.tolist() == pytest.approx([want] * 4, rel=1e-6)
    assert list(trainer._logs["advantages"]) == pytest.approx([want] * 4, rel=1e-6)  # the completions log's too
    assert (tmp_path / "checkpoint-1" / plugin.SAS_STATE).is_file()

    resumed, trained = sas_trainer(plugin, tmp_path, seen, max_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert torch.cat([a for _, a in trained]).tolist() == pytest.approx([want] * 4, rel=1e-6)
    os.remove(tmp_path / "checkpoint-1" / plugin.SAS_STATE)
    again, _ = sas_trainer(plugin, tmp_path, seen, max_steps=2)
    with pytest.raises(ValueError, match=f"{plugin.SAS_STATE}: missing"):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
