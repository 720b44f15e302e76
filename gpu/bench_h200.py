"""Throughput of the training step for GRPO, DAPO and DCPO on a Qwen2.5-0.5B-sized model built from its config
(random weights, no download): tokens/s, model TFLOP/s and MFU in bf16 (autocast), log-probs through the
output-layer function of gpu/logprobs.py. On CUDA by default, within a time budget (8 minutes); `--tiny` runs a
small model on the CPU in float32 to test the script. Writes JSON that `cliplab report` renders.

    python -m gpu.bench_h200 [--tiny] [--steps 3] [--prompts 8] [--group 8] [--prompt-len 128] [--gen-len 512]
                             [--algos grpo,dapo,dcpo] [--peak-tflops 989] [--max-minutes 8] [--out FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import time
from pathlib import Path

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
H200_BF16_TFLOPS = 989.0  # dense bf16 peak of one H200 SXM (NVIDIA's data sheet; same tensor cores as H100 SXM)
DEFAULT_ALGOS = ("grpo", "dapo", "dcpo")
CUDA_LOGPROB_CHUNK = 1024  # tokens per output-layer tile on the GPU (larger matmuls; about 0.6 GiB of logits each)
KIND = "cliplab-throughput"


def build(tiny: bool, device: str):
    """A random Qwen2 causal LM with Qwen2.5-0.5B's shapes (or a tiny one)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(**(TINY if tiny else QWEN25_05B))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)
    model.config.use_cache = False
    model.train()
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


def step_flops(model, att, comp) -> float:
    """Model FLOPs of one training step (forward + backward = 3x the forward's matmuls; Kaplan et al. 2020, Sec.
    2.1; recomputation not counted): 2 per weight per token in the decoder's linear layers (every real token), in
    the output layer (completion tokens only), and causal attention 2 x 2 d per (query, key<=query) pair per layer."""
    cfg = model.config
    layer_w = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    lens = att.sum(1).double()
    tokens, out_tokens = float(lens.sum()), float(comp[:, 1:].sum())
    attn = cfg.num_hidden_layers * 4 * cfg.hidden_size * float((lens * (lens + 1) / 2).sum())
    return 3 * (2 * layer_w * tokens + 2 * cfg.vocab_size * cfg.hidden_size * out_tokens + attn)


def step(name, model, opt, ids, att, comp, G, gen_len, autocast):
    """One optimiser step of ``name`` on the batch; returns the number of completion tokens trained on."""
    chunk = CUDA_LOGPROB_CHUNK if ids.device.type == "cuda" else None
    with autocast:
        logp, _ = sequence_logprobs(model, ids, att, comp, chunk=chunk)
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


def run(tiny=False, steps=3, prompts=8, group=8, prompt_len=128, gen_len=512, algos=DEFAULT_ALGOS,
        peak_tflops=None, max_minutes=8.0) -> dict:
    """Time up to ``steps`` steps (after one warm-up) per algorithm, each algorithm within its share of
    ``max_minutes``; returns the settings and one row per algorithm."""
    start = time.perf_counter()
    bad = [a for a in algos if a not in ALGORITHMS]
    if bad:
        raise ValueError(f"algos: expected names among {', '.join(ALGORITHMS)}, got {bad[0]!r}")
    device = "cpu" if tiny or not torch.cuda.is_available() else "cuda"
    if not tiny and device != "cuda":
        raise ValueError("device: no CUDA device; use --tiny to test the script on the CPU")
    if peak_tflops is None and device == "cuda":
        peak_tflops = H200_BF16_TFLOPS
    model = build(tiny, device)
    ids, att, comp = batch(prompts, group, prompt_len, gen_len, model.config.vocab_size, device)
    flops = step_flops(model, att, comp)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    rows = []
    for k, name in enumerate(algos):
        deadline = start + 60 * max_minutes * (k + 1) / len(algos)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        step(name, model, opt, ids, att, comp, group, gen_len, autocast)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t, tokens, done = time.perf_counter(), 0, 0
        while done < steps and (done == 0 or time.perf_counter() < deadline):
            tokens += step(name, model, opt, ids, att, comp, group, gen_len, autocast)
            done += 1
            if device == "cuda":
                torch.cuda.synchronize()
        dt = time.perf_counter() - t
        peak = (torch.cuda.max_memory_allocated() / 2**30 if device == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        tflops = flops * done / dt / 1e12
        rows.append({"algo": name, "steps": done, "step_s": dt / done, "train_tokens_per_s": tokens / dt,
                     "all_tokens_per_s": int(att.sum()) * done / dt, "model_tflops": tflops,
                     "mfu": tflops / peak_tflops if peak_tflops else None, "peak_mem_gib": peak})
        print(json.dumps(rows[-1]), flush=True)
    return {"kind": KIND, "model": "tiny" if tiny else "Qwen2.5-0.5B config (random weights)",
            "config": TINY if tiny else QWEN25_05B,
            "params": sum(p.numel() for p in model.parameters()),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "precision": "bf16 autocast, float32 weights and AdamW" if device == "cuda" else "float32",
            "grad_checkpointing": device == "cuda", "batch": {"prompts": prompts, "group": group,
                                                             "prompt_len": prompt_len, "gen_len": gen_len},
            "flops_per_step": flops, "peak_tflops": peak_tflops, "total_s": time.perf_counter() - start, "rows": rows}


def write_json(result: dict, path) -> None:
    """Write ``result`` to ``path`` atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (tests the script)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=512)
    ap.add_argument("--algos", default=",".join(DEFAULT_ALGOS), help="comma-separated algorithm names")
    ap.add_argument("--peak-tflops", type=float, default=None, help=f"peak for MFU (CUDA default "
                                                                     f"{H200_BF16_TFLOPS:g}, the H200's bf16)")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="time budget of the timed steps, shared")
    ap.add_argument("--out", default=None, help="write the result as JSON here (render with `cliplab report`)")
    a = ap.parse_args(argv)
    for name in ("steps", "prompts", "prompt_len", "gen_len", "max_minutes"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: expected a number > 0, got {getattr(a, name)}")
    if a.group < 2:
        ap.error(f"--group: expected an int >= 2, got {a.group}")
    try:
        result = run(a.tiny, a.steps, a.prompts, a.group, a.prompt_len, a.gen_len, a.algos.split(","),
                     a.peak_tflops, a.max_minutes)
    except ValueError as e:
        ap.error(str(e))
    if a.out:
        write_json(result, a.out)


if __name__ == "__main__":
    main()
