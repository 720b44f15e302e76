"""Side-by-side timing and peak memory of sim.policy_loss and gpu.policy_loss against plain loop-free references."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

from spec.registry import POLICY_ALGORITHMS


def batch(rows: int, cols: int, seed: int = 0) -> dict:
    """A realistic batch: ragged right-padded rows, groups of 8, small log-ratios, sequence advantages."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(cols // 4, cols + 1, rows)
    mask = (np.arange(cols)[None, :] < lens[:, None]).astype(np.float64)
    old = -rng.exponential(1.0, (rows, cols))
    return {"logp": old + rng.normal(0, 0.1, (rows, cols)), "old_logp": old,
            "adv": np.repeat(rng.normal(size=(rows, 1)), cols, 1), "mask": mask,
            "ref_logp": old + rng.normal(0, 0.1, (rows, cols))}


def plain_numpy(b):
    """The plain PPO-clip token-mean loss and its gradient: the smallest correct NumPy program."""
    r = np.exp(b["logp"] - b["old_logp"])
    a, m = b["adv"], b["mask"]
    unclipped, clipped = r * a, np.clip(r, 0.8, 1.2) * a
    n = m.sum()
    return -(np.minimum(unclipped, clipped) * m).sum() / n, -np.where(unclipped <= clipped, unclipped, 0) * m / n


def plain_torch(t):
    """The plain PPO-clip token-mean loss in torch, with its backward pass."""
    import torch
    logp = t["logp"].requires_grad_(True)
    r = torch.exp(logp - t["old_logp"])
    a, m = t["adv"], t["mask"]
    loss = -(torch.minimum(r * a, torch.clamp(r, 0.8, 1.2) * a) * m).sum() / m.sum()
    loss.backward()
    return loss


def run_sim(name, b):
    import sim
    return sim.policy_loss(name, b["logp"], b["old_logp"], b["adv"], b["mask"], group_size=8,
                           ref_logp=b["ref_logp"], max_len=b["mask"].shape[1])


def run_gpu(name, t):
    import gpu
    logp = t["logp"].requires_grad_(True)
    loss, _ = gpu.policy_loss(name, logp, t["old_logp"], t["adv"], t["mask"], group_size=8,
                              ref_logp=t["ref_logp"], max_len=t["mask"].shape[1])
    loss.backward()
    return loss


def _best_time(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _measure(kind: str, name: str, rows: int, cols: int, repeat: int) -> dict:
    """Time (best of ``repeat``) and peak resident memory of one target, in this fresh process."""
    b = batch(rows, cols)
    if kind.startswith("gpu") or kind == "plain_torch":
        import torch
        torch.set_num_threads(1)
        fresh = lambda: {k: torch.from_numpy(v.copy()) for k, v in b.items()}  # noqa: E731
        fn = {"gpu": lambda: run_gpu(name, fresh()), "plain_torch": lambda: plain_torch(fresh())}[kind]
    else:
        fn = {"sim": lambda: run_sim(name, b), "plain_numpy": lambda: plain_numpy(b)}[kind]
    base = _rss_peak_kib()
    seconds = _best_time(fn, repeat)
    return {"kind": kind, "name": name, "seconds": seconds, "peak_mib": (_rss_peak_kib() - base) / 1024}


def _rss_peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def compare(rows: int = 1024, cols: int = 1024, repeat: int = 5, algorithms=POLICY_ALGORITHMS):
    """Every algorithm in sim and gpu beside its plain reference, each target in its own process so that peak
    memory is its own; returns a table (pandas) of seconds per call, the ratio to the plain reference of the same
    layer, and the peak extra memory, one row per (layer, algorithm)."""
    import pandas as pd
    targets = [("plain_numpy", "ppo"), ("plain_torch", "ppo")]
    targets += [(k, n) for n in algorithms for k in ("sim", "gpu")]
    results = []
    for kind, name in targets:
        code = (f"import json; from harness.runs.bench import _measure; "
                f"print(json.dumps(_measure({kind!r}, {name!r}, {rows}, {cols}, {repeat})))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = pd.DataFrame(results).rename(columns={"kind": "layer", "name": "algorithm"})
    plain = table["layer"].map({"sim": "plain_numpy", "plain_numpy": "plain_numpy", "gpu": "plain_torch",
                                "plain_torch": "plain_torch"})
    table["ratio_to_plain"] = table["seconds"] / plain.map(table.set_index("layer")["seconds"].to_dict())
    return table.set_index(["layer", "algorithm"])


def logprob_inputs(n, hidden, vocab):
    """Hidden states [n, hidden], an output weight [vocab, hidden] at a trained model's scale, and targets."""
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, hidden, generator=g).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.02).requires_grad_()
    return x, w, torch.randint(0, vocab, (n,), generator=g)


def _logprob_step(kind, x, w, y):
    """One forward + backward of log-prob + entropy through the output layer."""
    from gpu.logprobs import chunked_logprobs, plain_logprobs
    x.grad = w.grad = None
    lp, en = (chunked_logprobs if kind == "chunked" else plain_logprobs)(x, w, y)
    (lp.sum() + en.sum()).backward()


def _logprob_peak(kind, n, hidden, vocab) -> float:
    """Extra peak RSS (MiB) of one step, in this fresh process (after the inputs exist)."""
    _logprob_step(kind, *logprob_inputs(8, 8, 64))  # page in the code of both passes first
    x, w, y = logprob_inputs(n, hidden, vocab)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset the peak RSS to the current RSS, forgetting the inputs' temporaries
    base = _rss_peak_kib()
    _logprob_step(kind, x, w, y)
    return (_rss_peak_kib() - base) / 1024


def _logprob_times(n, hidden, vocab, rounds, threads) -> dict:
    """Seconds per step of plain and chunked, alternating in this one process, the order swapped every round (plain
    first in even rounds, chunked first in odd ones, so that neither always runs right after the other), each
    step timed by the wall clock and by this process's CPU time."""
    import torch
    if threads:
        torch.set_num_threads(threads)
    for kind in ("plain", "chunked"):
        _logprob_step(kind, *logprob_inputs(8, 8, 64))  # page in the code of both passes first
    x, w, y = logprob_inputs(n, hidden, vocab)
    out = {k: {"wall": [], "cpu": []} for k in ("plain", "chunked")}
    for i in range(rounds):
        for kind in ("plain", "chunked") if i % 2 == 0 else ("chunked", "plain"):
            w0, c0 = time.perf_counter(), time.process_time()
            _logprob_step(kind, x, w, y)
            out[kind]["cpu"].append(time.process_time() - c0)
            out[kind]["wall"].append(time.perf_counter() - w0)
    return out


def _ratios(times: dict, clock: str) -> dict:
    """Median and min seconds per variant, and chunked over plain: the median of the per-round ratios (each round's
    two steps ran back to back, so the machine's load drifts least between them), and the ratio of the minima."""
    c, p = times["chunked"][clock], times["plain"][clock]
    return {"median_s": {"plain": float(np.median(p)), "chunked": float(np.median(c))},
            "min_s": {"plain": min(p), "chunked": min(c)},
            "ratio_median": float(np.median([a / b for a, b in zip(c, p)])), "ratio_of_min": min(c) / min(p)}


def _in_fresh_process(call: str):
    out = subprocess.run([sys.executable, "-c", f"import json; from harness.runs import bench; print(json.dumps(bench.{call}))"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def logprob_compare(n: int = 2048, vocab: int = 151936, hidden: int = 896, rounds: int = 6,
                    threads: int | None = 1) -> dict:
    """Plain full-logits log-prob + entropy against gpu.logprobs' chunked function, forward and backward: extra peak
    memory of each in its own fresh process, and time of both alternating in one process; their ratios, and the
    chunked peak over the size of the output-layer weight gradient (float32). With one thread the time ratio is
    read from CPU time (a shared machine's load stretches the wall clock, not the CPU time), else from the wall
    clock."""
    peak = {k: _in_fresh_process(f"_logprob_peak({k!r}, {n}, {hidden}, {vocab})") for k in ("plain", "chunked")}
    times = _in_fresh_process(f"_logprob_times({n}, {hidden}, {vocab}, {rounds}, {threads})")
    clock = "cpu" if threads == 1 else "wall"
    grad_mib = vocab * hidden * 4 / 2**20
    by_clock = {k: _ratios(times, k) for k in ("cpu", "wall")}
    return {"tokens": n, "vocab": vocab, "hidden": hidden, "threads": threads, "rounds": rounds, "clock": clock,
            "weight_grad_mib": grad_mib, "extra_peak_mib": peak, "seconds": times, **by_clock,
            "time_ratio": by_clock[clock]["ratio_median"], "peak_ratio": peak["chunked"] / peak["plain"],
            "peak_over_weight_grad": peak["chunked"] / grad_mib}


def transformers_generate(model, tok, prompts, n, max_new_tokens, temperature, seed):
    """The reference sampler: transformers ``generate`` on the left-padded prompts, ``n`` samples each
    (num_return_sequences, as TRL calls it); tokens [P*n, T] and their log-probs from its processed scores."""
    import torch

    from gpu.rollout import left_pad
    ids, att = left_pad(prompts, tok.pad_token_id)
    width = ids.shape[1]
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.eval().generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=temperature,
                                    top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=n,
                                    output_scores=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
                                    eos_token_id=tok.eos_token_id)
    seq = out.sequences[:, width:]
    return seq, torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, seq[..., None]).squeeze(-1)


def sampler_compare(path, prompts: int = 16, n: int = 8, max_new_tokens: int = 24, rounds: int = 6) -> dict:
    """Our batched KV-cache sampler (gpu.rollout.HFEngine) against transformers ``generate`` on the same model,
    prompts (the addition task's), seeds and budget, alternating in one process with one thread (round k runs ours
    first when k is even): CPU seconds per batch of each, and generate's over ours, the median of the per-round
    ratios."""
    import torch

    from gpu.data import load_problems, prompt_ids
    from gpu.models import load_policy, load_tokenizer
    from gpu.rollout import HFEngine
    torch.set_num_threads(1)
    model, tok = load_policy(path), load_tokenizer(path)
    ids = [prompt_ids(tok, p, None, 64) for p in load_problems("addition", n=prompts, digits=3)]
    engine = HFEngine(model, tok)
    runs = {"ours": lambda s: engine.generate(ids, n, max_new_tokens, 1.0, seed=s),
            "generate": lambda s: transformers_generate(model, tok, ids, n, max_new_tokens, 1.0, s)}
    cpu = {k: [] for k in runs}
    for k in range(rounds + 1):  # round 0 warms up
        for name in (("ours", "generate") if k % 2 == 0 else ("generate", "ours")):
            t0 = time.process_time()
            runs[name](k)
            if k:
                cpu[name].append(time.process_time() - t0)
    ratios = [g / o for g, o in zip(cpu["generate"], cpu["ours"])]
    return {"prompts": prompts, "group_size": n, "max_new_tokens": max_new_tokens, "rounds": rounds,
            "cpu_s": cpu, "median_s": {k: float(np.median(v)) for k, v in cpu.items()},
            "generate_over_ours": float(np.median(ratios))}
