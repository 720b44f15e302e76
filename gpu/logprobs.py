"""Per-token log-probs and entropy through the output layer in tiles, never holding [tokens x vocab] logits.

A custom autograd function keeps only the per-token log-sum-exp and entropy from its forward pass; its backward
recomputes each tile of logits once and forms the gradients of log pi(y) and of the entropy w.r.t. the logits in
closed form, then w.r.t. the hidden states, the output weight and its bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .models import backbone, cache_kwarg, output_layer

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


def _shared_prompts(input_ids, attention_mask, completion_mask):
    """(prompt lengths [B], index of each row's prompt [B], first row of each prompt [U]) when rows repeat a prompt
    (the same tokens before a completion that is contiguous after it), else None."""
    n_comp = completion_mask.sum(1)
    plen = completion_mask.argmax(1)
    span = torch.arange(completion_mask.shape[1], device=plen.device)
    contiguous = (((span >= plen[:, None]) & (span < (plen + n_comp)[:, None])) == completion_mask.bool()).all()
    if not bool(contiguous) or bool((n_comp == 0).any()) or bool((plen == 0).any()):
        return None
    ids, att, lens = input_ids.tolist(), attention_mask.tolist(), plen.tolist()
    seen, owner = {}, []
    for i, n in enumerate(lens):
        owner.append(seen.setdefault((tuple(ids[i][:n]), tuple(att[i][:n])), len(seen)))
    if len(seen) == len(lens):
        return None
    first = [owner.index(k) for k in range(len(seen))]
    dev = input_ids.device
    return plen, torch.tensor(owner, device=dev), torch.tensor(first, device=dev)


def _shared_prompt_hidden(body, input_ids, attention_mask, completion_mask, shared):
    """Hidden states [B, C, H] that predict each row's C completion slots, and the slots' targets and mask: each
    distinct prompt runs through ``body`` once and its KV cache serves all its rows (causal attention: a prompt's
    keys and values do not depend on what follows it), so prompts shared by G rows cost 1/G of their compute."""
    from transformers import DynamicCache
    plen, owner, first = shared
    L = input_ids.shape[1]
    lp = int(plen.max())
    p_att = attention_mask[first, :lp] * (torch.arange(lp, device=plen.device) < plen[first, None])
    cache = DynamicCache()
    h_prompt = body(input_ids=input_ids[first, :lp], attention_mask=p_att, use_cache=True,
                    **{cache_kwarg(body): cache}).last_hidden_state
    cache.reorder_cache(owner)  # index_select per layer: each row gets its prompt's keys and values
    n_slots = int(completion_mask.sum(1).max())
    pos = plen[:, None] + torch.arange(n_slots, device=plen.device)
    idx = pos.clamp(max=L - 1)
    c_ids, c_mask = input_ids.gather(1, idx), completion_mask.gather(1, idx) * (pos < L)
    c_att = attention_mask.gather(1, idx) * (pos < L)
    h_comp = body(input_ids=c_ids, attention_mask=torch.cat([p_att[owner], c_att], 1), position_ids=pos,
                  use_cache=True, **{cache_kwarg(body): cache}).last_hidden_state
    last = h_prompt[owner, plen - 1][:, None]  # the last prompt position predicts the first completion token
    return torch.cat([last, h_comp[:, :-1]], 1), c_ids, c_mask.bool()


def sequence_logprobs(model, input_ids, attention_mask, completion_mask, chunk: int | None = None,
                      temperature: float = 1.0):
    """Per-token log-probs and entropies [B, T-1] of ``input_ids[:, 1:]`` under ``model``, zero where
    ``completion_mask[:, 1:]`` is 0; only completion tokens go through the output layer, and a prompt that several
    rows share (a group) goes through the model once."""
    body = backbone(model)
    sel = completion_mask[:, 1:].bool()
    shared = _shared_prompts(input_ids, attention_mask, completion_mask)
    if shared is None:
        h = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1][sel]
        y = input_ids[:, 1:][sel]
    else:
        h_all, y_all, c_sel = _shared_prompt_hidden(body, input_ids, attention_mask, completion_mask, shared)
        h, y = h_all[c_sel], y_all[c_sel]  # row by row in order, as the [:, 1:] selection above
    head = output_layer(model)
    lp, en = chunked_logprobs(h, head.weight, y, bias=head.bias, chunk=chunk, temperature=temperature)
    logp = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device).masked_scatter(sel, lp)
    ent = torch.zeros(sel.shape, dtype=en.dtype, device=en.device).masked_scatter(sel, en)
    return logp, ent
