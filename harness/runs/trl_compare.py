"""Side by side with TRL's GRPOTrainer on the same model and settings (prompts, G, completion length, transformers
generate, lr, GRPO loss, beta 0): seconds of a whole step (generate, reward, loss, update), a fresh pair of trainers
per TRL setting whose steps alternate in one process, pair by pair and in alternating order; the ratio's median
and t interval over the pairs, the mean completion lengths of the timed steps; and both losses on one fixed batch.

    python -m harness.runs.trl_compare [--model smollm2|tiny|tiny_char] [--pairs 5] [--threads 1] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

LR = 1e-5
MODELS = {"smollm2": "SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49,152)",
          "tiny": "tiny Qwen2 (hidden 128, 2 layers)",
          "tiny_char": "tiny_char, the tiny tier's character-level Llama (configs/tiny/model.yaml)"}
# prompts per step, G, new tokens, our data section: SmolLM2's comparison, and the tiny tier's batch on its task
SHAPES = {"smollm2": (4, 4, 16, {"n": 64}), "tiny": (4, 4, 16, {"n": 64}),
          "tiny_char": (16, 8, 24, {"source": "addition", "digits": 3, "n": 64})}


def digit_reward(text: str) -> float:
    """Share of digit characters: a dense reward on which a random model's samples differ."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def _trl_reward(completions, **kwargs):
    return [digit_reward(c if isinstance(c, str) else c[-1]["content"]) for c in completions]


def _trl_trainer(path, steps, gradient_checkpointing: bool = True, shape=SHAPES["tiny"]):
    """TRL's GRPOTrainer on our problems, prompted as ``gpu.data.encode_prompt`` prompts them (in the chat template,
    or the question and a newline where the tokenizer has none)."""
    from datasets import Dataset

    from gpu.data import load_problems
    from gpu.models import load_policy, load_tokenizer
    from harness.conform.targets.trl import _import_trl
    trl = _import_trl()
    P, G, MAX_NEW, data_kw = shape
    tok = load_tokenizer(path)
    problems = load_problems(data_kw.get("source", "arithmetic"), **{k: v for k, v in data_kw.items() if k != "source"})
    chat = bool(getattr(tok, "chat_template", None))
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p.question}] if chat else p.question + "\n"
                                         for p in problems]})
    args = trl.GRPOConfig(output_dir=tempfile.mkdtemp(prefix="cliplab-trl-"), per_device_train_batch_size=P * G,
                          num_generations=G, max_completion_length=MAX_NEW, learning_rate=LR, max_steps=steps,
                          loss_type="grpo", beta=0.0, temperature=1.0, top_k=0, top_p=1.0, use_cpu=True, bf16=False,
                          report_to=[], save_strategy="no", logging_strategy="no", max_grad_norm=1.0,
                          gradient_checkpointing=gradient_checkpointing,
                          lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, seed=0)
    return trl.GRPOTrainer(model=load_policy(path), reward_funcs=_trl_reward, args=args, train_dataset=data,
                           processing_class=tok)


def _ours(path, steps, out, shape=SHAPES["tiny"]):
    from gpu.config import from_dict
    from gpu.train import Trainer
    P, G, MAX_NEW, data_kw = shape
    raw = {"run": {"out_dir": out, "steps": steps, "save_every": 10**6, "resume": False, "progress": False},
           "model": {"name": str(path)}, "data": data_kw,
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


def time_both(path, pairs: int, gradient_checkpointing: bool = True, shape=SHAPES["tiny"]) -> dict:
    """Seconds per whole step of TRL and ours, from a fresh trainer each, in ``pairs`` timed pairs after one warm-up
    pair: pair k runs TRL's step then ours, or (k odd) ours then TRL's, so that order and load drift fall on both;
    each step timed by the wall clock and by CPU time (``cpu_seconds``). ``speedup`` is the median over pairs of TRL's
    CPU seconds over ours (with one torch thread, CPU time is what load on a shared machine leaves unchanged), with
    the t interval of that ratio's mean; the mean completion lengths are the timed steps'."""
    from transformers import TrainerCallback

    from harness.reports.stats import t_interval
    ours = _ours(path, 10**6, tempfile.mkdtemp(prefix="cliplab-ours-"), shape)
    rec = {k: {"start": [], "wall": [], "cpu": [], "len_mean": []} for k in ("ours", "trl")}
    clock = {}

    def our_step():
        w0, c0 = time.perf_counter(), cpu_seconds()
        rec["ours"]["start"].append(w0)
        m = ours.train_step()
        rec["ours"]["cpu"].append(cpu_seconds() - c0)
        rec["ours"]["wall"].append(time.perf_counter() - w0)
        rec["ours"]["len_mean"].append(m["len_mean"])

    class Alternate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock["ours_first"] = state.global_step % 2 == 1
            if clock["ours_first"]:
                our_step()
            clock.update(wall=time.perf_counter(), cpu=cpu_seconds())
            rec["trl"]["start"].append(clock["wall"])

        def on_step_end(self, args, state, control, **kw):
            rec["trl"]["cpu"].append(cpu_seconds() - clock["cpu"])
            rec["trl"]["wall"].append(time.perf_counter() - clock["wall"])
            rec["trl"]["len_mean"].append(trainer._metrics["train"]["completions/mean_length"][-1])
            if not clock["ours_first"]:
                our_step()
    trainer = _trl_trainer(path, pairs + 1, gradient_checkpointing, shape)
    trainer.add_callback(Alternate())
    try:
        trainer.train()
    finally:
        ours.close()
    out = {"gradient_checkpointing_trl": gradient_checkpointing, "pairs_timed": pairs}
    for k, r in rec.items():
        for c in r:
            r[c] = r[c][1:]  # the warm-up pair dropped
        for c in ("wall", "cpu"):
            out[f"{k}_{c}_s_median"] = float(np.median(r[c]))
        out[f"{k}_len_mean"] = float(np.mean(r["len_mean"]))
        out[f"{k}_steps"] = r
    for c, key in (("cpu", "speedup"), ("wall", "speedup_wall")):
        ratios = np.array(rec["trl"][c]) / np.array(rec["ours"][c])
        ci = t_interval(ratios)
        out[key], out[f"{key}_mean"], out[f"{key}_half"] = float(np.median(ratios)), ci.mean, ci.half
    return out


def same_batch_losses(path, seed: int = 0, shape=SHAPES["tiny"]) -> dict:
    """GRPO loss (beta 0, eps 0.2, DeepSeekMath's per-sequence token mean) of TRL's _compute_loss and ours on one
    batch: the same prompt, completions, advantages and old log-probs (the policy's minus a random offset)."""
    import gpu
    from gpu.batch import build_batch, token_logprobs
    from gpu.data import encode_prompt, load_problems
    from gpu.rollout import Rollouts
    P, G, MAX_NEW, data_kw = shape
    trainer = _trl_trainer(path, 1, shape=shape)
    trainer.current_gradient_accumulation_steps = 1
    tok = trainer.processing_class
    g = torch.Generator().manual_seed(seed)
    source, kw = data_kw.get("source", "arithmetic"), {k: v for k, v in data_kw.items() if k != "source"}
    problem = load_problems(source, **{**kw, "n": 1, "seed": seed})[0]
    prompt = encode_prompt(tok, problem.question)
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="smollm2")
    ap.add_argument("--pairs", type=int, default=5, help="timed pairs of steps per TRL setting (after a warm-up pair)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both")
    ap.add_argument("--out", default=None, help="JSON file, rewritten after each TRL setting")
    a = ap.parse_args(argv)
    if a.pairs < 2:
        ap.error(f"--pairs: expected an int >= 2 (for a t interval), got {a.pairs}")
    if a.threads < 1:
        ap.error(f"--threads: expected an int >= 1, got {a.threads}")
    torch.set_num_threads(a.threads)
    from gpu.models import resolve_model
    from spec.records import write_json
    try:
        path = resolve_model(a.model)
    except ValueError as e:
        ap.error(str(e))
    shape = SHAPES[a.model]
    P, G, MAX_NEW, data_kw = shape
    res = {"settings": {"prompts": P, "group_size": G, "max_new_tokens": MAX_NEW, "data": data_kw, "lr": LR,
                        "engine": "hf generate", "loss": "grpo, beta 0, eps 0.2", "model": MODELS[a.model],
                        "threads": a.threads, "clock": "cpu" if a.threads == 1 else "wall",
                        "load_before": os.getloadavg()},
           **same_batch_losses(path, shape=shape)}
    for key, gc in (("trl_default", True), ("trl_no_checkpointing", False)):  # GRPOConfig's default, then without
        res[key] = time_both(path, a.pairs, gradient_checkpointing=gc, shape=shape)  # a fresh pair of trainers each
        res["settings"]["load_after"] = os.getloadavg()
        if a.out:  # written after each, so that a long run keeps what it measured
            write_json(a.out, res)
    print(summary(res))
    return res


def summary(res: dict) -> str:
    """The comparison as a person reads it: the two losses on one batch, then a table with a row per TRL setting
    (seconds per step by the chosen clock, the speed-up by CPU time with its interval and by wall time, the timed
    steps' mean completion lengths)."""
    import pandas as pd
    clock = res["settings"]["clock"]
    rows = {key: {"TRL gradient checkpointing": r["gradient_checkpointing_trl"], "pairs timed": r["pairs_timed"],
                  f"ours s/step ({clock})": r[f"ours_{clock}_s_median"],
                  f"TRL s/step ({clock})": r[f"trl_{clock}_s_median"],
                  "speed-up (CPU), median": r["speedup"],
                  "mean, 95% t interval": f"{r['speedup_mean']:.3g} +- {r['speedup_half']:.2g}",
                  "speed-up (wall), median": r["speedup_wall"],
                  "ours mean length": r["ours_len_mean"], "TRL mean length": r["trl_len_mean"]}
            for key in ("trl_default", "trl_no_checkpointing") if (r := res.get(key))}
    table = pd.DataFrame.from_dict(rows, orient="index")
    settings = ", ".join(f"{k} {v}" for k, v in res["settings"].items())
    return (f"{settings}\nloss on one batch: ours {res['ours_loss']:.6g}, TRL {res['trl_loss']:.6g} "
            f"(|diff| {res['abs_diff']:.2g})\n\n{table.to_string(float_format=lambda x: f'{x:.3g}')}")


if __name__ == "__main__":
    main()
