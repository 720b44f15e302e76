"""Per-token log-probs and entropy through the output layer in tiles, never holding [tokens x vocab] logits.

A custom autograd function keeps only the per-token log-sum-exp and entropy from its forward pass; its backward
recomputes each tile of logits once and forms the gradients of log pi(y) and of the entropy w.r.t. the logits in
closed form, then w.r.t. the hidden states, the output weight and its bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .models import backbone, output_layer

LOGITS_BUDGET = 1 << 22  # logits elements per tile (16 MiB in float32) when no chunk size is given
MIN_VOCAB_SLICE = 2048  # tiles span at least this many vocabulary rows (or all of them)


def auto_chunk(vocab: int) -> int:
    """Tokens' worth of logits per tile so that one tile holds about LOGITS_BUDGET elements."""
    return max(16, LOGITS_BUDGET // max(vocab, 1))


def _compute_dtype(hidden, weight):
    """The dtype F.linear would compute in: autocast's when it is on, else the promoted input dtype."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _cast(t, dtype):
    return None if t is None else t.to(dtype)


def _logits(h, w, b, temperature, shift):
    """(h w^T + b) / T - shift[:, None] in float32; in float32 the scale and shift ride in the matmul (addmm)."""
    if h.dtype == torch.float32:
        inp = -shift[:, None] if b is None else b[None, :] / temperature - shift[:, None]
        return torch.addmm(inp, h, w.t(), alpha=1 / temperature)
    return F.linear(h, w, b).float().div_(temperature).sub_(shift[:, None])


def _tiles(n: int, vocab: int, chunk: int):
    """Tokens and vocabulary rows per tile: ``chunk`` x vocab logits, as many tokens as allow slices of at least
    MIN_VOCAB_SLICE rows (large matmuls that read the weight once per token block)."""
    budget = chunk * vocab
    nb = max(1, min(n, budget // min(vocab, MIN_VOCAB_SLICE)))
    return nb, max(1, min(vocab, budget // nb))


def _mm_into(out, a, b, first: bool):
    """out = a @ b (``first``) or out += a @ b, accumulating in out's dtype."""
    if out.dtype == a.dtype:
        torch.mm(a, b, out=out) if first else out.addmm_(a, b)
    else:
        prod = (a @ b).to(out.dtype)
        out.copy_(prod) if first else out.add_(prod)


class _OutputLayerLogprobs(torch.autograd.Function):
    """(log pi(y_t), H_t) for z = (h W^T + b)/T, with log pi(y) = z_y - logsumexp(z) and H = -sum_v pi(v) log pi(v)
    (softmax policy, e.g. Williams 1992 REINFORCE; entropy as in Shannon 1948).

    Backward, per row with g = dL/dlog pi(y) and e = dL/dH, p = softmax(z):
    dL/dz = g (onehot(y) - p) - e p (log p + H), then dL/dlogits = dL/dz / T."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, temperature, entropy):
        cd = _compute_dtype(hidden, weight)
        with torch.autocast(hidden.device.type, enabled=False):  # dtypes are set explicitly, as in the backward
            return _OutputLayerLogprobs._forward(ctx, hidden, weight, bias, targets, chunk, temperature, entropy, cd)

    @staticmethod
    def _forward(ctx, hidden, weight, bias, targets, chunk, temperature, entropy, cd):
        """Online log-sum-exp over vocabulary slices (Milakov & Gimelshein 2018) with the entropy as
        H = log s - sum_v e_v (z_v - m) / s, e_v = exp(z_v - m), s = sum_v e_v: two non-negative terms."""
        n, v = hidden.shape[0], weight.shape[0]
        nb, vs = _tiles(n, v, chunk)
        lse, ent, logp = (hidden.new_empty(n, dtype=torch.float32) for _ in range(3))
        for r in range(0, n, nb):
            h, y = hidden[r:r + nb].to(cd), targets[r:r + nb]
            m = h.new_full((h.shape[0],), float("-inf"), dtype=torch.float32)
            tot, acc, zy = (torch.zeros_like(m) for _ in range(3))
            for s in range(0, v, vs):
                z = _logits(h, weight[s:s + vs].to(cd), _cast(None if bias is None else bias[s:s + vs], cd),
                            temperature, torch.zeros_like(m))
                hit = ((y >= s) & (y < s + vs)).nonzero().squeeze(-1)
                zy[hit] = z[hit, y[hit] - s]
                m_new = torch.maximum(m, z.amax(1))
                scale = torch.exp(m - m_new)
                shift = torch.where(tot > 0, (m - m_new) * tot, 0.0)  # rebase sum e (z - m) to the new max
                z.sub_(m_new[:, None])
                e = torch.exp(z)
                acc = (acc + shift) * scale + torch.linalg.vecdot(e, z)
                tot = tot * scale + e.sum(1)
                m = m_new
                del z, e  # free this tile before the next one is allocated
            log_tot = torch.log(tot)
            lse[r:r + nb] = m + log_tot
            logp[r:r + nb] = zy - lse[r:r + nb]
            ent[r:r + nb] = log_tot - acc / tot
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.chunk, ctx.temperature, ctx.cd = chunk, temperature, cd
        ctx.set_materialize_grads(False)
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None, None
        n, v, T, cd = hidden.shape[0], weight.shape[0], ctx.temperature, ctx.cd
        g = torch.zeros_like(lse) if g_logp is None else g_logp.float() / T
        e = None if g_ent is None else g_ent.float() / T
        c = g if e is None else g + e * ent  # dL/dz = -p (e log p + c) + g onehot(y)
        nb, vs = _tiles(n, v, ctx.chunk)
        gh = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        gw = (torch.empty_like(weight) if n else torch.zeros_like(weight)) if need_w else None
        gb = torch.zeros(v, dtype=torch.float32, device=weight.device) if need_b else None
        for r in range(0, n, nb):
            h, rows, y = hidden[r:r + nb].to(cd), slice(r, r + nb), targets[r:r + nb]
            for s in range(0, v, vs):
                w = weight[s:s + vs].to(cd)
                lp = _logits(h, w, _cast(None if bias is None else bias[s:s + vs], cd), T, lse[rows])
                p = torch.exp(lp)
                dz = p.mul_(-c[rows, None]) if e is None else lp.mul_(-e[rows, None]).sub_(c[rows, None]).mul_(p)
                hit = ((y >= s) & (y < s + vs)).nonzero().squeeze(-1)
                dz[hit, y[hit] - s] += g[rows][hit]
                dzc = dz.to(cd)
                if need_h:
                    _mm_into(gh[rows], dzc, w, s == 0)
                if need_w:
                    _mm_into(gw[s:s + vs], dzc.t(), h, r == 0)
                if need_b:
                    gb[s:s + vs] += dz.sum(0)
                del lp, p, dz, dzc  # free this tile before the next one is allocated
        return (None if gh is None else gh.to(hidden.dtype), gw,
                None if gb is None else gb.to(bias.dtype), None, None, None, None)


def chunked_logprobs(hidden, weight, targets, bias=None, chunk: int | None = None, temperature: float = 1.0,
                     entropy: bool = True):
    """Log-prob of ``targets`` [N] (and entropy) from ``hidden`` [N, H], in tiles of ``chunk`` x vocab logits.

    ``chunk`` None picks about LOGITS_BUDGET logits per tile. Peak memory holds a few tiles (plus the weight
    gradient in training), never N x vocab; the entropy carries a gradient only when ``entropy`` is True."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden/targets: expected [N, H] and [N], got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    chunk = auto_chunk(weight.shape[0]) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"chunk: expected a positive number of tokens, got {chunk}")
    if temperature <= 0:
        raise ValueError(f"temperature: expected > 0, got {temperature}")
    return _OutputLayerLogprobs.apply(hidden, weight, bias, targets, chunk, float(temperature), entropy)


def plain_logprobs(hidden, weight, targets, bias=None, temperature: float = 1.0):
    """The reference computation: all logits at once, log_softmax, gather (for tests and benchmarks)."""
    z = F.linear(hidden, weight, bias).float() / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def sequence_logprobs(model, input_ids, attention_mask, completion_mask, chunk: int | None = None,
                      temperature: float = 1.0):
    """Per-token log-probs and entropies [B, T-1] of ``input_ids[:, 1:]`` under ``model``, zero where
    ``completion_mask[:, 1:]`` is 0; only completion tokens go through the output layer."""
    h = backbone(model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
    sel = completion_mask[:, 1:].bool()
    head = output_layer(model)
    lp, en = chunked_logprobs(h[sel], head.weight, input_ids[:, 1:][sel], bias=head.bias, chunk=chunk,
                              temperature=temperature)
    logp = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device).masked_scatter(sel, lp)
    ent = torch.zeros(sel.shape, dtype=en.dtype, device=en.device).masked_scatter(sel, en)
    return logp, ent
