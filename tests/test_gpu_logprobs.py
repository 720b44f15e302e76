"""Chunked log-probs and entropy equal the plain computation (values and gradients), and on a real model forward."""
import math

from gpu_helpers import tiny_path  # noqa: F401  (fixture)

import pytest
import torch

from gpu.logprobs import chunked_logprobs, plain_logprobs, sequence_logprobs


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_equals_plain_values_and_grads(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 16, generator=g, requires_grad=True)
    w = torch.randn(300, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 300, (50,), generator=g)
    lp, en = chunked_logprobs(h, w, y, chunk=chunk, temperature=0.7)
    lp0, en0 = plain_logprobs(h, w, y, temperature=0.7)
    torch.testing.assert_close(lp, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(en, en0, rtol=1e-4, atol=1e-4)
    gh, gw = torch.autograd.grad((lp * 1.3).sum() + en.sum(), (h, w))
    gh0, gw0 = torch.autograd.grad((lp0 * 1.3).sum() + en0.sum(), (h, w))
    torch.testing.assert_close(gh, gh0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, gw0, rtol=1e-4, atol=1e-5)


def test_entropy_of_uniform_is_log_vocab_and_logprobs_normalise():
    h = torch.zeros(3, 8)
    w = torch.randn(97, 8)
    lp, en = chunked_logprobs(h, w, torch.tensor([0, 5, 96]), chunk=2)
    assert torch.allclose(lp, torch.full((3,), -math.log(97)))
    assert torch.allclose(en, torch.full((3,), math.log(97)))
    # summing exp(logp) over every possible target gives 1
    h = torch.randn(1, 8)
    all_lp, _ = chunked_logprobs(h.expand(97, 8), w, torch.arange(97), chunk=10)
    assert abs(all_lp.exp().sum().item() - 1) < 1e-5


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="chunk"):
        chunked_logprobs(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long), chunk=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match="hidden/targets"):
        chunked_logprobs(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long))


def test_sequence_logprobs_match_full_forward(tiny_path):
    from gpu.models import load_policy
    model = load_policy(tiny_path)
    ids = torch.randint(3, 500, (2, 9))
    att = torch.ones_like(ids)
    att[1, 7:] = 0
    comp = torch.zeros_like(ids)
    comp[0, 4:] = 1
    comp[1, 3:7] = 1
    lp, en = sequence_logprobs(model, ids, att, comp, chunk=3)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits[:, :-1].float(), -1)
    ref = full.gather(-1, ids[:, 1:, None]).squeeze(-1) * comp[:, 1:]
    torch.testing.assert_close(lp.detach(), ref, rtol=1e-4, atol=1e-5)
    assert (lp[comp[:, 1:] == 0] == 0).all() and (en[comp[:, 1:] == 1] > 0).all()
