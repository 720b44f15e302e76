"""Where a user callable's worker runs: a fork of cliplab's process (torch imported once), or a fresh interpreter for
a "module:function" once the caller has initialised CUDA (which a fork cannot use); both give the same loss."""
import numpy as np
import torch

from harness.conform.cases import batch_of
from harness.conform.targets.callable import CallableTarget

SOURCE = '''import torch


def token_mean_ppo(logp, old_logp, advantages, mask):
    r = torch.exp(logp - old_logp)
    per_token = -torch.min(r * advantages, torch.clamp(r, 0.8, 1.2) * advantages)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)
'''


def run_once(name):
    target = CallableTarget(name, {"algorithm": "ppo"})
    try:
        return target.runner.worker.handlers is None, target.run(batch_of(1, "typical"))
    finally:
        target.close()


def test_a_module_function_runs_in_a_fork_unless_cuda_is_initialised(tmp_path, monkeypatch):
    (tmp_path / "start_losses.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    fresh, (loss, grad, _) = run_once("start_losses:token_mean_ppo")
    assert not fresh and np.isfinite(loss)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    fresh, (loss_fresh, grad_fresh, _) = run_once("start_losses:token_mean_ppo")
    assert fresh and loss_fresh == loss and np.array_equal(grad_fresh, grad)
