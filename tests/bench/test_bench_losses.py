"""pytest-benchmark: sim.policy_loss and gpu.policy_loss at 1024 x 1024 for every algorithm, beside plain
loop-free PPO-clip references (run with `make bench`; `make test` runs each once, untimed)."""
import pytest
import torch

from harness.runs.bench import batch, plain_numpy, plain_torch, run_gpu, run_sim
from spec.registry import POLICY_ALGORITHMS

B = batch(1024, 1024)


def fresh():
    return {k: torch.from_numpy(v.copy()) for k, v in B.items()}


def test_plain_numpy(benchmark):
    loss, grad = benchmark(plain_numpy, B)
    assert grad.shape == (1024, 1024)


def test_plain_torch(benchmark):
    benchmark.pedantic(plain_torch, setup=lambda: ((fresh(),), {}), rounds=5)


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_sim(benchmark, name):
    loss, grad, stats = benchmark(run_sim, name, B)
    assert grad.shape == (1024, 1024) and 0 <= stats["clip_frac"] <= 1


@pytest.mark.parametrize("name", POLICY_ALGORITHMS)
def test_gpu(benchmark, name):
    loss = benchmark.pedantic(lambda t: run_gpu(name, t), setup=lambda: ((fresh(),), {}), rounds=5)
    assert torch.isfinite(loss)
