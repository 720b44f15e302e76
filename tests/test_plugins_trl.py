"""TRL's GRPOTrainer with cliplab's losses: the loss it optimises is gpu.policy_loss (exact spec values), it trains
a tiny model end to end, and bad settings fail before a model is built."""
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


def test_two_processes_give_the_gradient_of_one(tmp_path):
    """``accelerate launch`` with 2 CPU processes (gloo DDP): after one backward on a global batch whose halves hold
    7 and 3 tokens (and 2 and 1 non-empty completions), the averaged gradient equals one process's on the whole
    batch, for a token mean, a mean over sequences and both group means (tests/trl_ddp_worker.py)."""
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
              str(29500 + os.getpid() % 1000), worker, str(tmp_path), "two", *runs]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in (launch, [sys.executable, worker, str(tmp_path), "one", *runs])]
    for p in procs:
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out[-3000:]
    one, two = (torch.load(tmp_path / f"{name}.pt") for name in ("one", "two"))
    for run in runs:  # TRL's log-probs are float32: agreement to float32 rounding, relative to the whole gradient
        a, b = (torch.cat([g.flatten() for g in grads[run].values()]) for grads in (one, two))
        assert float(a.norm()) > 0 and float((a - b).norm() / a.norm()) < 1e-5, (run, float((a - b).norm() / a.norm()))


def test_each_process_is_weighted_by_its_share_of_units(plugin):
    """P * u_p / sum_q u_q, with the other process's units given by a stand-in for accelerate's reduce."""
    from types import SimpleNamespace
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])  # 7 tokens, 2 rows, 1 group of 2 here
    cases = [("token_mean", None, 3.0, 2 * 7 / 10), ("seq_mean_token_mean", None, 1.0, 2 * 2 / 3),
             ("group_token_mean", 2, 1.0, 1.0)]  # (mode, G, the other process's units, the share)
    for agg, group_size, other, share in cases:
        acc = SimpleNamespace(num_processes=2, reduce=lambda t, reduction, o=other: t + o)
        got = plugin.CliplabGRPOTrainer._process_share(SimpleNamespace(accelerator=acc), mask, agg, group_size)
        assert float(got) == pytest.approx(share)
