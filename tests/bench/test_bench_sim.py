"""pytest-benchmark for the simulator: one step per algorithm, one tabular update through the sim against the same
update through the gpu layer on the CPU (and how both grow with prompts P, group size G and length T), and the
default comparison (every algorithm, 5 seeds, 300 steps, toy LM). Run with `make bench`."""
import numpy as np
import pytest
import torch

import gpu
from sim import optim, policy_loss, toy_lm
from sim.advantages import group_advantages
from sim.loop import Trainer
from sim.sweep import run_sweep
from sim.tabular import CORRECT, logit_grad, row_logp, sample, tables
from spec.registry import ALGORITHMS

SIZES = [(16, 8, 16), (64, 8, 16), (16, 32, 16), (16, 8, 64), (64, 32, 64)]  # (P, G, T)


def _setup(p, g, t):
    aut, logits, _ = toy_lm.build(n_prompts=p, max_len=t)
    ro = sample(aut, tables(logits), np.arange(p), g, np.random.default_rng(0))
    adv = group_advantages((ro.outcome == CORRECT).astype(float), g)
    adv = np.broadcast_to(adv[:, None], ro.mask.shape) * ro.mask
    ref_lp = np.where(ro.mask > 0, ro.old_logp - 0.01, 0.0)
    return logits, ro, adv, ref_lp, g


def update_sim(logits, opt, ro, adv, ref_lp, g):
    logp, visited = row_logp(logits, ro.states, ro.tokens, ro.mask)
    _, grad, _ = policy_loss("grpo", logp, ro.old_logp, adv, ro.mask, group_size=g, ref_logp=ref_lp)
    opt.step(*logit_grad(ro.tokens, ro.mask, visited, grad))


def update_gpu(z, opt, t):
    opt.zero_grad()
    logp = torch.log_softmax(z, 1)[t["states"], t["tokens"]] * t["mask"]
    loss, _ = gpu.policy_loss("grpo", logp, t["old"], t["adv"], t["mask"], group_size=t["g"], ref_logp=t["ref"])
    loss.backward()
    opt.step()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "P{}_G{}_T{}".format(*s))
def test_update_sim(benchmark, size):
    logits, ro, adv, ref_lp, g = _setup(*size)
    params = logits.copy()
    opt = optim.Adam(params, 1e-3)
    benchmark(update_sim, params, opt, ro, adv, ref_lp, g)
    assert np.isfinite(params).all()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "P{}_G{}_T{}".format(*s))
def test_update_gpu_layer_on_cpu(benchmark, size):
    logits, ro, adv, ref_lp, g = _setup(*size)
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([z], lr=1e-3)
    t = {"states": torch.as_tensor(ro.states), "tokens": torch.as_tensor(ro.tokens), "mask": torch.as_tensor(ro.mask),
         "old": torch.as_tensor(ro.old_logp), "adv": torch.as_tensor(adv), "ref": torch.as_tensor(ref_lp), "g": g}
    benchmark(update_gpu, z, opt, t)
    assert torch.isfinite(z).all()


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_step(benchmark, algo):
    trainer = Trainer("toy_lm", algo, 0)
    rec, = benchmark(trainer.step)
    assert 0 <= rec["entropy"]


@pytest.mark.parametrize("env", ["toy_lm", "feature_lm"])
@pytest.mark.parametrize("stacked", [True, False], ids=["five_seeds_stacked", "five_seeds_alone"])
def test_five_seeds_step(benchmark, env, stacked):
    """One GRPO step of five seeds: one stacked trainer against five trainers (a sweep's two ways to run them)."""
    trainers = [Trainer(env, "grpo", list(range(5)))] if stacked else [Trainer(env, "grpo", s) for s in range(5)]
    recs = benchmark(lambda: [rec for t in trainers for rec in t.step()])
    assert len(recs) == 5


def test_default_comparison(benchmark, tmp_path):
    """The full comparison: every algorithm, 5 seeds, 300 steps, toy LM, 2 processes (about half a minute)."""
    if benchmark.disabled:
        pytest.skip("takes about a minute; runs under `make bench`")
    counter = iter(range(10**6))

    def once():
        return run_sweep("toy_lm", list(ALGORITHMS), 5, 300, out=str(tmp_path / f"s{next(counter)}"), workers=2,
                         progress=False)
    summary = benchmark.pedantic(once, rounds=1, iterations=1)
    assert len(summary["algorithms"]) == len(ALGORITHMS)
