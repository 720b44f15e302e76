"""Paper-scale recipes (``configs/recipes/<name>/recipe.yaml``): verl hydra overrides and TRL + accelerate
settings, each next to its source, and the commands that launch them.

    python -m harness.recipes.launch verl configs/recipes/dcpo_math7b dcpo --model DIR --train FILE --val FILE --out DIR
    accelerate launch -m harness.recipes.launch trl configs/recipes/dcpo_math7b dcpo --model DIR ... --out DIR
    python -m harness.recipes.launch cost            # the cost table of configs/recipes/README.md

A launch writes ``OUT/<recipe>/<run>/run.json`` (what the run is) beside the framework's own logs (verl: its file
logger's ``verl.jsonl`` and the console in ``console.log``; TRL: ``trainer_state.json``), which
``cliplab report OUT`` reads.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from spec.registry import ALGORITHMS

from harness.recipes import cost as recipe_cost

ROOT = Path(__file__).resolve().parents[2] / "configs" / "recipes"
PLACEHOLDERS = ("model", "train", "val")
KEYS = {"title", "paper", "model", "budget", "sharding", "settings", "runs", "trl", "not_reproduced"}


def _need(cond, where: Path, what: str):
    if not cond:
        raise ValueError(f"{where}: {what}")


def _sourced(items, where: Path, field: str) -> list[list[str]]:
    """A list of [setting, source] (or [key, value, source]) pairs with a non-empty source each."""
    _need(isinstance(items, list), where, f"{field}: expected a list of [setting, source]")
    for item in items:
        _need(isinstance(item, list) and len(item) in (2, 3) and str(item[-1]).strip(), where,
              f"{field}: every setting needs its source, got {item!r}")
    return items


def load(folder) -> dict:
    """A recipe folder's recipe.yaml, checked: known keys, a source beside every setting, a registered algorithm
    per run, a model the cost model knows."""
    folder = Path(folder)
    path = folder / "recipe.yaml"
    _need(path.is_file(), path, "no such recipe file")
    r = yaml.safe_load(path.read_text())
    _need(isinstance(r, dict) and set(r) <= KEYS and KEYS - {"trl", "settings"} <= set(r), path,
          f"expected the keys {sorted(KEYS)} (trl and settings optional)")
    _need(r["model"].get("name") in recipe_cost.MODELS, path, f"model.name: expected one of {list(recipe_cost.MODELS)}")
    _sourced(r.get("settings", []), path, "settings")
    for name, run in r["runs"].items():
        _need(run.get("algorithm") in ALGORITHMS, path, f"runs.{name}.algorithm: expected one of {list(ALGORITHMS)}")
        if "extends" in run:
            _need(run["extends"] in r["runs"] and run["extends"] != name, path,
                  f"runs.{name}.extends: expected another run of this recipe, got {run['extends']!r}")
        _sourced(run.get("settings", []), path, f"runs.{name}.settings")
        if "trl" in run:
            _need("trl" in r, path, f"runs.{name}.trl: the recipe has no trl section")
    if "trl" in r:
        _sourced(r["trl"]["args"], path, "trl.args")
    r["name"], r["folder"] = folder.name, folder
    return r


def all_recipes(root=ROOT) -> list[dict]:
    return [load(p.parent) for p in sorted(Path(root).glob("*/recipe.yaml"))]


def _run(r: dict, run: str) -> dict:
    if run not in r["runs"]:
        raise ValueError(f"run: {r['folder'] / 'recipe.yaml'} has runs {', '.join(r['runs'])}, got {run!r}")
    return r["runs"][run]


def _settings(r: dict, run: str) -> list:
    """A run's own settings after those of the run it extends (a ladder adds one change per rung)."""
    spec = _run(r, run)
    return (_settings(r, spec["extends"]) if "extends" in spec else []) + spec.get("settings", [])


def overrides(r: dict, run: str, paths: dict | None = None) -> list[str]:
    """The hydra overrides of ``run`` (recipe-wide settings, then the run's), with <model>, <train>, <val> replaced
    by ``paths`` where given."""
    items = [str(s[0]) for s in r.get("settings", []) + _settings(r, run)]
    for key, value in (paths or {}).items():
        items = [item.replace(f"<{key}>", str(value)) for item in items]
    return items


def check_paths(r: dict, paths: dict, keys=PLACEHOLDERS) -> None:
    """Each path the recipe is asked to use exists (one line naming the missing one)."""
    for key in keys:
        for p in str(paths.get(key) or "").split(","):
            what = f"{r['model']['name']} model folder" if key == "model" else f"{key} data file"
            if not p or not Path(p).exists():
                raise ValueError(f"--{key}: {p or '(none given)'} does not exist (recipe "
                                 f"{r['folder'] / 'recipe.yaml'} needs its {what})")


def _sidecar(r: dict, run: str, framework: str, out: Path, steps: int) -> Path:
    """OUT/<recipe>/<run>/run.json: what the run is and how many steps it plans (to tell a cut-short log)."""
    folder = out / r["name"] / run
    folder.mkdir(parents=True, exist_ok=True)
    spec = _run(r, run)
    tmp = folder / f".run.json.{os.getpid()}"  # every process of a distributed launch writes it: atomically
    tmp.write_text(json.dumps({
        "recipe": r["name"], "run": run, "framework": framework, "algorithm": spec["algorithm"],
        "params": spec.get("params", {}), "steps": steps, "paper": r.get("paper")}, indent=1))
    os.replace(tmp, folder / "run.json")
    return folder


def launch_verl(r: dict, run: str, paths: dict, out: Path, extra: list[str], dry_run: bool = False) -> list[str]:
    """Run verl's trainer with the recipe's overrides, its file and console loggers writing into OUT/recipe/run."""
    check_paths(r, paths)
    folder = out / r["name"] / run
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(r, run, paths),
           "trainer.logger=[console,file]", f"trainer.project_name={r['name']}", f"trainer.experiment_name={run}",
           f"trainer.default_local_dir={folder / 'checkpoints'}", *extra]
    if dry_run:
        return cmd
    key = "trainer.total_training_steps="
    steps = [int(o[len(key):]) for o in cmd if o.startswith(key)]
    _sidecar(r, run, "verl", out, steps[-1] if steps else r["budget"]["steps"])
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(folder / "verl.jsonl"),
           "VERL_USE_EXTERNAL_MODULES": "gpu.integrations.verl_plugin"}
    with (folder / "console.log").open("a") as log, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                                     stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
    if proc.returncode:
        raise SystemExit(proc.returncode)
    return cmd


# ---- TRL + accelerate ------------------------------------------------------------------------------------------
def _dataset(path):
    """Prompts and gold answers for TRL: verl's RL parquet (``prompt`` messages, ``reward_model.ground_truth``), so
    both frameworks train on one file, or a GSM8K / MATH layout file (gpu.data.load_local)."""
    from datasets import Dataset

    from gpu.data import load_local
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd
        rows = pd.read_parquet(path)
        if "reward_model" in rows.columns:
            prompts = [p if isinstance(p, str) else [dict(m) for m in p] for p in rows["prompt"]]
            answers = [str(rm["ground_truth"]) for rm in rows["reward_model"]]
            return Dataset.from_dict({"prompt": prompts, "answer": answers})
    problems = load_local(path)
    return Dataset.from_dict({"prompt": [p.question for p in problems], "answer": [p.answer for p in problems]})


def _trl_reward(name: str):
    from gpu.rewards import get_reward
    fn = get_reward(name)

    def reward(completions, answer, **kwargs):
        return [fn(c if isinstance(c, str) else c[-1]["content"], a) for c, a in zip(completions, answer)]
    reward.__name__ = f"{name}_reward"
    return reward


def trl_trainer(r: dict, run: str, paths: dict, out: Path, **args):
    """The recipe's CliplabGRPOTrainer for ``run``; ``args`` override GRPOConfig fields (e.g. for a small machine)."""
    spec = _run(r, run)
    if "trl" not in spec:
        raise ValueError(f"run: {run!r} of {r['folder'] / 'recipe.yaml'} has no TRL variant (see its not_reproduced)")
    check_paths(r, paths, keys=("model", "train"))
    from harness.conform.targets.trl import _import_trl
    trl = _import_trl()
    from gpu.integrations.trl_plugin import CliplabGRPOTrainer
    config = {k: v for k, v, _ in r["trl"]["args"]}
    config.update({k: v for k, v, _ in spec["trl"].get("args", [])})
    config.update(args)
    config["output_dir"] = str(_sidecar(r, run, "trl", out, config["max_steps"]))
    return CliplabGRPOTrainer(model=str(paths["model"]), reward_funcs=_trl_reward(r["trl"]["reward"]),
                              args=trl.GRPOConfig(**config), train_dataset=_dataset(paths["train"]),
                              algorithm=spec["algorithm"], hparams=dict(spec["trl"].get("hparams") or {}))


# ---- the cost table --------------------------------------------------------------------------------------------
def trl_sharding(r: dict) -> dict:
    """The TRL variant's sharding: ZeRO-3 over ``trl.gpus``, one micro-batch of whole sequences per GPU, and the
    colocated vLLM engine's share."""
    a = {k: v for k, v, _ in r["trl"]["args"]}
    tokens = a["per_device_train_batch_size"] * (r["budget"]["prompt_len"] + a["max_completion_length"])
    return {"gpus": r["trl"]["gpus"], "rollout_share": a["vllm_gpu_memory_utilization"], "engine_resident": True,
            "tokens_per_gpu": tokens}


def run_cost(r: dict, run: str, gpu: str, sharding: dict | None = None) -> dict:
    """Estimated GPU-hours and memory of one run of a recipe on ``gpu`` (under the recipe's verl sharding unless
    given)."""
    b, s = r["budget"], sharding or r["sharding"]
    ref = any(o == "actor_rollout_ref.actor.use_kl_loss=True" for o in overrides(r, run))
    budget = recipe_cost.Budget(b["prompts"], b["group"], b["prompt_len"], b["response_len"], b["steps"],
                                b.get("epochs", 1), ref)
    cost = recipe_cost.gpu_hours(r["model"]["name"], gpu, budget)
    mem = recipe_cost.memory_per_gpu(r["model"]["name"], gpu, s["gpus"], s["tokens_per_gpu"], s["rollout_share"],
                                     s.get("engine_resident", False))
    return {**cost, **{f"mem_{k}": v for k, v in mem.items()}}


def cost_table(recipes=None) -> str:
    """The markdown cost table of estimated GPU-hours: one row per recipe run, H100 and H200."""
    lines = ["| recipe | run | framework, GPUs | tokens/step | H100 GPU-h | H200 GPU-h | of which generation (H200) | "
             "attention share of training FLOPs | memory/GPU training (states + activations) | H100 fits | "
             "H200 fits |", "|---" * 11 + "|"]
    for r in recipes or all_recipes():
        rows = [(run, "verl", r["sharding"]) for run in r["runs"]]
        rows += [(run, "TRL", trl_sharding(r)) for run, spec in r["runs"].items() if "trl" in spec]
        for run, framework, shard in rows:
            h100, h200 = run_cost(r, run, "H100", shard), run_cost(r, run, "H200", shard)
            lines.append(
                f"| {r['name']} | {run} | {framework}, {shard['gpus']} | {h200['tokens_per_step']:.3g} | "
                f"{h100['gpu_hours']:,.0f} | {h200['gpu_hours']:,.0f} | {h200['generate_h']:,.0f} | "
                f"{h200['train_attention_flops_per_step'] / h200['train_flops_per_step']:.0%} | "
                f"{h200['mem_train'] / 1e9:.1f} GB ({h200['mem_states'] / 1e9:.1f} + "
                f"{h200['mem_activations'] / 1e9:.1f}) | {'yes' if h100['mem_fits'] else 'no'} | "
                f"{'yes' if h200['mem_fits'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.recipes.launch", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("verl", "trl"):
        s = sub.add_parser(name)
        s.add_argument("recipe")
        s.add_argument("run")
        s.add_argument("--model", required=True)
        s.add_argument("--train", required=True)
        s.add_argument("--val", default=None)
        s.add_argument("--out", default="runs/cluster")
        s.add_argument("--dry-run", action="store_true")
    sub.add_parser("cost")
    args, extra = p.parse_known_args(argv)
    try:
        if args.cmd == "cost":
            print(cost_table(), end="")
            return
        r = load(args.recipe)
        paths = {"model": args.model, "train": args.train, "val": args.val}
        if args.cmd == "verl":
            cmd = launch_verl(r, args.run, paths, Path(args.out), extra, args.dry_run)
            if args.dry_run:
                print(" ".join(cmd))
        else:
            trainer = trl_trainer(r, args.run, paths, Path(args.out))
            if not args.dry_run:
                trainer.train(resume_from_checkpoint=any(Path(trainer.args.output_dir).glob("checkpoint-*")) or None)
                trainer.save_state()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
