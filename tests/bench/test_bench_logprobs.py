"""pytest-benchmark: chunked against plain log-prob + entropy (forward and backward through the output layer) at the
vocabularies of SmolLM2 (49,152) and Qwen2.5 (151,936); time per call and the extra peak memory, measured in a fresh
process. `make bench` runs 2,048 tokens at the real hidden sizes; `make test` runs 64 tokens at hidden 64 once,
untimed, as a correctness check."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu.logprobs import chunked_logprobs, plain_logprobs

SHAPES = {49152: 576, 151936: 896}  # vocab -> hidden size (SmolLM2-135M, Qwen2.5-0.5B)
FNS = {"chunked": chunked_logprobs, "plain": plain_logprobs}
ROOT = Path(__file__).parents[2]

_PEAK = """
import json, resource, sys, torch
from gpu.logprobs import chunked_logprobs, plain_logprobs
kind, n, h, v = sys.argv[1], *map(int, sys.argv[2:5])
torch.manual_seed(0)
x = torch.empty(n, h).normal_().requires_grad_(); w = torch.empty(v, h).normal_(std=0.02).requires_grad_()
y = torch.randint(0, v, (n,))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lp, en = (chunked_logprobs if kind == "chunked" else plain_logprobs)(x, w, y)
(lp.sum() + en.sum()).backward()
print(json.dumps({"extra_peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


def _inputs(n, vocab, h):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=g, requires_grad=True)
    w = (torch.randn(vocab, h, generator=g) * 0.02).requires_grad_()
    return x, w, torch.randint(0, vocab, (n,), generator=g)


def _step(kind, x, w, y):
    x.grad = w.grad = None
    lp, en = FNS[kind](x, w, y)
    (lp.sum() + en.sum()).backward()
    return lp.detach(), en.detach(), x.grad


def peak_extra_mb(kind: str, n: int, vocab: int) -> float:
    """Extra peak RSS (MiB) of one forward+backward, in a fresh Python process."""
    out = subprocess.run([sys.executable, "-c", _PEAK, kind, str(n), str(SHAPES[vocab]), str(vocab)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["extra_peak_mb"]


@pytest.mark.parametrize("vocab", list(SHAPES))
@pytest.mark.parametrize("kind", list(FNS))
def test_logprobs_forward_backward(benchmark, kind, vocab):
    n, h = (64, 64) if benchmark.disabled else (2048, SHAPES[vocab])
    x, w, y = _inputs(n, vocab, h)
    lp, en, gx = benchmark.pedantic(_step, args=(kind, x, w, y), rounds=1 if benchmark.disabled else 2)
    lp0, en0, gx0 = _step("plain", x, w, y) if kind == "chunked" else (lp, en, gx)
    torch.testing.assert_close(lp, lp0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gx, gx0, rtol=1e-4, atol=1e-5)
    if not benchmark.disabled:
        benchmark.extra_info.update(tokens=n, vocab=vocab, extra_peak_mb=peak_extra_mb(kind, n, vocab))
