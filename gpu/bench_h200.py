"""Throughput of one training step per algorithm on a Qwen2.5-0.5B-sized model built from its config (random
weights, no download): tokens/s and peak memory. On CUDA by default (bf16 autocast); `--tiny` runs a small model on
the CPU to test the script.

    python -m gpu.bench_h200 [--tiny] [--steps 3] [--prompts 8] [--group 8] [--prompt-len 128] [--gen-len 512]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
import time

import torch

import gpu
from gpu.logprobs import sequence_logprobs
from spec.registry import ALGORITHMS

QWEN25_05B = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
              "tie_word_embeddings": True, "rope_theta": 1000000.0}
TINY = {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "tie_word_embeddings": True}


def build(tiny: bool, device: str):
    """A random Qwen2 causal LM with Qwen2.5-0.5B's shapes (or a tiny one)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(**(TINY if tiny else QWEN25_05B))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)
    model.config.use_cache = False
    if device == "cuda":
        model.gradient_checkpointing_enable()
    return model


def batch(P, G, prompt_len, gen_len, vocab, device):
    """Random prompt+completion ids with ragged completion lengths (half to full budget)."""
    B, L = P * G, prompt_len + gen_len
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (B, L), generator=g)
    lens = torch.randint(gen_len // 2, gen_len + 1, (B,), generator=g)
    pos = torch.arange(L)
    att = (pos[None] < prompt_len + lens[:, None]).long()
    comp = att * (pos[None] >= prompt_len).long()
    return ids.to(device), att.to(device), comp.to(device)


def step(name, model, opt, ids, att, comp, G, gen_len, autocast):
    """One optimiser step of ``name`` on the batch; returns the number of completion tokens trained on."""
    with autocast:
        logp, _ = sequence_logprobs(model, ids, att, comp)
    logp = logp.float()
    mask = comp[:, 1:].float()
    if name == "dpo":
        seq = (logp * mask).sum(1)
        ref = seq.detach() - 0.1
        loss, _ = gpu.dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2])
    else:
        old = logp.detach()
        adv = torch.randn(len(ids) // G, device=ids.device).repeat_interleave(G)[:, None] * mask
        hp = {"max_len": gen_len} if name == "dr_grpo" else {}
        loss, _ = gpu.policy_loss(name, logp, old, adv, mask, group_size=G, ref_logp=old, **hp)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return int(mask.sum())


def run(tiny=False, steps=3, prompts=8, group=8, prompt_len=128, gen_len=512, algos=None):
    """Time ``steps`` steps (after one warm-up) per algorithm; returns one row per algorithm."""
    device = "cpu" if tiny or not torch.cuda.is_available() else "cuda"
    if not tiny and device != "cuda":
        raise SystemExit("no CUDA device: use --tiny to test the script on the CPU")
    model = build(tiny, device)
    ids, att, comp = batch(prompts, group, prompt_len, gen_len, model.config.vocab_size, device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    rows = []
    for name in algos or list(ALGORITHMS):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        step(name, model, opt, ids, att, comp, group, gen_len, autocast)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t, tokens = time.perf_counter(), 0
        for _ in range(steps):
            tokens += step(name, model, opt, ids, att, comp, group, gen_len, autocast)
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        peak = (torch.cuda.max_memory_allocated() / 2**30 if device == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        rows.append({"algo": name, "device": device, "step_s": dt / steps, "train_tokens_per_s": tokens / dt,
                     "all_tokens_per_s": int(att.sum()) * steps / dt, "peak_mem_gib": peak})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (tests the script)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=512)
    ap.add_argument("--algos", default=None, help="comma-separated subset (default: all)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    rows = run(a.tiny, a.steps, a.prompts, a.group, a.prompt_len, a.gen_len, a.algos.split(",") if a.algos else None)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
