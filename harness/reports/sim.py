"""``cliplab report``: markdown with curves per algorithm (seed bands) and a table of the papers' claims.

Reads any folder of runs that ``harness.reports.rundirs`` understands (the simulator's sweeps; the real-model harness writes
the same files), so the same report serves both.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from spec.records import read_json, safe_name, write_text  # noqa: E402

from harness.reports.claims import CLAIMS, bandit_entropy_check, claim_bandit  # noqa: E402
from harness.reports.rundirs import (Groups, check_dirs, fmt, load_runs, md, mean_se, output_file,  # noqa: E402
                                     shell_line)

PANELS = ("accuracy_exact", "pass@64", "entropy", "entropy_decision", "entropy_correct", "clip_frac", "clip_up_frac",
          "rur", "kl_ref", "resp_len", "len_wrong_exact", "gen_per_trained")
TABLE = ("accuracy", "accuracy_exact", "pass@64_final", "entropy_final", "clip_frac", "clip_up_frac", "rur",
         "zero_grad_frac", "gen_per_trained", "kl_ref_final")


# ---- plots ---------------------------------------------------------------------------------------------------
def plot_curves(groups: Groups, labels: list[str], path: Path, panels=PANELS, smooth: int = 10) -> None:
    """One panel per metric: the mean over seeds (moving average of ``smooth`` steps) and a min-max seed band."""
    cols = 4
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, key in zip(axes.flat, panels):
        for i, label in enumerate(labels):
            c = groups.curve(label, key)
            if not np.isfinite(c).any():
                continue
            c = _moving(c, smooth)
            x = np.arange(c.shape[1])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ax.plot(x, np.nanmean(c, 0), color=colors(i % 10), lw=1.2, label=label.replace("$", r"\$"))
                ax.fill_between(x, np.nanmin(c, 0), np.nanmax(c, 0), color=colors(i % 10), alpha=0.15, lw=0)
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        if key == "clip_frac":
            ax.set_yscale("symlog", linthresh=1e-4)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
            break
    fig.supxlabel("step", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=55, pil_kwargs={"optimize": True})
    plt.close(fig)


def _moving(c: np.ndarray, k: int) -> np.ndarray:
    """Trailing mean over the last ``k`` steps of each row, NaNs ignored (a window without a value stays NaN)."""
    if k <= 1 or c.shape[1] < k:
        return c
    padded = np.concatenate([np.full((c.shape[0], k - 1), np.nan), c], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.lib.stride_tricks.sliding_window_view(padded, k, axis=1), axis=2)


# ---- the report ----------------------------------------------------------------------------------------------
ENV_TEXT = {
    "toy_lm": ("Toy LM: a tabular softmax policy per (prompt, automaton state) over, by default, 8 tokens (EOS, "
               "the answer marker ANS, 2 filler tokens, 4 answer tokens). A response thinks (filler; the state "
               "counts positions), emits ANS, one answer and EOS; anything else, or running past max_len, is "
               "malformed. The correct answer's initial logit spreads prompts from hopeless (success about 0.001) "
               "to easy (about 0.9), so correct answers of hard prompts start as low-probability tokens. Entropy, "
               "KL and accuracy_exact are exact expectations (a dynamic programme over the automaton), not "
               "samples."),
    "bandit": ("Bandit: one state per prompt, 8 arms, one correct arm whose initial logit sets the prompt's "
               "difficulty; responses are one token long."),
    "feature_lm": ("Feature LM: a log-linear policy logits(c) = b(c) + phi(c) theta over 128 tokens; theta is "
                   "shared by every prompt and position (features: bias, position, on/off-track flag, 32 random "
                   "directions), b is a frozen Zipfian prior with a confident dominant token per context, drawn "
                   "from the Zipf head. An answer is 4 tokens then EOS; each position accepts 2 tokens. At an "
                   "ordinary position the dominant token and one improbable synonym are acceptable, the Zipf tail "
                   "is not. At 2 forking positions per prompt the dominant token is wrong and the acceptable "
                   "tokens come from a pool of 8 improbable tokens shared by all prompts (Zipf ranks 8-15); the "
                   "first sits delta nats from the dominant one (delta from -8, hopeless, to +4, easy). A wrong "
                   "token sends the response into off-track contexts until EOS or max_len 8 (truncated). "
                   "Entropy, KL, accuracy_exact, pass@k, the entropy split and its contributions by kind of "
                   "context (ordinary, fork, end, off-track) are exact (a recursion over positions) on evaluated "
                   "steps."),
}
#: One line per environment: what it can and cannot show.
ENV_SCOPE = {
    "toy_lm": ("Can show: clipping statistics, length bias, dynamic-sampling cost, reward-scheme effects, exact "
               "pass@k. Cannot show: entropy collapse or its spread across prompts - each (prompt, state) has its "
               "own logits, and most of its entropy is the reward-irrelevant filler choice."),
    "feature_lm": ("Can show: entropy collapse through parameters shared by prompts and positions (the "
                   "half-entropy step, pass@64 rising then falling as the improbable tokens hard prompts need are "
                   "suppressed), the upper clip's effect on entropy once ratios move (rollouts 2 steps old, 8 "
                   "minibatches) with exact attribution by kind of context, the same under random rewards, SAPO's "
                   "temperatures under staler rollouts, exact pass@k. Cannot show: language, long reasoning or "
                   "scale (random features, 4-token answers); most of its entropy sits in the off-track contexts "
                   "of wrong answers, so a gap there is not DAPO's exploration at forks; effects smaller than the "
                   "seed-to-seed spread of 5 seeds read as no effect."),
    "bandit": "Can show: the one-step entropy law exactly. Cannot show: anything sequential.",
}
SETUP_KEYS = ("n_prompts", "batch_prompts", "group_size", "max_len", "optimizer", "lr", "epochs", "minibatches",
              "staleness", "eval_every")


def setup_lines(groups: Groups) -> list[str]:
    """What the simulator runs were: the environment, the shared settings and each label's reward and advantage."""
    sims = {lbl: runs[0] for lbl, runs in groups.runs.items() if runs[0].get("settings")}
    if not sims:
        return []
    lines = ["## Setup", ""]
    for env in sorted({r["env"] for r in sims.values()}, key=str):
        first = next(r for r in sims.values() if r["env"] == env)["settings"]
        lines += [ENV_TEXT.get(env, md(env)), "", ENV_SCOPE.get(env, ""), "",
                  f"{md(env)} settings unless a label says otherwise: " + ", ".join(md(f"{k}={first[k]}")
                                                                                for k in SETUP_KEYS if k in first)
                  + ".", ""]
    lines += [
              "| algorithm | reward (correct/wrong/malformed) | advantage | dynamic sampling | overlong shaping |",
              "|---|---|---|---|---|"]
    from sim.config import REWARD_SCHEMES
    seen = set()
    for lbl in groups.labels():
        if lbl in sims and sims[lbl]["algo"] not in seen:
            seen.add(sims[lbl]["algo"])
            st = sims[lbl]["settings"]
            reward = st.get("reward")
            scheme = "/".join(f"{v:g}" for v in REWARD_SCHEMES.get(reward if isinstance(reward, str) else None, ())) \
                or "independent of the answer"
            cells = (sims[lbl]["algo"], f"{st.get('reward')} ({scheme})", st.get("adv", "-") or "-",
                     st.get("dynamic_sampling"), st.get("overlong"))
            lines.append("| " + " | ".join(md(c) for c in cells) + " |")
    return lines + [""]


def commands_of(d: Path) -> list[str]:
    """The ``cliplab sim`` commands that wrote into the sweep folder ``d`` (its sweep.json's history), oldest first,
    one line each."""
    from sim.sweep import commands
    sweep = d / "sweep.json"
    if not sweep.exists():
        return []
    s = read_json(sweep)
    return [shell_line("cliplab", "sim", "--env", s.get("env"), "--algos", ",".join(c["algos"]), "--seeds",
                       c.get("seeds"), "--steps", s.get("steps"),
                       *(w for k, vals in c["grid"].items() for w in ("--set", f"{k}={','.join(map(str, vals))}")),
                       "--out", d)
            for c in commands(sweep)]


def claim_lines(runs: list[dict]) -> list[str]:
    """A claims table per environment (runs without one, from the real-model harness, form their own)."""
    lines = ["## Claims", "",
             "Mean ± standard error over seeds; a difference is significant when it exceeds the two-sided 5% "
             "Student-t critical value times its standard error. A claim measured in several regimes has one row "
             "per regime (the settings that are not compared).", ""]
    by_env: dict = {}
    for r in runs:
        by_env.setdefault(r.get("env"), []).append(r)
    for env, env_runs in by_env.items():
        if len(by_env) > 1 or env:
            lines += [f"### {md(env) if env else 'real model runs'}", ""]
        lines += ["| claim | regime | measured | verdict | why |", "|---|---|---|---|---|"]
        groups = Groups(env_runs)
        for text, fn in CLAIMS:
            out = fn(groups)
            for regime, meas, verdict, why in (out if isinstance(out, list) else [("", *out)]):
                lines.append(f"| {text} | {md(regime)} | {md(meas)} | **{verdict}** | {why} |")
        lines.append("")
    return lines


def write_report(dirs, out_md=None, bandit: bool = True) -> Path:
    """Write ``out_md`` (default: the first dir's report.md) and PNG plots beside it; returns the markdown path."""
    dirs = check_dirs([dirs] if isinstance(dirs, (str, Path)) else dirs)
    if not dirs:
        raise ValueError("dirs: expected at least one runs folder")
    runs = load_runs(dirs)
    if not runs:
        raise ValueError(f"dirs: no complete runs (config.json + metrics.jsonl) under {', '.join(map(str, dirs))}")
    out_md = output_file(out_md if out_md is not None else dirs[0] / "report.md", inputs=dirs)
    if len({r["env"] for r in runs}) > 1:  # the same label in two environments: name the environment
        for r in runs:
            r["label"] = f"{r['env']}: {r['label']}"
    groups = Groups(runs)
    lines = ["# cliplab simulator report", ""]
    cmds = [c for d in dirs for c in commands_of(d)]
    if cmds:
        lines += ["Produced by:", "", "```", *cmds, shell_line("cliplab", "report", *dirs, "--out", out_md), "```", ""]
    lines += setup_lines(groups)
    lines += claim_lines(runs)
    if bandit:
        rows = bandit_entropy_check()
        meas, verdict, why = claim_bandit(rows)
        lines += ["### bandit", "", "| claim | regime | measured | verdict | why |", "|---|---|---|---|---|",
                  f"| Bandit: entropy change under natural PG is -eta Cov(log pi, A) (Cui et al. 2505.22617) | "
                  f"exact, default bandit | {meas} | **{verdict}** | {why} |"]
        lines += ["", "Bandit check (default bandit, exact, summed over its 128 prompts):", "",
                  "| eta | exact dH | -eta Cov(log pi, A) | per-prompt correlation |", "|---|---|---|---|"]
        lines += [f"| {e} | {a:.5g} | {p:.5g} | {c:.5f} |" for e, a, p, c in rows]
    lines += ["", "## Summary per label (mean over seeds)", "",
              "Reward and accuracy: last 10% of steps; entropy and KL: last step; the rest: mean over all steps.", "",
              "| label | seeds | " + " | ".join(TABLE) + " |", "|---" * (len(TABLE) + 2) + "|"]
    for label in groups.labels():
        cells = []
        for key in TABLE:
            base, part = (key[:-6], "final") if key.endswith("_final") else (key, "all")
            part = "last" if key in ("accuracy", "accuracy_exact") else part
            cells.append(fmt(mean_se(groups.per_seed(label, base, part))[0]))
        lines.append(f"| {md(label)} | {len(groups.runs[label])} | " + " | ".join(cells) + " |")
    lines += ["", "## Curves", "", "Mean over seeds (10-step moving average) with the min-max band over seeds.", ""]
    for i, d in enumerate(dirs):
        labels = [lbl for lbl in groups.labels() if groups.runs[lbl][0]["dir"] == str(d)]
        if not labels:
            continue
        png = out_md.with_name(safe_name(f"{out_md.stem}_{i}_{d.name}") + ".png")
        plot_curves(groups, labels, png)
        env = groups.runs[labels[0]][0].get("env")
        title = md(f"{env}: {d.name}" if env else d.name)
        lines += [f"### {title}", "", f"![{title}]({png.name})", ""]
    write_text(out_md, "\n".join(lines) + "\n")
    return out_md
