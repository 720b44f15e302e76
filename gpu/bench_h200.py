"""The GPU run, in two parts written as they finish. (1) Throughput of the training step for GRPO, DAPO and DCPO on a
Qwen2.5-0.5B-sized model built from its config (random weights, no download): tokens/s, model TFLOP/s and MFU in
bf16 (autocast), log-probs through the output-layer function of gpu/logprobs.py; the MFU is the training step's
only, and generation (the trainer's batched sampler, ``gpu.rollout.sample``) is timed apart, as tokens/s. (2) The
tiny tier's sweep at a larger size: a wider tiny_char recipe on longer additions, pretrained on the device (cached
like `make tiny-model`), then configs/tiny runs through gpu/train.py, several seeds at once on the one device, each
in its own process, each writing its metrics.jsonl as it goes. Within a time budget (8 minutes); OUT/throughput.json
is rewritten atomically after every finished part, and `cliplab report OUT` renders it. `--tiny` runs both parts
small on the CPU in float32 (under a minute) to test the script.

    python -m gpu.bench_h200 --out DIR [--tiny] [--parts throughput,tier] [--max-minutes 8] [--peak-tflops T]
                             [--steps 3] [--prompts 8] [--group 8] [--prompt-len 128] [--gen-len 512]
                             [--algos grpo,dapo,dcpo] [--tier-algos grpo,dapo,dcpo] [--tier-seeds 8]
                             [--tier-steps 300] [--cache-dir DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

import gpu
from gpu.logprobs import sequence_logprobs
from gpu.rollout import sample
from spec.records import open_lock, read_json, read_jsonl, take_lock, writable_folder, write_json, write_text
from spec.registry import ALGORITHMS

QWEN25_05B = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
              "tie_word_embeddings": True, "rope_theta": 1000000.0}
TINY = {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "tie_word_embeddings": True}
# Dense bf16 tensor-core peaks in TFLOP/s, by the device name torch.cuda.get_device_name() reports (a whole word of
# it; the first match wins, so the more specific names come first). NVIDIA's data sheets quote the figures with 2:4
# sparsity, halved here.
PEAK_BF16_TFLOPS = (
    ("H200 NVL", 835.0),   # H200 NVL (PCIe card): 1,671 with sparsity (NVIDIA H200 Tensor Core GPU data sheet)
    ("H200", 989.0),       # H200 SXM: 1,979 with sparsity (same data sheet)
    ("GH200", 989.0),      # GH200 Grace Hopper Superchip: 1,979 with sparsity (NVIDIA GH200 data sheet)
    ("H100 NVL", 835.0),   # H100 NVL: 1,671 with sparsity (NVIDIA H100 Tensor Core GPU data sheet)
    ("H100 PCIe", 756.0),  # H100 PCIe: 1,513 with sparsity (same data sheet)
    ("H100", 989.0),       # H100 SXM ('NVIDIA H100 80GB HBM3'): 1,979 with sparsity (same data sheet)
    ("B200", 2250.0),      # B200: 36 PFLOPS with sparsity for the 8 GPUs of an HGX B200 (NVIDIA HGX data sheet)
    ("A100", 312.0),       # A100 SXM and PCIe: 624 with sparsity (NVIDIA A100 Tensor Core GPU data sheet)
    ("L40S", 362.0),       # L40S: 733 with sparsity (NVIDIA L40S data sheet)
    ("L4", 121.0),         # L4: 242 with sparsity (NVIDIA L4 data sheet)
)
DEFAULT_ALGOS = ("grpo", "dapo", "dcpo")
CUDA_LOGPROB_CHUNK = 1024  # tokens per output-layer tile on the GPU (larger matmuls; about 0.6 GiB of logits each)
KIND = "cliplab-throughput"
MFU_SCOPE = "training step only (forward, backward, optimiser); generation is timed apart, as tokens/s"
# the throughput part's batch and the tier's sweep: on the GPU, and with --tiny on the CPU (a minute in all)
SIZES = {
    "gpu": {"steps": 3, "prompts": 8, "group": 8, "prompt_len": 128, "gen_len": 512, "tier_seeds": 8,
            "tier_steps": 300, "tier_algos": "grpo,dapo,dcpo"},
    "tiny": {"steps": 2, "prompts": 2, "group": 4, "prompt_len": 16, "gen_len": 32, "tier_seeds": 2,
             "tier_steps": 2, "tier_algos": "grpo"},
}
# the tiny tier's recipe (configs/tiny/model.yaml) overridden: wider, on 5-digit additions; --tiny: smaller and short
TIER_RECIPE = {
    "gpu": {"model": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 1024,
                      "max_positions": 64},
            "task": {"digits": 5}, "sft": {"steps": 2000, "batch": 128}},
    "tiny": {"model": {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64, "max_positions": 32},
             "task": {"digits": 2}, "sft": {"steps": 20, "batch": 16}},
}
# the configs/tiny runs' settings at that size: answers of 5 digits need about 25 tokens with the scratchpad
TIER_SETS = {"gpu": ["rollout.max_new_tokens=32"],
             "tiny": ["rollout.max_new_tokens=12", "rollout.prompts_per_step=2", "rollout.group_size=4",
                      "train.minibatch_size=0", "data.n=16"]}
CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "tiny"


def device_peak(name: str, given: float | None = None) -> float:
    """The dense bf16 peak (TFLOP/s) of device ``name``: ``given`` (--peak-tflops) if set, else PEAK_BF16_TFLOPS's
    entry whose name is a whole word of ``name``; an unknown device is a ValueError naming --peak-tflops."""
    if given is not None:
        return given
    for key, peak in PEAK_BF16_TFLOPS:
        if re.search(rf"(?<![A-Z0-9]){re.escape(key.upper())}(?![A-Z0-9])", name.upper()):
            return peak
    raise ValueError(f"--peak-tflops: no known bf16 peak for the device {name!r}; give its dense bf16 TFLOP/s")


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


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def generation_rate(model, P, G, prompt_len, gen_len, autocast, device) -> dict:
    """Tokens/s of sampling ``gen_len`` new tokens (no early stop) for P prompts x G samples with the trainer's
    engine (``gpu.rollout.sample``: each prompt once, its KV cache repeated for its samples), after a short
    warm-up; the model is back in train mode afterwards."""
    prompts = torch.randint(0, model.config.vocab_size, (P, prompt_len), generator=torch.Generator().manual_seed(1))
    prompts = prompts.to(device)
    att = torch.ones_like(prompts)
    model.eval()
    try:
        with torch.no_grad(), autocast:
            sample(model, prompts, att, G, 2, 1.0, pad=0, eos=None)  # warm-up
            _sync(device)
            t = time.perf_counter()
            tokens, _ = sample(model, prompts, att, G, gen_len, 1.0, pad=0, eos=None)
            _sync(device)
            dt = time.perf_counter() - t
    finally:
        model.train()
    return {"engine": "the trainer's batched sampler (gpu.rollout.sample, KV cache)", "sequences": int(tokens.shape[0]),
            "tokens": int(tokens.numel()), "s": dt, "tokens_per_s": tokens.numel() / dt}


def throughput(tiny, steps, prompts, group, prompt_len, gen_len, algos, peak_tflops, deadline, on_row) -> dict:
    """Time up to ``steps`` steps (after one warm-up) per algorithm, each within its share of the time to
    ``deadline``, calling ``on_row(result)`` after each; then the generation rate. Returns the part's result."""
    start = time.perf_counter()
    device = "cpu" if tiny else "cuda"
    model = build(tiny, device)
    ids, att, comp = batch(prompts, group, prompt_len, gen_len, model.config.vocab_size, device)
    flops = step_flops(model, att, comp)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    res = {"model": "tiny" if tiny else "Qwen2.5-0.5B config (random weights)", "config": TINY if tiny else QWEN25_05B,
           "params": sum(p.numel() for p in model.parameters()),
           "precision": "bf16 autocast, float32 weights and AdamW" if device == "cuda" else "float32",
           "grad_checkpointing": device == "cuda",
           "batch": {"prompts": prompts, "group": group, "prompt_len": prompt_len, "gen_len": gen_len},
           "flops_per_step": flops, "peak_tflops": peak_tflops, "mfu_scope": MFU_SCOPE, "rows": []}
    for k, name in enumerate(algos):
        algo_deadline = start + (deadline - start) * (k + 1) / (len(algos) + 1)  # a share left for generation
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        step(name, model, opt, ids, att, comp, group, gen_len, autocast)  # warm-up
        _sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t, tokens, done = time.perf_counter(), 0, 0
        while done < steps and (done == 0 or time.perf_counter() < algo_deadline):
            tokens += step(name, model, opt, ids, att, comp, group, gen_len, autocast)
            done += 1
            _sync(device)
        dt = time.perf_counter() - t
        peak = (torch.cuda.max_memory_allocated() / 2**30 if device == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        tflops = flops * done / dt / 1e12
        res["rows"].append({"algo": name, "steps": done, "step_s": dt / done, "train_tokens_per_s": tokens / dt,
                            "all_tokens_per_s": int(att.sum()) * done / dt, "model_tflops": tflops,
                            "mfu": tflops / peak_tflops if peak_tflops else None, "peak_mem_gib": peak})
        print(f"throughput {name}: {res['rows'][-1]} (MFU: {MFU_SCOPE})", flush=True)
        on_row(res)
    res["generation"] = generation_rate(model, prompts, group, prompt_len, gen_len, autocast, device)
    print(f"generation: {res['generation']}", flush=True)
    return res


# -- the tiny tier's sweep ----------------------------------------------------------------------------------------
def tier_recipe(size: str) -> dict:
    """configs/tiny/model.yaml with TIER_RECIPE[size]'s fields replaced, checked like the file."""
    from gpu import tiny_char
    raw = yaml.safe_load(tiny_char.RECIPE.read_text())
    for section, fields in TIER_RECIPE[size].items():
        raw[section] = {**raw[section], **fields}
    return tiny_char.check_recipe(raw)


def tier_model(size: str, folder: Path, device: str, cache=None) -> tuple[Path, dict]:
    """The tier's model: the recipe written to ``folder``/model.yaml and pretrained on ``device`` by
    gpu.tiny_char.pretrain into the model cache under its key, as `make tiny-model` does (kept when already
    there). Returns the checkpoint folder and its pretrain.json."""
    from gpu.models import tiny_char_path
    path = folder / "model.yaml"
    write_text(path, yaml.safe_dump(tier_recipe(size), sort_keys=False))
    with torch.device(device):  # the weights and the batches are made on the device
        out = tiny_char_path(cache, recipe=path, build=True)
    return out, read_json(out / "pretrain.json")


def tier_plan(size: str, model: Path, folder: Path, algos, seeds: int, steps: int, device: str) -> list[dict]:
    """One run per (algorithm, seed), algorithm-major: its configs/tiny file and the --set overrides that put it
    on ``model`` and ``device``, with the recipe's digits, ``steps`` steps and its own folder."""
    digits = tier_recipe(size)["task"]["digits"]
    return [{"algo": a, "seed": s, "config": str(CONFIGS / f"{a}.yaml"), "out_dir": str(folder / a / f"seed{s}"),
             "sets": [f"run.out_dir={folder / a / f'seed{s}'}", f"run.seed={s}", f"run.steps={steps}",
                      f"run.save_every={steps}", "run.threads=1", "run.progress=false", f"model.name={model}",
                      f"model.device={device}", f"data.digits={digits}", *TIER_SETS[size]]}
            for a in algos for s in range(seeds)]


def train_child(config: str, sets: list[str]) -> None:
    """A tier run (in its own process): the config through gpu/train.py; a bad setting is one line on stderr."""
    from gpu.config import load_config
    from gpu.train import train
    try:
        train(load_config(config, sets))
    except ValueError as e:
        print(f"{config}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


def run_summary(run: dict) -> dict:
    """What a run's metrics.jsonl says: steps done, median step and rollout seconds, generation tokens/s (of its
    rollouts), and the sampled accuracy of its first and last tenth of steps."""
    path = Path(run["out_dir"]) / "metrics.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    if not rows:
        return {"steps": 0}
    tenth = max(1, len(rows) // 10)
    med = {k: statistics.median(r[k] for r in rows) for k in ("step_time_s", "rollout_s", "gen_tokens_per_s")}
    return {"steps": len(rows), **{f"{k}_median": v for k, v in med.items()},
            "accuracy_first": statistics.fmean(r["accuracy"] for r in rows[:tenth]),
            "accuracy_last": statistics.fmean(r["accuracy"] for r in rows[-tenth:])}


def run_all(plan, parallel: int, deadline: float, on_done, target=train_child, preload=("gpu.train",)) -> list[dict]:
    """Run ``plan``'s entries, ``parallel`` processes at once (forked from one server that imported gpu.train, so
    that CUDA is never forked); one still running at ``deadline`` is stopped (its metrics stay). After each ends,
    ``on_done(results)`` with every ended run so far: its entry, status and ``run_summary``."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    todo, live, done = list(plan), [], []
    while todo or live:
        while todo and len(live) < parallel and time.perf_counter() < deadline:
            run = todo.pop(0)
            p = ctx.Process(target=target, args=(run["config"], run["sets"]))
            p.start()
            live.append((run, p))
        if not live:
            break
        time.sleep(0.2)
        over = time.perf_counter() >= deadline
        for run, p in list(live):
            if over and p.is_alive():
                p.terminate()
            if p.is_alive():
                continue
            p.join()
            live.remove((run, p))
            status = ("finished" if p.exitcode == 0 else "stopped at the time limit" if over
                      else f"failed (exit code {p.exitcode})")
            done.append({"algo": run["algo"], "seed": run["seed"], "out_dir": run["out_dir"], "status": status,
                         **run_summary(run)})
            on_done(done)
    return done + [{"algo": r["algo"], "seed": r["seed"], "out_dir": r["out_dir"], "status": "not started (time)",
                    "steps": 0} for r in todo]


# -- the whole run ------------------------------------------------------------------------------------------------
def run(out, tiny=False, parts=("throughput", "tier"), max_minutes=8.0, peak_tflops=None, cache=None, **opts) -> dict:
    """Both parts within ``max_minutes`` (the throughput part gets a third when both run), writing
    ``out``/throughput.json after each finished part; ``opts`` are SIZES' fields (unset: the size's defaults)."""
    start = time.perf_counter()
    size = "tiny" if tiny else "gpu"
    o = {**SIZES[size], **{k: v for k, v in opts.items() if v is not None}}
    algos, tier_algos = (o.get("algos") or ",".join(DEFAULT_ALGOS)).split(","), o["tier_algos"].split(",")
    bad = [a for a in algos if a not in ALGORITHMS]
    if bad:
        raise ValueError(f"--algos: expected names among {', '.join(ALGORITHMS)}, got {bad[0]!r}")
    missing = [n for n in tier_algos if not (CONFIGS / f"{n}.yaml").is_file()]
    if missing:
        raise ValueError(f"--tier-algos: expected names of configs/tiny files, got {missing[0]!r}")
    if not tiny and not torch.cuda.is_available():
        raise ValueError("device: no CUDA device; use --tiny to test the script on the CPU")
    device = "cpu" if tiny else "cuda"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = device_peak(name, peak_tflops) if device == "cuda" else peak_tflops
    out = writable_folder(out, "--out")
    lock = open_lock(out / "bench.lock", "--out", "the run's lock")
    owner = take_lock(lock)
    if owner is not None:
        os.close(lock)
        raise ValueError(f"--out: {out} is in use by another bench_h200 run (pid {owner or '?'})")
    result = {"kind": KIND, "device": name, "parts": list(parts), "mfu_scope": MFU_SCOPE, "rows": []}

    def save(**part):
        result.update(part, total_s=time.perf_counter() - start)
        write_json(out / "throughput.json", result)

    try:
        if "throughput" in parts:
            deadline = start + 60 * max_minutes * (1 / 3 if "tier" in parts else 1)
            part = throughput(tiny, o["steps"], o["prompts"], o["group"], o["prompt_len"], o["gen_len"],
                              algos, peak, deadline,
                              lambda res: save(**res))
            save(**part)
            if device == "cuda":
                torch.cuda.empty_cache()
        if "tier" in parts:
            folder = writable_folder(out / "tier", "--out")
            model, info = tier_model(size, folder, device, cache)
            tier = {"model": str(model), "recipe": info["recipe"], "pretrain": {k: info[k] for k in
                                                                                ("loss_first", "loss_last", "wall_s")},
                    "seeds": o["tier_seeds"], "steps": o["tier_steps"], "sets": TIER_SETS[size], "runs": []}
            save(tier=tier)
            plan = tier_plan(size, model, folder, tier_algos, o["tier_seeds"], o["tier_steps"], device)
            tier["runs"] = run_all(plan, o["tier_seeds"], start + 60 * max_minutes,
                                   lambda done: save(tier={**tier, "runs": done}))
            save(tier=tier)
    finally:
        os.close(lock)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for throughput.json and the tier's runs (one writer)")
    ap.add_argument("--tiny", action="store_true", help="both parts small, on the CPU (tests the script)")
    ap.add_argument("--parts", default="throughput,tier", help="comma-separated: throughput, tier")
    ap.add_argument("--max-minutes", type=float, default=8.0, help="time budget of the whole run")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense bf16 peak for MFU (default: looked up by device name)")
    for name in ("steps", "prompts", "group", "prompt_len", "gen_len", "tier_seeds", "tier_steps"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                        help=f"default {SIZES['gpu'][name]} ({SIZES['tiny'][name]} with --tiny)")
    ap.add_argument("--algos", default=None, help="comma-separated algorithm names (throughput part)")
    ap.add_argument("--tier-algos", default=None, help="comma-separated configs/tiny names (tier part)")
    ap.add_argument("--cache-dir", default=None, help="model cache (default $CLIPLAB_CACHE or ~/.cache/cliplab)")
    a = ap.parse_args(argv)
    for name in ("steps", "prompts", "prompt_len", "gen_len", "tier_seeds", "tier_steps", "max_minutes",
                 "peak_tflops"):
        if getattr(a, name) is not None and getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: expected a number > 0, got {getattr(a, name)}")
    if a.group is not None and a.group < 2:
        ap.error(f"--group: expected an int >= 2, got {a.group}")
    parts = a.parts.split(",")
    if not parts or set(parts) - {"throughput", "tier"}:
        ap.error(f"--parts: expected a comma-separated list of throughput, tier; got {a.parts!r}")
    try:
        return run(a.out, a.tiny, parts, a.max_minutes, a.peak_tflops, a.cache_dir, steps=a.steps,
                   prompts=a.prompts, group=a.group, prompt_len=a.prompt_len, gen_len=a.gen_len, algos=a.algos,
                   tier_algos=a.tier_algos, tier_seeds=a.tier_seeds, tier_steps=a.tier_steps)
    except ValueError as e:
        ap.error(str(e))


if __name__ == "__main__":
    main()
