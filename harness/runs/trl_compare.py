"""Side by side with TRL's GRPOTrainer on the same model and settings (prompts, G, completion length, transformers
generate, lr, GRPO loss, beta 0): steps per second of a whole step (generate, reward, loss, update), the two
trainers' steps alternating in one process, and both losses on one fixed batch.

    python -m harness.runs.trl_compare [--model smollm2] [--steps 4] [--threads 1] [--out reports/real/trl_compare.json]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

P, G, MAX_NEW, LR = 4, 4, 16, 1e-5


def digit_reward(text: str) -> float:
    """Share of digit characters: a dense reward on which a random model's samples differ."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def _trl_reward(completions, **kwargs):
    return [digit_reward(c if isinstance(c, str) else c[-1]["content"]) for c in completions]


def _trl_trainer(path, steps, gradient_checkpointing: bool = True):
    from datasets import Dataset

    from gpu.data import arithmetic
    from gpu.models import load_policy, load_tokenizer
    from harness.conform.targets.trl import _import_trl
    trl = _import_trl()
    tok = load_tokenizer(path)
    problems = arithmetic(64, seed=0)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p.question}] for p in problems]})
    args = trl.GRPOConfig(output_dir=tempfile.mkdtemp(prefix="cliplab-trl-"), per_device_train_batch_size=P * G,
                          num_generations=G, max_completion_length=MAX_NEW, learning_rate=LR, max_steps=steps,
                          loss_type="grpo", beta=0.0, temperature=1.0, top_k=0, top_p=1.0, use_cpu=True, bf16=False,
                          report_to=[], save_strategy="no", logging_strategy="no", max_grad_norm=1.0,
                          gradient_checkpointing=gradient_checkpointing,
                          lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, seed=0)
    return trl.GRPOTrainer(model=load_policy(path), reward_funcs=_trl_reward, args=args, train_dataset=data,
                           processing_class=tok)


def _ours(path, steps, out):
    from gpu.config import from_dict
    from gpu.train import Trainer
    raw = {"run": {"out_dir": out, "steps": steps, "save_every": 10**6, "resume": False, "progress": False},
           "model": {"name": str(path)}, "data": {"n": 64},
           "rollout": {"engine": "hf", "prompts_per_step": P, "group_size": G, "max_new_tokens": MAX_NEW},
           "algo": {"name": "grpo", "hp": {"beta": 0.0}, "reward": "harness.runs.trl_compare:reward_fn"},
           "train": {"lr": LR, "weight_decay": 0.0, "max_grad_norm": 1.0}}
    return Trainer(from_dict(raw))


def reward_fn(text: str, gold: str) -> float:
    """Our reward-callable form of ``digit_reward``."""
    return digit_reward(text)


def cpu_seconds() -> float:
    """CPU time of this process and of its live children (our answer checker's worker), Linux /proc."""
    total, me, tick = time.process_time(), os.getpid(), os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while being read
            continue
        if int(f[1]) == me:
            total += (int(f[11]) + int(f[12])) / tick
    return total


def time_both(path, steps: int, gradient_checkpointing: bool = True, ours=None) -> dict:
    """Seconds per whole step of TRL and ours, alternating: after each TRL step (timed from its step's start to its
    end) one of ours runs; each step timed by the wall clock and by CPU time (``cpu_seconds``), the first step of each
    dropped as warm-up. ``speedup`` is the median over pairs of TRL's CPU seconds over ours (with one torch thread,
    CPU time is what load on a shared machine leaves unchanged)."""
    from transformers import TrainerCallback
    ours = ours or _ours(path, 10**6, tempfile.mkdtemp(prefix="cliplab-ours-"))
    rec = {k: {"wall": [], "cpu": [], "len_mean": []} for k in ("ours", "trl")}
    clock = {}

    class Alternate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock.update(wall=time.perf_counter(), cpu=cpu_seconds())

        def on_step_end(self, args, state, control, **kw):
            rec["trl"]["cpu"].append(cpu_seconds() - clock["cpu"])
            rec["trl"]["wall"].append(time.perf_counter() - clock["wall"])
            rec["trl"]["len_mean"].append(trainer._metrics["train"]["completions/mean_length"][-1])
            w0, c0 = time.perf_counter(), cpu_seconds()
            m = ours.train_step()
            rec["ours"]["cpu"].append(cpu_seconds() - c0)
            rec["ours"]["wall"].append(time.perf_counter() - w0)
            rec["ours"]["len_mean"].append(m["len_mean"])
    trainer = _trl_trainer(path, steps + 1, gradient_checkpointing)
    trainer.add_callback(Alternate())
    trainer.train()
    out = {"gradient_checkpointing_trl": gradient_checkpointing, "steps_timed": steps}
    for k, r in rec.items():
        for c in ("wall", "cpu"):
            r[c] = r[c][1:]
            out[f"{k}_{c}_s_median"] = float(np.median(r[c]))
        out[f"{k}_len_mean"] = float(np.mean(r["len_mean"])) if r["len_mean"] else None
        out[f"{k}_steps"] = r
    out["speedup"] = float(np.median([t / o for t, o in zip(rec["trl"]["cpu"], rec["ours"]["cpu"])]))
    out["speedup_wall"] = float(np.median([t / o for t, o in zip(rec["trl"]["wall"], rec["ours"]["wall"])]))
    return out


def same_batch_losses(path, seed: int = 0) -> dict:
    """GRPO loss (beta 0, eps 0.2, DeepSeekMath's per-sequence token mean) of TRL's _compute_loss and ours on one
    batch: the same prompt, completions, advantages and old log-probs (the policy's minus a random offset)."""
    import gpu
    from gpu.batch import build_batch, token_logprobs
    from gpu.data import encode_prompt
    from gpu.rollout import Rollouts
    trainer = _trl_trainer(path, 1)
    trainer.current_gradient_accumulation_steps = 1
    tok = trainer.processing_class
    g = torch.Generator().manual_seed(seed)
    prompt = encode_prompt(tok, "What is 3 + 4? Put the final answer in \\boxed{}.")
    lens = torch.randint(4, MAX_NEW + 1, (P * G,), generator=g).tolist()
    comps = [torch.randint(3, tok.vocab_size, (n,), generator=g).tolist() for n in lens]
    ro = Rollouts([prompt] * len(comps), comps, [[0.0] * n for n in lens], [False] * len(comps))
    b = build_batch(ro, tok.pad_token_id)
    model = trainer.model
    logp, _ = token_logprobs(model, b, chunk=1024)
    pl = len(prompt)
    ours_tok = logp[:, pl - 1:]  # completion positions, [B, MAX_NEW]
    cmask = b.mask[:, pl - 1:]
    offset = 0.1 * torch.randn(ours_tok.shape, generator=g) * cmask
    old = (ours_tok.detach() - offset) * cmask
    adv = torch.randn(P, G, generator=g)
    adv = (adv - adv.mean(1, keepdim=True)).reshape(-1)
    ours_loss, st = gpu.policy_loss("grpo", ours_tok, old, adv[:, None] * cmask, cmask, group_size=G, beta=0.0)
    T = cmask.shape[1]
    comp_ids = torch.full((len(comps), T), tok.pad_token_id, dtype=torch.long)
    for i, c in enumerate(comps):
        comp_ids[i, :len(c)] = torch.tensor(c)
    inputs = {"prompt_ids": torch.tensor([prompt] * len(comps)), "prompt_mask": torch.ones(len(comps), pl,
                                                                                             dtype=torch.long),
              "completion_ids": comp_ids, "completion_mask": cmask.long(), "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": cmask.sum()}
    model.train()
    trl_loss = trainer._compute_loss(model, inputs)
    a, b_ = float(ours_loss.detach()), float(trl_loss.detach())
    return {"ours_loss": a, "trl_loss": b_, "abs_diff": abs(a - b_), "clip_frac": st["clip_frac"]}


MODELS = {"smollm2": "SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49,152)",
          "tiny": "tiny Qwen2 (hidden 128, 2 layers)"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="smollm2")
    ap.add_argument("--steps", type=int, default=4, help="timed steps of each trainer (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from gpu.models import resolve_model
    path = resolve_model(a.model)
    res = {"settings": {"prompts": P, "group_size": G, "max_new_tokens": MAX_NEW, "lr": LR, "engine": "hf generate",
                        "loss": "grpo, beta 0, eps 0.2", "model": MODELS[a.model], "threads": a.threads,
                        "clock": "cpu" if a.threads == 1 else "wall"},
           **same_batch_losses(path)}
    ours = _ours(path, 10**6, tempfile.mkdtemp(prefix="cliplab-ours-"))
    for key, gc in (("trl_default", True), ("trl_no_checkpointing", False)):  # GRPOConfig's default, then without
        res[key] = time_both(path, a.steps, gradient_checkpointing=gc, ours=ours)
        if a.out:  # written after each, so that a long run keeps what it measured
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
    print(summary(res))
    return res


def summary(res: dict) -> str:
    """The comparison as a person reads it: the two losses on one batch, then a table with a row per TRL setting
    (seconds per step by the chosen clock, speed-up by CPU and wall time, mean completion lengths)."""
    import pandas as pd
    clock = res["settings"]["clock"]
    rows = {key: {"TRL gradient checkpointing": r["gradient_checkpointing_trl"], "steps timed": r["steps_timed"],
                  f"ours s/step ({clock})": r[f"ours_{clock}_s_median"],
                  f"TRL s/step ({clock})": r[f"trl_{clock}_s_median"],
                  "speed-up (CPU)": r["speedup"], "speed-up (wall)": r["speedup_wall"],
                  "ours mean length": r["ours_len_mean"], "TRL mean length": r["trl_len_mean"]}
            for key in ("trl_default", "trl_no_checkpointing") if (r := res.get(key))}
    table = pd.DataFrame.from_dict(rows, orient="index")
    settings = ", ".join(f"{k} {v}" for k, v in res["settings"].items())
    return (f"{settings}\nloss on one batch: ours {res['ours_loss']:.6g}, TRL {res['trl_loss']:.6g} "
            f"(|diff| {res['abs_diff']:.2g})\n\n{table.to_string(float_format=lambda x: f'{x:.3g}')}")


if __name__ == "__main__":
    main()
