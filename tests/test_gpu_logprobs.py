"""Chunked log-probs and entropy equal the plain computation (values and gradients), and on a real model forward."""
import math

from gpu_helpers import tiny_path  # noqa: F401  (fixture)

import pytest
import torch

from gpu.logprobs import chunked_logprobs, plain_logprobs, sequence_logprobs


def _inputs(n=50, vocab=300, hidden=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, hidden, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(vocab, generator=g, dtype=dtype, requires_grad=True)
    return h, w, b, torch.randint(0, vocab, (n,), generator=g)


def _grads(fn, h, w, b, y, with_entropy, **kw):
    lp, en = fn(h, w, y, bias=b, temperature=0.7, **kw)
    loss = (lp * 1.3).sum() + (en * torch.linspace(-1, 2, len(en), dtype=en.dtype)).sum() * with_entropy
    return (lp, en) + torch.autograd.grad(loss, (h, w, b))


# (vocab, chunk): one token per chunk, several, all at once, and a vocabulary sliced in the backward over token blocks
@pytest.mark.parametrize("vocab,chunk", [(300, 1), (300, 7), (300, 64), (300, 1000), (5000, 7)])
@pytest.mark.parametrize("entropy", [True, False])
def test_chunked_equals_plain_values_and_grads(vocab, chunk, entropy):
    h, w, b, y = _inputs(vocab=vocab)
    got = _grads(chunked_logprobs, h, w, b, y, entropy, chunk=chunk, entropy=entropy)
    ref = _grads(plain_logprobs, h, w, b, y, entropy)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-4, atol=1e-4)
    for a, r in zip(got[2:], ref[2:]):  # d/dh, d/dW, d/db
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)
    assert chunked_logprobs(h, w, y, chunk=chunk, entropy=entropy)[1].requires_grad == entropy


def test_chunked_is_as_accurate_as_plain_against_float64():
    """Both float32 paths sit within float32 rounding of the float64 computation: the chunked one no further than
    twice the plain one's error or 8 rounding units of the largest logit."""
    h, w, b, y = _inputs(vocab=5000)
    exact = _grads(plain_logprobs, *(t.detach().double().requires_grad_() for t in (h, w, b)), y, True)
    err = {name: [float((a.double() - e).detach().abs().max()) for a, e in zip(_grads(fn, h, w, b, y, True), exact)]
           for name, fn in (("chunked", lambda *a, **k: chunked_logprobs(*a, chunk=7, **k)), ("plain", plain_logprobs))}
    unit = float((h @ w.T + b).detach().abs().max() / 0.7) * torch.finfo(torch.float32).eps
    for c, p in zip(err["chunked"], err["plain"]):
        assert c <= max(2 * p, 8 * unit), (err, unit)


def test_autocast_bf16_matches_plain_and_keeps_dtypes():
    """Under bf16 autocast the matmuls run in bf16 as F.linear's would; gradients come back in the inputs' dtypes."""
    h, w, b, y = _inputs()
    h = h.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _grads(lambda *a, **k: chunked_logprobs(*a, chunk=7, **k), h, w, b, y, True)
        ref = _grads(plain_logprobs, h, w, b, y, True)
    assert [t.dtype for t in got] == [t.dtype for t in ref] == [torch.float32] * 2 + [torch.bfloat16] + [torch.float32] * 2
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)  # the same bf16 logits, then float32
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)
    for a, r in zip(got[2:], ref[2:]):  # bf16 products: equal to bf16 rounding of the largest entry
        torch.testing.assert_close(a.float(), r.float(), rtol=0, atol=4 * 2**-8 * float(r.abs().max()))


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


def test_no_tokens_gives_empty_outputs_and_zero_gradients():
    h, w, b, y = _inputs(n=0)
    lp, en = chunked_logprobs(h, w, y, bias=b)
    assert lp.shape == en.shape == (0,)
    gh, gw, gb = torch.autograd.grad(lp.sum() + en.sum(), (h, w, b), allow_unused=True)
    assert gh.shape == (0, 16) and not gw.any() and not gb.any()


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


def _groups_batch(prompts, group, vocab, seed=0):
    """Right-padded prompt + completion rows, ``group`` rows per prompt, completions of random lengths 1..7."""
    g = torch.Generator().manual_seed(seed)
    rows = [(p, torch.randint(3, vocab, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist())
            for p in prompts for _ in range(group)]
    width = max(len(p) + len(c) for p, c in rows)
    ids, att, comp = (torch.zeros(len(rows), width, dtype=torch.long) for _ in range(3))
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        att[i, :len(p) + len(c)] = 1
        comp[i, len(p):len(p) + len(c)] = 1
    return ids, att, comp


@pytest.mark.parametrize("entropy_weight", [0.0, 1.0])
def test_shared_prompts_equal_the_full_forward_values_and_grads(tiny_path, entropy_weight):
    """Rows that repeat a prompt (groups) share one prompt pass; log-probs, entropies and every parameter's gradient
    equal those of the whole rows through the model (the output layer evaluated the same way, on the same tokens)."""
    from gpu.logprobs import _shared_prompts
    from gpu.models import backbone, load_policy, output_layer
    model = load_policy(tiny_path).train()
    ids, att, comp = _groups_batch([[5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26]], 3, 500)
    assert _shared_prompts(ids, att, comp) is not None  # the shared path is the one under test

    def full_rows():
        h = backbone(model)(input_ids=ids, attention_mask=att).last_hidden_state[:, :-1]
        sel, head = comp[:, 1:].bool(), output_layer(model)
        lp, en = chunked_logprobs(h[sel], head.weight, ids[:, 1:][sel], bias=head.bias)
        return (torch.zeros(sel.shape).masked_scatter(sel, lp), torch.zeros(sel.shape).masked_scatter(sel, en))

    out = []
    for fn in (full_rows, lambda: sequence_logprobs(model, ids, att, comp)):
        model.zero_grad()
        lp, en = fn()
        (1.3 * lp.sum() + entropy_weight * en.sum()).backward()
        out.append((lp.detach(), en.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp, en, grads), (ref_lp, ref_en, ref_grads) = out[1], out[0]
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(en, ref_en, rtol=1e-5, atol=1e-5)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


def test_shared_prompts_only_for_repeated_prompts_with_contiguous_completions():
    from gpu.logprobs import _shared_prompts
    ids, att, comp = _groups_batch([[5, 6, 7], [8, 9]], 1, 500)
    assert _shared_prompts(ids, att, comp) is None  # every prompt once: nothing to share
    ids, att, comp = _groups_batch([[5, 6, 7], [8, 9]], 2, 500)
    plen, owner, first = _shared_prompts(ids, att, comp)
    assert plen.tolist() == [3, 3, 2, 2] and owner.tolist() == [0, 0, 1, 1] and first.tolist() == [0, 2]
    comp[0, 3] = 0
    comp[0, 2] = 1  # a completion that is not one contiguous span after its prompt: the rows run whole
    assert _shared_prompts(ids, att, comp) is None
