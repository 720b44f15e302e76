"""Paper-scale recipes (``configs/recipes/<name>/recipe.yaml``): verl hydra overrides and TRL + accelerate
settings, each next to its source, and the commands that launch them, behind ``cliplab recipe``:

    cliplab recipe list                                        # the recipes and their runs
    cliplab recipe launch verl dcpo_math7b dcpo --model DIR --train FILE --val FILE --out DIR [--dry-run]
    configs/recipes/dcpo_math7b/launch_trl.sh dcpo --model DIR --train FILE --out DIR   # accelerate launch ... trl
    cliplab recipe cost                                        # the cost table of configs/recipes/README.md

A launch writes ``OUT/<recipe>/<run>/run.json`` (what the run is) beside the framework's own logs (verl: its file
logger's ``verl.jsonl`` and the console in ``console.log``; TRL: ``trainer_state.json``), which
``cliplab report OUT`` reads.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from spec.records import read_text
from spec.registry import ALGORITHMS
from spec.schema import did_you_mean

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
    try:
        r = yaml.safe_load(read_text(path))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({' '.join(str(exc).split())})") from None
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


def run_names(root=ROOT) -> dict[str, list[str]]:
    """Each recipe's run names, read without checking the recipe (``load`` does): for help texts, which a broken
    recipe must not stop (its runs are then left out)."""
    names = {}
    for path in sorted(Path(root).glob("*/recipe.yaml")):
        try:
            names[path.parent.name] = [str(run) for run in yaml.safe_load(read_text(path))["runs"]]
        except (ValueError, yaml.YAMLError, KeyError, TypeError):
            names[path.parent.name] = []
    return names


def find(recipe: str, root=ROOT) -> dict:
    """A recipe by its name (a folder of ``root``) or its folder; a ValueError naming the recipes otherwise."""
    names = sorted(p.parent.name for p in Path(root).glob("*/recipe.yaml"))
    if recipe in names:
        return load(Path(root) / recipe)
    if (Path(recipe) / "recipe.yaml").is_file():
        return load(recipe)
    raise ValueError(f"recipe: unknown recipe {recipe!r}{did_you_mean(recipe, names)}; expected one of "
                     f"{', '.join(names)} or a folder holding a recipe.yaml")


def listing(recipes=None) -> str:
    """The recipes, one line each, and their runs (algorithm; the runs with a TRL variant marked)."""
    lines = []
    for r in recipes or all_recipes():
        runs = ", ".join(f"{run} ({spec['algorithm']}{', TRL too' if 'trl' in spec else ''})"
                         for run, spec in r["runs"].items())
        lines += [f"{r['name']}: {r['title']}", f"  paper: {r['paper']}", f"  runs: {runs}"]
    return "\n".join(lines) + "\n"


def _run(r: dict, run: str) -> dict:
    if run not in r["runs"]:
        raise ValueError(f"run: {r['folder'] / 'recipe.yaml'} has runs {', '.join(r['runs'])}, got {run!r}"
                         f"{did_you_mean(run, r['runs'])}")
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


def verl_launch(r: dict, run: str, paths: dict, out: Path, extra=()) -> tuple[list[str], dict]:
    """The command that runs verl's trainer with the recipe's overrides (then ``extra``), and the environment it
    adds: verl's file logger writing into OUT/recipe/run and cliplab's plug-in loaded in every process."""
    check_paths(r, paths)
    folder = Path(out) / r["name"] / run
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(r, run, paths),
           "trainer.logger=[console,file]", f"trainer.project_name={r['name']}", f"trainer.experiment_name={run}",
           f"trainer.default_local_dir={folder / 'checkpoints'}", *extra]
    env = {"VERL_FILE_LOGGER_PATH": str(folder / "verl.jsonl"),
           "VERL_USE_EXTERNAL_MODULES": "gpu.integrations.verl_plugin"}
    return cmd, env


def dry_run_verl(r: dict, run: str, paths: dict, out: Path, extra=()) -> str:
    """What ``launch_verl`` runs, as one shell line with its environment, and what it writes."""
    cmd, env = verl_launch(r, run, paths, out, extra)
    folder = Path(out) / r["name"] / run
    return (f"# verl: {r['name']} / {run}; writes {folder / 'run.json'}, verl.jsonl and console.log beside it\n"
            + shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *cmd]) + "\n")


def launch_verl(r: dict, run: str, paths: dict, out: Path, extra=()) -> list[str]:
    """Run verl's trainer (``verl_launch``), its console teed into OUT/recipe/run/console.log."""
    cmd, env = verl_launch(r, run, paths, out, extra)
    key = "trainer.total_training_steps="
    steps = [int(o[len(key):]) for o in cmd if o.startswith(key)]
    folder = _sidecar(r, run, "verl", Path(out), steps[-1] if steps else r["budget"]["steps"])
    with (folder / "console.log").open("a") as log, subprocess.Popen(cmd, env={**os.environ, **env},
                                                                     stdout=subprocess.PIPE,
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


def trl_plan(r: dict, run: str, paths: dict, out: Path, **args) -> dict:
    """What the TRL variant of ``run`` trains with, without importing TRL: its GRPOConfig fields (``args``
    override them, e.g. for a small machine; ``output_dir`` is OUT/recipe/run), cliplab's algorithm and
    hyper-parameters, the reward, and the accelerate command that launches it on one node."""
    spec = _run(r, run)
    if "trl" not in spec:
        raise ValueError(f"run: {run!r} of {r['folder'] / 'recipe.yaml'} has no TRL variant (see its not_reproduced)")
    check_paths(r, paths, keys=("model", "train"))
    config = {k: v for k, v, _ in r["trl"]["args"]}
    config.update({k: v for k, v, _ in spec["trl"].get("args", [])})
    config.update(args)
    config["output_dir"] = str(Path(out) / r["name"] / run)
    accelerate = ["accelerate", "launch", "--config_file", str(r["folder"] / "accelerate_zero3.yaml"), "-m",
                  "harness.cli", "recipe", "launch", "trl", str(r["folder"]), run, "--model", str(paths["model"]),
                  "--train", str(paths["train"]), "--out", str(out)]
    return {"config": config, "algorithm": spec["algorithm"], "hparams": dict(spec["trl"].get("hparams") or {}),
            "reward": r["trl"]["reward"], "command": accelerate}


def dry_run_trl(r: dict, run: str, paths: dict, out: Path) -> str:
    """The accelerate command of the TRL variant of ``run``, its trainer and every GRPOConfig field it sets."""
    plan = trl_plan(r, run, paths, out)
    lines = [f"# TRL + accelerate: {r['name']} / {run} on one node of {r['trl']['gpus']} GPUs (ZeRO-3); writes "
             f"{Path(plan['config']['output_dir']) / 'run.json'}, checkpoints and trainer_state.json beside it",
             shlex.join(plan["command"]),
             f"# CliplabGRPOTrainer(algorithm={plan['algorithm']!r}, hparams={plan['hparams']}, reward "
             f"{plan['reward']!r}), GRPOConfig:",
             *(f"#   {k} = {v!r}" for k, v in plan["config"].items())]
    return "\n".join(lines) + "\n"


def trl_trainer(r: dict, run: str, paths: dict, out: Path, **args):
    """The recipe's CliplabGRPOTrainer for ``run`` (``trl_plan``); ``args`` override GRPOConfig fields."""
    plan = trl_plan(r, run, paths, out, **args)
    from harness.conform.targets.trl import _import_trl
    trl = _import_trl()
    from gpu.integrations.trl_plugin import CliplabGRPOTrainer
    config = plan["config"]
    _sidecar(r, run, "trl", Path(out), config["max_steps"])
    return CliplabGRPOTrainer(model=str(paths["model"]), reward_funcs=_trl_reward(plan["reward"]),
                              args=trl.GRPOConfig(**config), train_dataset=_dataset(paths["train"]),
                              algorithm=plan["algorithm"], hparams=plan["hparams"])


def launch_trl(r: dict, run: str, paths: dict, out: Path) -> None:
    """Train the TRL variant of ``run`` in this process (one of accelerate's), resuming from its last checkpoint."""
    trainer = trl_trainer(r, run, paths, out)
    trainer.train(resume_from_checkpoint=any(Path(trainer.args.output_dir).glob("checkpoint-*")) or None)
    trainer.save_state()


# ---- the cost table --------------------------------------------------------------------------------------------
def trl_sharding(r: dict) -> dict:
    """The TRL variant's sharding: ZeRO-3 over ``trl.gpus``, one micro-batch of whole sequences per GPU, and the
    colocated vLLM engine's share."""
    a = {k: v for k, v, _ in r["trl"]["args"]}
    tokens = a["per_device_train_batch_size"] * (r["budget"]["prompt_len"] + a["max_completion_length"])
    return {"gpus": r["trl"]["gpus"], "rollout_share": a["vllm_gpu_memory_utilization"], "engine_resident": True,
            "tokens_per_gpu": tokens}


#: The committed simulator sweep whose DAPO runs measure dynamic sampling's generation factor (feature_lm: the
#: language-model environment with shared parameters; its report is reports/sim/report.md).
GEN_FACTOR_SOURCE = ROOT.parents[1] / "reports" / "sim" / "summaries" / "feature_lm_main.json"


def measured_gen_factor(path=GEN_FACTOR_SOURCE) -> float:
    """DAPO's responses generated per trained response (``gen_per_trained``, the mean over seeds and steps) in the
    committed simulator sweep ``path``: the default factor of the dynamic-sampling runs' generation cost."""
    from spec.records import read_json
    return float(read_json(path)["algorithms"]["dapo"]["gen_per_trained"])


def dynamic_sampling(r: dict, run: str) -> bool:
    """Whether ``run`` refills all-equal groups (verl's ``algorithm.filter_groups``, DAPO's dynamic sampling)."""
    return "algorithm.filter_groups.enable=True" in overrides(r, run)


def run_cost(r: dict, run: str, gpu: str, sharding: dict | None = None, mfu: float = recipe_cost.MFU,
             response_len: int | None = None, gen_factor: float | None = None) -> dict:
    """Estimated GPU-hours and memory of one run of a recipe on ``gpu`` (under the recipe's verl sharding unless
    given), at ``mfu``, with responses of ``response_len`` tokens (default: the budget's maximum) and, for a
    dynamic-sampling run, ``gen_factor`` responses generated per trained one (default: ``measured_gen_factor``)."""
    b, s = r["budget"], sharding or r["sharding"]
    ref = any(o == "actor_rollout_ref.actor.use_kl_loss=True" for o in overrides(r, run))
    budget = recipe_cost.Budget(b["prompts"], b["group"], b["prompt_len"], response_len or b["response_len"],
                                b["steps"], b.get("epochs", 1), ref)
    factor = (measured_gen_factor() if gen_factor is None else gen_factor) if dynamic_sampling(r, run) else 1.0
    cost = recipe_cost.gpu_hours(r["model"]["name"], gpu, budget, mfu=mfu, gen_factor=factor)
    mem = recipe_cost.memory_per_gpu(r["model"]["name"], gpu, s["gpus"], s["tokens_per_gpu"], s["rollout_share"],
                                     s.get("engine_resident", False))
    return {**cost, "gen_factor": factor, "gpus": s["gpus"], **{f"mem_{k}": v for k, v in mem.items()}}


def cost_table(recipes=None, gpus: int | None = None, mfu: float = recipe_cost.MFU, response_len: int | None = None,
               gen_factor: float | None = None) -> str:
    """The markdown cost table of estimated GPU-hours: one row per recipe run, H100 and H200, each run on its
    recipe's GPUs (or ``gpus``), at ``mfu``, ``response_len`` and ``gen_factor`` as ``run_cost``."""
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"gpus: expected a positive number of GPUs, got {gpus!r}")
    if response_len is not None and (isinstance(response_len, bool) or not isinstance(response_len, int)
                                     or response_len < 1):
        raise ValueError(f"response_len: expected a positive number of tokens, got {response_len!r}")
    lines = ["| recipe | run | framework, GPUs | generated per trained | tokens/step | H100 GPU-h | H200 GPU-h | "
             "of which generation (H200) | H200 hours on its GPUs | attention share of training FLOPs | "
             "memory/GPU training (states + activations) | H100 fits | H200 fits |", "|---" * 13 + "|"]
    for r in recipes or all_recipes():
        rows = [(run, "verl", r["sharding"]) for run in r["runs"]]
        rows += [(run, "TRL", trl_sharding(r)) for run, spec in r["runs"].items() if "trl" in spec]
        for run, framework, shard in rows:
            shard = shard if gpus is None else {**shard, "gpus": gpus}
            h100, h200 = (run_cost(r, run, gpu, shard, mfu, response_len, gen_factor) for gpu in ("H100", "H200"))
            lines.append(
                f"| {r['name']} | {run} | {framework}, {shard['gpus']} | {h200['gen_factor']:.3g} | "
                f"{h200['tokens_per_step']:,.0f} | {h100['gpu_hours']:,.0f} | {h200['gpu_hours']:,.0f} | "
                f"{h200['generate_h']:,.0f} | {h200['gpu_hours'] / shard['gpus']:,.1f} | "
                f"{h200['train_attention_flops_per_step'] / h200['train_flops_per_step']:.0%} | "
                f"{h200['mem_train'] / 1e9:.1f} GB ({h200['mem_states'] / 1e9:.1f} + "
                f"{h200['mem_activations'] / 1e9:.1f}) | {'yes' if h100['mem_fits'] else 'no'} | "
                f"{'yes' if h200['mem_fits'] else 'no'} |")
    return "\n".join(lines) + "\n"


def cost_assumptions(mfu: float = recipe_cost.MFU, response_len: int | None = None,
                     gen_factor: float | None = None) -> str:
    """The assumptions of ``cost_table`` in one line, the generation factor's source named."""
    length = f"{response_len} tokens on average" if response_len else "at each recipe's maximum length"
    source = ("given" if gen_factor is not None else
              f"DAPO's measured gen_per_trained in {GEN_FACTOR_SOURCE.relative_to(ROOT.parents[1])}")
    factor = measured_gen_factor() if gen_factor is None else gen_factor
    return (f"MFU {mfu:g}; responses {length}; dynamic sampling generates {factor:.3g} responses per trained one "
            f"({source})")
