"""The ``cliplab`` command line."""
from __future__ import annotations

import inspect
import json
import re
import sys
import warnings
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

from harness.conform.targets import BUILTIN as TARGETS, check_target_name
from harness.recipes.cost import MFU
from spec.extras import install_hint, missing, require
from spec.schema import cut, did_you_mean

app = typer.Typer(help="cliplab: verify, simulate and reproduce LLM policy-optimisation objectives "
                       "(PPO, GRPO, Dr.GRPO, DAPO, GSPO, GSPO-token, DCPO, SAPO, DPO).",
                  no_args_is_help=True, add_completion=False)
console = Console()

#: The extra (pyproject.toml) each command needs beyond the core; `cliplab sim` needs none.
NEEDS = {"verify": "torch", "conform": "torch", "train": "gpu", "report": "reports", "demo": "gpu"}


def version() -> str:
    """cliplab's version: its installed package metadata's, else (a checkout that is not installed)
    pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version as installed
    try:
        return installed("cliplab")
    except PackageNotFoundError:
        import tomllib
        with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]["version"]


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"cliplab {version()}")
        raise typer.Exit()


@app.callback()
def _options(show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                               help="Print cliplab's version and exit.")):
    """Options before the command."""


class Command(TyperCommand):
    """A cliplab command: once its options are read (so that --help works on any install) and before it runs, the
    extra it needs (NEEDS) is checked, a one-line error naming it when it is not installed. Its help's paragraphs
    are wrapped to the terminal, not at the docstring's line breaks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.help = re.sub(r"(?<=\S)\n[ \t]*(?=\S)", " ", inspect.cleandoc(self.help or ""))

    def invoke(self, ctx):
        if self.name in NEEDS:
            _user_errors(require, NEEDS[self.name], f"cliplab {self.name}")
        return super().invoke(ctx)


def _verify_rows(seeds: int, quiet: bool, algos: Optional[list] = None):
    from tqdm import tqdm

    from harness.verify import layers as verify
    bar = tqdm(total=1, desc="verify", unit="case", disable=quiet, file=sys.stderr)

    def progress(done, total):
        bar.total = total
        bar.n = done
        bar.refresh()
    rows = verify.run(seeds=seeds, progress=progress, algos=algos)
    bar.close()
    return rows, verify.derivations() if algos is None else []


@app.command(cls=Command)
def verify(json_out: bool = typer.Option(False, "--json", help="Print the results as JSON instead of a table."),
           seeds: int = typer.Option(2, min=1, help="Fixed seeds per (algorithm, aggregation mode)."),
           out: Path = typer.Option(None, help="Also write the table as markdown to this file."),
           algos: Optional[str] = typer.Option(None, help="Only these algorithms and parts, comma-separated (e.g. "
                                               "grpo,dpo,gae); the derivations run without --algos.")):
    """Hold the three layers together: exact sympy (spec) vs NumPy float64 (sim) vs torch float64 and float32
    (gpu), for every policy algorithm under every option of harness.verify.layers.OPTIONS (aggregation modes, dual clip,
    KL kinds, delta, CISPO's cap, the Cov selections, rollout corrections), plus DPO, the advantage estimators
    (GRPO, Dr.GRPO, RLOO, GPG, REINFORCE++, SAS), GAE, the value loss, the KL estimators, DCPO's bounds, DAPO's
    shaping and filter, and the sympy derivations. Exits 1 on any disagreement. In a terminal the table is drawn;
    in a pipe or file it is markdown, one row a line."""
    from harness.verify.layers import names
    if out:
        from harness.reports.rundirs import output_file
        _user_errors(output_file, out)  # a bad --out fails before the run
    chosen = None if algos is None else _user_errors(names, algos)
    rows, derivations = _verify_rows(seeds, quiet=json_out, algos=chosen)
    ok = all(r["agrees"] for r in rows) and all(d["holds"] for d in derivations)
    if out:
        from harness.verify.layers import markdown
        from spec.records import write_text
        _user_errors(write_text, out, "# cliplab verify\n\n" + markdown(rows, derivations))
    if json_out:
        print(json.dumps({"ok": ok, "rows": rows, "derivations": derivations}, indent=1))
    elif not console.is_terminal:
        from harness.verify.layers import markdown
        print(markdown(rows, derivations), end="")
    else:
        from harness.verify.layers import COLUMNS, cells
        table = Table(title="cliplab verify: layer agreement")
        for col in COLUMNS:
            table.add_column(col)
        for r in rows:
            table.add_row(*cells(r)[:-1], "[green]agrees[/]" if r["agrees"] else "[red]DIFFERS[/]")
        console.print(table)
        for d in derivations:
            console.print(f"{'[green]holds[/]' if d['holds'] else '[red]FAILS[/]'}  {d['derivation']}")
    raise typer.Exit(0 if ok else 1)


@app.command(cls=Command)
def sim(env: str = typer.Option("toy_lm", help="Environment: bandit, toy_lm or feature_lm."),
        algos: str = typer.Option("all", help="Comma-separated algorithms, or 'all'."),
        seeds: str = typer.Option("20", help="Seeds per algorithm and grid point: a count (20: seeds 0-19), a range "
                                             "(1000-1019) or a list (1,5,9), split in halves into the discovery and "
                                             "replication sets; or the two sets as DISCOVERY:REPLICATION."),
        steps: int = typer.Option(300, help="RL steps per run."),
        set_: List[str] = typer.Option([], "--set", help="key=value, or key=v1,v2 for a grid (repeatable); "
                                                         "algo.key=value for one algorithm only."),
        out: Path = typer.Option(Path("runs/sim"), help="Sweep folder; rerunning the same command resumes it."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        workers: int = typer.Option(2, help="Worker processes (CPUs for the ray backend)."),
        backend: str = typer.Option("process", help="process (local processes) or ray."),
        ray_address: Optional[str] = typer.Option(None, help="Ray cluster address for --backend ray, e.g. auto."),
        wandb: Optional[str] = typer.Option(None, help="Also log each run, as it is done, to this Weights & Biases "
                                                       "project (WANDB_MODE=offline: to its run folder only)."),
        match: List[Path] = typer.Option([], "--match", help="Run folders or cluster logs (repeatable) whose regime "
                                                            "card feature_lm is fitted to first; the sweep then runs "
                                                            "at the fitted settings. Exit 1 if the card cannot be "
                                                            "reached."),
        match_label: Optional[str] = typer.Option(None, help="The label of the --match runs to fit (needed when they "
                                                             "hold several)."),
        match_budget: int = typer.Option(240, help="Simulator runs the --match fit may spend (3 seeds each; about 3 "
                                                  "minutes on 2 cores at 100 steps)."),
        fitted: Optional[Path] = typer.Option(None, help="The fit.json of an earlier --match: run at its settings "
                                                        "(feature_lm) without fitting again; they are every run's, "
                                                        "so labels name only what --set varies.")):
    """Simulate algorithms x seeds x grid on a contextual bandit or a toy language model (tabular, or feature_lm with
    shared parameters), writing per-step metrics as it goes (resumable) and OUT/summary.json with the means over
    seeds. With --match, first fit feature_lm's learning rate, schedule and prior to the regime card of your own
    runs, then ablate there."""
    from harness.runs.sim import match_command, sim_command  # first: importing sim keeps BLAS to one thread
    from harness.reports.rundirs import shell_line
    if match:
        if fitted is not None:
            _user_errors(_refuse, "fitted: --match fits anew; give --fitted (an earlier fit) or --match, not both")
        if not _user_errors(match_command, match, match_label, match_budget, env, algos, seeds, steps, set_,
                            str(out), json_out, workers):
            raise typer.Exit(1)
        return
    _user_errors(sim_command, env, algos, seeds, steps, set_, str(out), json_out, workers, True, backend,
                 ray_address, wandb, None if fitted is None else str(fitted))
    if missing("reports"):
        typer.echo(f"note: the plots and claims of `{shell_line('cliplab', 'report', out)}` need the reports extra: "
                   f"{install_hint('reports')}", err=True)


@app.command(cls=Command)
def report(dirs: List[Path] = typer.Argument(..., help="Simulator sweep folders, real-model run folders, or verl / "
                                                      "TRL logs (files or folders) from configs/recipes runs."),
           out: Optional[Path] = typer.Option(None, help="Markdown file (default DIRS[0]/report.md); PNGs beside "
                                                           "it."),
           label: List[str] = typer.Option([], "--label", help="NAME=PATH: call the run at PATH (one of DIRS) NAME "
                                                              "(repeatable)."),
           algo: List[str] = typer.Option([], "--algo", help="NAME=ALGO: the run NAME (its label, or one of DIRS) was "
                                                            "trained with ALGO, a registry algorithm (repeatable); "
                                                            "else its run.json's, or its folder name if that is "
                                                            "one.")):
    """A markdown report with plots. Simulator sweeps: curves per algorithm with seed bands, a summary, and the
    papers' claims with measurements and verdicts. Real-model runs (cliplab train): curves and a summary per run.
    Throughput JSON (python -m gpu.bench_h200 --out DIR): tokens/s and MFU per algorithm. Cluster logs (verl's
    JSONL or console log, TRL's trainer_state.json, TensorBoard event folders of either): the same comparison and
    claims table, runs named with --label and --algo."""
    typer.echo(_user_errors(_report, dirs, out, label, algo))


def _report(dirs: list[Path], out: Optional[Path], labels=(), algos=()) -> Path:
    """Throughput JSON gets the throughput report; cluster logs (verl, TRL: configs/recipes) or runs named with
    --label / --algo the cluster report; else the real-model report if any run under ``dirs`` is a real-model run
    (its config has a rollout section), else the simulator's."""
    from spec.records import read_text

    from harness.reports import cluster as cluster_logs
    from harness.reports import real as real_report
    from harness.reports import sim as sim_report
    from harness.reports import throughput as throughput_report
    from harness.reports.rundirs import check_dirs, cliplab_folders
    bench = throughput_report.find(dirs)
    if bench:
        return throughput_report.write_report(bench, out)
    if labels or algos or (not cliplab_folders(dirs) and cluster_logs.handles(dirs)):
        return cluster_logs.write_report(dirs, out, labels, algos)
    check_dirs(dirs)
    if not any(any(Path(d).glob("**/metrics.jsonl")) for d in dirs):  # a FIFO or folder: refused by its reader
        raise ValueError(f"dirs: no complete runs (config.json + metrics.jsonl, from cliplab sim or cliplab train) "
                         f"under {', '.join(map(str, dirs))}, and no throughput JSON (python -m gpu.bench_h200 --out "
                         f"DIR) or cluster logs ({cluster_logs.FORMATS}) to read instead")
    if any('"rollout"' in read_text(p) for d in dirs for p in Path(d).glob("**/config.json") if p.is_file()):
        return real_report.write_report(dirs, out or dirs[0] / "report.md")
    return sim_report.write_report(dirs, out)


@app.command(cls=Command)
def train(config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="YAML training config."),
          set_: List[str] = typer.Option([], "--set", help="section.field=value override (repeatable)."),
          allow_config_change: bool = typer.Option(False, "--allow-config-change",
                                                   help="Resume a run under a changed config (recorded in the run's "
                                                        "config_history.jsonl); refused otherwise.")):
    """Train (or resume) a real model from a YAML config (every field validated); writes metrics.jsonl,
    checkpoints and a progress bar; rerunning the same config resumes exactly where it stopped."""
    from harness.runs.train import train_command
    console.print(f"run folder: {_user_errors(train_command, config, set_, allow_config_change)}")


@app.command(cls=Command)
def conform(target: str = typer.Argument(..., help="A framework (harness/targets: " + ", ".join(TARGETS) + "), "
                                         "`all` (every framework whose environment is built, then the matrix "
                                         "README.md in --out), or module:function."),
            json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
            out: Optional[Path] = typer.Option(None, help="Write TARGET.md and TARGET.json here."),
            seeds: Optional[int] = typer.Option(None, help="Generated batches per check and case family (30), or "
                                                "per grid cell with --level step (5)."),
            adapter: Optional[str] = typer.Option(None, help="For module:function: KEY=VALUE items separated by "
                                                  "commas: algorithm=NAME, agg=MODE, your parameter's name for "
                                                  "each of logp, old_logp, adv, mask, ref_logp, group_size (e.g. "
                                                  "logp=log_prob), returns=INDEX, adv_shape=token or seq, "
                                                  "timeout_s=SECONDS, hyper-parameters (e.g. eps_high=0.28); "
                                                  "kind=advantage,estimator=NAME, kind=kl,kl=NAME or "
                                                  "kind=rollout_correction,correction=NAME for an advantage "
                                                  "estimator, a KL term or a rollout correction's weights."),
            level: str = typer.Option("loss", help="loss: each loss call; step: one optimisation step "
                                      "(micro-batches, accumulation, ranks) of a trainer, or of a module:function's "
                                      "per-micro-batch loss given num_items_in_batch, gradient_accumulation_steps, "
                                      "num_processes and steps_per_generation, writing OUT/step/TARGET.md and .json."),
            accept: List[str] = typer.Option([], help="Conventions to let pass where the target differs from the "
                                             "reference, KEY=VALUE (agg=token_mean,dual_clip=3) or a file of them, "
                                             "one a line (repeatable)."),
            baseline: Optional[Path] = typer.Option(None, help="A file of known findings (--write-baseline): exit "
                                                    "1 only on a finding not in it, or whose magnitude grew."),
            write_baseline: Optional[Path] = typer.Option(None, help="Record this run's findings in this file (a "
                                                          "baseline to commit) and exit 0, or as --baseline says.")):
    """Hold an outside implementation (verl, TRL, OpenRLHF or your callable) against the reference.

    Per algorithm, mode and knob: agrees, or differs with the largest difference, a minimal input that shows it,
    and the named convention the target matches instead. Exits 1 when a check differs or raises (for `all`: in any
    framework; at --level step: a check that does not agree at every split) with a finding that no --accept item
    lets pass and, with --baseline FILE, that FILE does not record or records smaller; 0 otherwise; 2 on a usage
    error."""
    _user_errors(check_target_name, target, ("all",))
    from harness.conform.engine import conform_command
    from harness.conform.matrix import conform_all
    from spec.records import writable_folder
    if level not in ("loss", "step"):
        _user_errors(_refuse, f"level: expected loss or step, got {level!r}")
    if out:
        _user_errors(writable_folder, out, "out")  # a bad --out fails before the run
    if accept and (target == "all" or level == "step"):
        _user_errors(_refuse, "accept: --accept applies to one target at --level loss")
    if (baseline or write_baseline) and target == "all":
        _user_errors(_refuse, "baseline: --baseline and --write-baseline apply to one target")
    if target == "all":
        if out is None or adapter is not None or json_out:
            _user_errors(_refuse, "target: `all` writes every report (both levels) and the matrix to --out DIR; it "
                                  "takes no --adapter or --json")
        matrix, failing = _user_errors(conform_all, out, seeds)
        console.print(f"matrix: {matrix}; {failing} checks differ or raise")
        raise typer.Exit(1 if failing else 0)
    if level == "step":  # a trainer's own step, or a module:function's loss driven through one
        from harness.conform.step import step_command
        report = _user_errors(step_command, target, json_out, out, 5 if seeds is None else seeds, baseline,
                              write_baseline, adapter)
    else:
        report = _user_errors(conform_command, target, json_out, out, 30 if seeds is None else seeds, adapter, accept,
                              baseline, write_baseline)
    raise typer.Exit(0 if report["ok"] or (write_baseline and not baseline) else 1)


def _refuse(message: str):
    raise ValueError(message)


def _user_errors(fn, *args):
    """Run a command; a ValueError (bad input) or an OSError (a path that cannot be read or written, named) becomes
    a one-line error and exit code 2; warnings print as one line each; both cut to a readable length."""
    plain = warnings.formatwarning
    warnings.formatwarning = lambda message, *_, **__: f"warning: {cut(str(message))}\n"
    try:
        return fn(*args)
    except ValueError as exc:
        typer.echo(f"error: {cut(str(exc))}", err=True)
        raise typer.Exit(2)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"error: {cut(where + str(exc.strerror or exc))}", err=True)
        raise typer.Exit(2)
    finally:
        warnings.formatwarning = plain


@app.command(cls=Command)
def demo(out: Path = typer.Option(Path("reports/demo"), help="Folder for the demo's report."),
         sim_steps: int = typer.Option(150, help="Simulator steps per run."),
         train_steps: int = typer.Option(4, help="Real-model training steps.")):
    """The main job on the embedded defaults: verify the layers, simulate six algorithms on the toy LM, train
    SmolLM2-135M-Instruct with GRPO for a few steps on the CPU, and write a report."""
    from harness.runs.demo import check_demo, run_demo
    _user_errors(check_demo, out, sim_steps, train_steps)  # every argument checked before the first part runs
    rows, derivations = _verify_rows(seeds=1, quiet=False)
    ok = all(r["agrees"] for r in rows) and all(d["holds"] for d in derivations)
    console.print(f"verify: {'all layers agree' if ok else 'DISAGREEMENT'}")
    index = _user_errors(run_demo, out, (rows, derivations), sim_steps, train_steps)
    console.print(f"report written to {index}")
    raise typer.Exit(0 if ok else 1)


recipe_app = typer.Typer(help="Paper-scale recipes for verl and TRL (configs/recipes): list them, launch a run, "
                              "estimate what the runs cost.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")


class RecipeCommand(Command):
    """A command that takes a recipe: its help ends with the recipes and their runs, read when the help is shown
    (not at every cliplab start)."""

    def format_help(self, ctx, formatter):
        from harness.recipes.launch import run_names
        self.epilog = "Recipes and their runs:\n\n" + "\n\n".join(f"{name}: {', '.join(runs)}"
                                                                  for name, runs in run_names().items())
        super().format_help(ctx, formatter)


RECIPE_HELP = "A recipe (listed below with its runs), or its folder."
RUN_HELP = "A run of the recipe (listed below)."
launch_app = typer.Typer(help="Launch one run of a recipe with verl or TRL (--dry-run: print what would run).",
                         no_args_is_help=True)
recipe_app.add_typer(launch_app, name="launch")


@recipe_app.command("list", cls=Command)
def recipe_list():
    """The recipes, their papers and their runs (with each run's algorithm; TRL too: it has a TRL variant)."""
    from harness.recipes.launch import listing
    typer.echo(listing(), nl=False)


@launch_app.command("verl", cls=RecipeCommand)
def recipe_launch_verl(recipe: str = typer.Argument(..., help=RECIPE_HELP),
                       run: str = typer.Argument(..., help=RUN_HELP),
                       overrides: Optional[List[str]] = typer.Argument(None, help="Hydra overrides after the "
                                                                       "recipe's (e.g. "
                                                                       "trainer.total_training_steps=2)."),
                       model: Path = typer.Option(..., help="The model folder."),
                       train: Path = typer.Option(..., help="Training data: a parquet file in verl's RL layout."),
                       val: Path = typer.Option(..., help="Validation data: a parquet file in verl's RL layout."),
                       out: Path = typer.Option(Path("runs/cluster"), help="Logs go to OUT/RECIPE/RUN."),
                       dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and its "
                                                    "environment; run nothing, write nothing.")):
    """Run verl's trainer with the recipe's settings and cliplab's losses, its logs (verl.jsonl, console.log) and
    run.json in OUT/RECIPE/RUN for `cliplab report OUT`."""
    from harness.recipes import launch
    r = _user_errors(launch.find, recipe)
    paths = {"model": model, "train": train, "val": val}
    if dry_run:
        typer.echo(_user_errors(launch.dry_run_verl, r, run, paths, out, overrides or []), nl=False)
    else:
        _user_errors(launch.launch_verl, r, run, paths, out, overrides or [])


@launch_app.command("trl", cls=RecipeCommand)
def recipe_launch_trl(recipe: str = typer.Argument(..., help=RECIPE_HELP),
                      run: str = typer.Argument(..., help=RUN_HELP + " Only some have a TRL variant (`cliplab "
                                                "recipe list`)."),
                      model: Path = typer.Option(..., help="The model folder."),
                      train: Path = typer.Option(..., help="Training data: verl's RL parquet, or a GSM8K / MATH "
                                                 "JSONL file."),
                      out: Path = typer.Option(Path("runs/cluster"), help="Checkpoints and trainer_state.json go "
                                               "to OUT/RECIPE/RUN."),
                      dry_run: bool = typer.Option(False, "--dry-run", help="Print the accelerate command and "
                                                   "every trainer setting; import nothing, write nothing.")):
    """Train the TRL variant of a run in this process; launch it on a node with the accelerate command that
    --dry-run prints (ZeRO-3 over the node's GPUs). Rerunning resumes from the last checkpoint."""
    from harness.recipes import launch
    r = _user_errors(launch.find, recipe)
    paths = {"model": model, "train": train}
    if dry_run:
        typer.echo(_user_errors(launch.dry_run_trl, r, run, paths, out), nl=False)
    else:
        _user_errors(require, "gpu", "cliplab recipe launch trl")
        _user_errors(launch.launch_trl, r, run, paths, out)


@recipe_app.command("cost", cls=RecipeCommand)
def recipe_cost(recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP + " Default: every recipe."),
                gpus: Optional[int] = typer.Option(None, help="GPUs per run (memory per GPU and hours); default: "
                                                   "each recipe's."),
                mfu: float = typer.Option(MFU, help=f"Model FLOPs utilisation of training and prefill ({MFU:g}: "
                                          "the middle of the 38-43% Llama 3 reports)."),
                response_len: Optional[int] = typer.Option(None, help="Mean response length in tokens; default: "
                                                           "each recipe's maximum (a worst case)."),
                gen_factor: Optional[float] = typer.Option(None, help="Responses generated per trained one under "
                                                           "dynamic sampling; default: DAPO's measured "
                                                           "gen_per_trained in the committed simulator sweep "
                                                           "(reports/sim/summaries/feature_lm_main.json)."),
                table_only: bool = typer.Option(False, "--table", help="Print the markdown table only.")):
    """Estimated GPU-hours and memory per GPU of each recipe run on H100 and H200 (the formula:
    configs/recipes/README.md), after a line stating the assumptions."""
    from harness.recipes import launch
    recipes = None if recipe is None else [_user_errors(launch.find, recipe)]
    table = _user_errors(launch.cost_table, recipes, gpus, mfu, response_len, gen_factor)
    if not table_only:
        typer.echo(_user_errors(launch.cost_assumptions, mfu, response_len, gen_factor))
    typer.echo(table, nl=False)


if __name__ == "__main__":
    app()
