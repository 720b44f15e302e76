"""``cliplab report``: markdown with curves per algorithm (seed bands) and the papers' claims, one line each, their
records (``claims.json``) and details (``claims.md``) beside it.

Reads any folder of runs that ``harness.reports.rundirs`` understands (the simulator's sweeps; the real-model harness writes
the same files), so the same report serves both.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from spec.extras import require
from spec.records import naming, read_json, safe_name, write_text

from harness.reports.claim_record import RunSet
from harness.reports.claim_render import DETAILS_NAME, JSON_NAME, alt, console_lines, summary_lines, write_claims
from harness.reports.claims import bandit_records, run_claims
from harness.reports.ranking import difference, pair_cell, rankings
from harness.reports.rundirs import (Groups, check_dirs, fmt, fmt_interval, load_runs, md, mean_se, output_file,
                                     shell_line)

PANELS = ("accuracy_exact", "pass@64", "entropy", "entropy_relevant", "entropy_offtrack", "malformed", "clip_frac",
          "clip_up_frac", "rur", "kl_ref", "resp_len", "gen_per_trained")
MAX_PANELS = 6  # a figure's panels at most, so that each stays readable
TABLE = ("accuracy", "accuracy_exact", "pass@64_final", "entropy_final", "clip_frac", "clip_up_frac", "rur",
         "zero_grad_frac", "gen_per_trained", "kl_ref_final")


# ---- plots ---------------------------------------------------------------------------------------------------
#: A panel's title and its y-axis label with the unit (the metric definitions: sim/metrics.py DEFINITIONS, and
#: gpu/step_metrics.py's for real-model runs); a metric not listed is titled by its name.
LABELS = {
    "accuracy_exact": ("exact accuracy", "P(correct response)"),
    "accuracy": ("accuracy of the generated responses", "share correct"),
    **{f"pass@{k}": (f"pass@{k} (exact)", f"P(one of {k} correct)") for k in (1, 8, 64)},
    "reward": ("training reward", "reward (its scheme)"),
    "entropy": ("entropy", "nats per token"),
    "entropy_relevant": ("entropy of the answer positions", "nats per token"),
    "entropy_offtrack": ("entropy off track", "nats per token"),
    "malformed": ("malformed responses", "share of responses"),
    "clip_frac": ("clipped tokens (TCR)", "share of tokens"),
    "clip_up_frac": ("tokens clipped at the upper bound", "share of tokens"),
    "rur": ("response utilisation (RUR)", "share of trained responses"),
    "zero_grad_frac": ("groups with equal rewards", "share of groups"),
    "kl_ref": ("KL to the reference", "nats per token"),
    "resp_len": ("response length", "tokens"),
    "len_wrong": ("length of incorrect responses", "tokens"),
    "gen_per_trained": ("generated per trained response", "responses"),
    "ratio_dev_median": ("median |ratio - 1| of trained tokens", "|pi / pi_old - 1|"),
    "cov_logp_adv": ("Cov(log pi, A)", "nats x advantage"),
    "gap_mean_abs": ("rollout/trainer log-prob gap", "mean |log-prob gap|, nats"),
}
#: The x axes: steps, or responses generated before the step (mean over seeds), for comparisons at equal budget.
X_AXES = {"step": "step", "generated": "responses generated (seed mean)"}


def panel_title(key: str) -> str:
    return LABELS.get(key, (key, ""))[0]


def panel_chunks(groups: Groups, labels: list[str], panels=PANELS) -> list[list[str]]:
    """The metrics of ``panels`` that have data, MAX_PANELS a figure."""
    panels = [k for k in panels if any(np.isfinite(groups.curve(lbl, k)).any() for lbl in labels)]
    return [panels[start:start + MAX_PANELS] for start in range(0, len(panels), MAX_PANELS)]


def plot_curves(groups: Groups, labels: list[str], path: Path, panels=PANELS, smooth: int = 10, x: str = "step",
                budget: float | None = None) -> list[Path]:
    """The mean over seeds (moving average of ``smooth`` steps) and a min-max seed band of each metric that has
    data, titled and its y axis labelled with its unit (``LABELS``), against steps or (``x="generated"``)
    responses generated, with ``budget`` marked; at most MAX_PANELS panels a figure (``path``, then ``path``_2
    ...), 100 dpi; returns the files."""
    paths = []
    for n, chunk in enumerate(panel_chunks(groups, labels, panels)):
        out = path if n == 0 else path.with_name(f"{path.stem}_{n + 1}{path.suffix}")
        _figure(groups, labels, chunk, out, smooth, x, budget)
        paths.append(out)
    return paths


def plot_lines(groups: Groups, labels: list[str], path: Path, title: str, panels=PANELS, smooth: int = 10,
               x: str = "step", budget: float | None = None) -> list[str]:
    """``plot_curves``' figures as markdown images, each with its own alt text: the title and its panels."""
    chunks = panel_chunks(groups, labels, panels)
    paths = plot_curves(groups, labels, path, panels, smooth, x, budget)
    return [f"![{alt(title)}: {alt(', '.join(panel_title(k) for k in chunk))} by {X_AXES[x]}]({p.name})"
            for p, chunk in zip(paths, chunks)]


def _x(groups: Groups, label: str, x: str, steps: int) -> np.ndarray:
    if x == "step":
        return np.arange(steps, dtype=float)
    gen = groups.curve(label, "generated")
    used = np.concatenate([np.zeros((len(gen), 1)), np.nancumsum(gen, axis=1)[:, :-1]], axis=1)
    return used.mean(0)


def _figure(groups: Groups, labels: list[str], panels: list[str], path: Path, smooth: int, x: str = "step",
            budget: float | None = None) -> None:
    require("reports", "plotting")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = min(3, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(max(4.6 * cols, 10.0), 3.4 * rows + 0.9), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, key in zip(axes.flat, panels):
        for i, label in enumerate(labels):
            c = groups.curve(label, key)
            if not np.isfinite(c).any():
                continue
            evaluated = np.isfinite(c).any(0)
            if evaluated.mean() > 0.5:  # logged every step: smoothed; evaluated every few steps: as evaluated
                c = _moving(c, smooth)
            xs = _x(groups, label, x, c.shape[1])
            keep = np.isfinite(c).any(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ax.plot(xs[keep], np.nanmean(c, 0)[keep], color=colors(i % 10), lw=1.4,
                        label=label.replace("$", r"\$"))
                ax.fill_between(xs[keep], np.nanmin(c, 0)[keep], np.nanmax(c, 0)[keep], color=colors(i % 10),
                                alpha=0.15, lw=0)
        if budget is not None:
            ax.axvline(budget, color="0.4", ls="--", lw=0.9, label="the ranking's budget")
        ax.set_title(panel_title(key), fontsize=11)
        ax.tick_params(labelsize=9)
        ax.set_xlabel(X_AXES[x], fontsize=9)
        ax.set_ylabel(LABELS.get(key, (key, key))[1], fontsize=9)
        if key == "clip_frac":
            ax.set_yscale("symlog", linthresh=1e-4)
    for ax in list(axes.flat)[len(panels):]:
        fig.delaxes(ax)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 4), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * ((len(names) - 1) // 4), 1, 1))
    with naming(path):  # a full disk names the plot's file
        fig.savefig(path, dpi=100, pil_kwargs={"optimize": True})
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
                   "token sends the response into off-track contexts until EOS or max_len 8 (truncated); off "
                   "track EOS is the likeliest token, as in an instruct model, so about 5e-10 of responses are "
                   "malformed at step 0, and the EOS decision has its own parameters (one per on/off-track "
                   "position) that the task features do not drive, so the format holds under RL. The random "
                   "features sit on a 2^-12 grid and the products are exact fixed-point sums, so every number is "
                   "the same under any BLAS kernel. "
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
                   "scale (random features, 4-token answers); a gap in the off-track contexts of wrong answers is "
                   "not DAPO's exploration at forks, so entropy claims show the reward-relevant contexts (ordinary "
                   "and fork) beside the total."),
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
                       "--out", repo_path(d))
            for c in commands(sweep)]


def claim_sets(runs: list[dict]) -> list[RunSet]:
    """The claims' records per environment (runs without one, from the real-model harness, form their own), each
    claim decided on the discovery seeds and re-checked on the replication seeds."""
    by_env: dict = {}
    for r in runs:
        by_env.setdefault(r.get("env"), []).append(r)
    return [run_claims(env_runs, env or "") for env, env_runs in by_env.items()]


def claims_text(runs: list[dict]) -> str:
    """The claims decided on ``runs`` (``load_runs``) as plain text for a terminal (``cliplab sim``): per run set, a
    line per measured claim and regime, and how many are not measured or not testable here."""
    out = []
    for rs in claim_sets(runs):
        lines = console_lines(rs)
        if lines:
            out += [f"claims{f' ({rs.name})' if rs.name else ''}, decided on the discovery seeds and re-checked on "
                    f"the replication seeds (`cliplab report` writes the details):", *(f"  {x}" for x in lines)]
    return "\n".join(out)


def claim_lines(run_sets: list[RunSet]) -> list[str]:
    """The claims section: per run set, one line per claim and regime (linked to its details in claims.md), then the
    claims not measured or not testable here."""
    lines = ["## Claims", "",
             "Each claim is decided on the discovery seeds and re-checked on the disjoint replication seeds (other "
             "seeds in other environment draws: seeds in blocks of 5 share one draw); a verdict stands only where "
             "both sets give it, else it reads \"not replicated\". Effects: the discovery seeds' estimate ± the "
             "half-width of its 95% t interval (n - 1 degrees of freedom); differences by a paired t test where seeds "
             "pair (the same seeds and draws), Welch's test where they do not, at 5% with Holm's correction across all "
             "the tests of a set's claims in this report (family-wise error 5%). A difference the test does not find "
             "reads \"not detectable with N seeds (smallest detectable effect X)\": X is the true difference found "
             "with 80% power, never \"no effect\". A claim that an environment cannot show is \"not testable here\". "
             "A claim measured in several regimes has one line per regime (the settings that are not compared). Each "
             f"claim links to its details in {DETAILS_NAME} (both seed sets, the controls, the regime card's "
             f"conditions, the attribution); {JSON_NAME} holds the records.", ""]
    for rs in run_sets:
        if len(run_sets) > 1 or rs.name:
            lines += [f"### {md(rs.name) if rs.name else 'real model runs'}", ""]
        (n_d, n_r), (s_d, s_r) = rs.tests, rs.seeds
        if s_d:
            lines += [f"Discovery seeds {s_d} ({n_d} tests, Holm-adjusted together)"
                      + (f"; replication seeds {s_r} ({n_r} tests)." if s_r else "; no replication seeds."), ""]
        lines += summary_lines(rs)
    return lines


def repo_path(path) -> str:
    """``path`` relative to the working folder (the repository, where a report is regenerated) when it lies
    inside it, else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def ranking_lines(found: list) -> list[str]:
    """The rankings ``found`` (``harness.reports.ranking.rankings``) as markdown: per environment and sweep folder,
    at an equal generation budget and at equal optimiser updates, the answer first, then the labels, the pairs,
    where accuracy and pass@k disagree, and each label's gap to the leader."""
    def title(rk) -> str:
        return f"{md(rk.env) + ': ' if rk.env else ''}ranking at equal {rk.axis} ({md(Path(rk.folder).name)})"
    lines = [f"- {title(rk)}: **{md(rk.verdict)}**" for rk in found] + [""] if len(found) > 2 else []
    for rk in found:
        lines += [f"### {title(rk)}", "", f"**{md(rk.verdict)}** {md(rk.replication)}", ""]
        if rk.warning:
            lines += [f"Warning: {md(rk.warning[len('ranking: '):])}.", ""]
        lines += [md(" ".join(ranking_text(rk))), ""]
        metric, pk = METRIC_NAMES.get(rk.metric, rk.metric), rk.pass_k
        head = ["rank", "tie group", "label", "reward (correct/wrong/malformed)", metric, pk, f"replication {metric}",
                pk and f"replication {pk}", "replication rank"]
        head = [c for c in head if c]
        lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for s in rk.standings:
            cells = [s.rank, s.group, s.label, s.reward, fmt_interval(s.metric), s.pass_k and fmt_interval(s.pass_k),
                     fmt_interval(s.replication_metric) if s.replication_metric else "-",
                     pk and (fmt_interval(s.replication_pass_k) if s.replication_pass_k else "-"),
                     s.replication_rank or "-"]
            lines.append("| " + " | ".join(md(c) for c in cells if c is not None) + " |")
        lines += ["", f"| ahead | behind | {metric} difference | " + (f"{pk} difference | " if pk else "")
                  + "replication |", "|---" * (5 if pk else 4) + "|"]
        for p in rk.pairs:
            cells = [p.ahead, p.behind, pair_cell(p.metric, p.separable), p.pass_k and difference(p.pass_k),
                     replication_cell(p)]
            lines.append("| " + " | ".join(md(c) for c in cells if c is not None) + " |")
        lines += [""] + [f"- {md(s.label)}: {md(s.gap)}" for s in rk.standings[1:]] + [""]
    return lines


#: How a ranking names its primary metric.
METRIC_NAMES = {"accuracy_exact": "exact accuracy", "accuracy": "accuracy"}


def ranking_text(rk) -> list[str]:
    """What a ranking reads, how it tests, where its metrics disagree and how it squares with the summary table's
    equal steps: sentences for the markdown and the console."""
    metric = METRIC_NAMES.get(rk.metric, rk.metric)
    out = [f"Each label's {metric}" + (f" ({rk.pass_k} beside)" if rk.pass_k else "")
           + f" at {rk.budget:,.0f} {rk.unit} (the fewest any label reached; linear between the two evaluations "
           f"around it), mean ± 95% t half-width over the discovery seeds {rk.seeds}"
           + (f", the replication seeds {rk.replication_seeds} beside." if rk.replication_seeds else ".")]
    out.append(f"Pairs: {rk.test} tests" + (" (the same seeds and environment draws)" if rk.test == "paired t" else
                                            " (the labels' seeds or environment draws differ)")
               + (f", Holm-adjusted over the {len(rk.pairs)} pairs (each metric its own family)" if len(rk.pairs) > 1
                  else "") + "; labels sharing a "
               "tie-group letter are not separable at 5%.")
    for p in rk.pairs:
        if p.disagree in ("both", "pass@k"):
            out.append(f"Metrics disagree: {rk.pass_k} puts {p.behind} ahead of {p.ahead} ({difference(p.pass_k)}"
                       + (f", while {metric} separates them the other way)." if p.disagree == "both" else
                          f"; {metric} does not separate them)."))
    if rk.unit == "responses generated":
        fewest = min(rk.spent.values())
        more = [f"{lbl} {v / fewest:.3g}x" for lbl, v in rk.spent.items() if v > 1.1 * fewest]
        if more:
            out.append("At equal steps (the summary table, the runs' ends) the labels generated unequal numbers of "
                       f"responses ({', '.join(more)} the fewest); here each is read within the same number (the "
                       "ranking at equal optimiser updates compares them per update instead).")
    if rk.left_out:
        out.append(f"Not ranked: {', '.join(rk.left_out)}.")
    return out


def replication_cell(p) -> str:
    if p.replication is None:
        return "-"
    state = {True: "holds", False: "does not hold", None: ""}[p.replicated]
    return difference(p.replication) + (f", {state}" if state else "")


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
    report_cmd = shell_line("cliplab", "report", *map(repo_path, dirs), "--out", repo_path(out_md))
    if cmds:
        lines += ["Produced by:", "", "```", *cmds, report_cmd, "```", ""]
    found = rankings(runs)
    lines += ["## Ranking", ""] + (ranking_lines(found) or ["No comparison of several labels here.", ""])
    lines += setup_lines(groups)
    bandit_recs, bandit_rows = bandit_records() if bandit else ([], [])
    run_sets = claim_sets(runs) + ([RunSet("bandit", tuple(bandit_recs))] if bandit else [])
    lines += claim_lines(run_sets)
    if bandit:
        lines += ["Bandit check (default bandit, exact, summed over its 128 prompts):", "",
                  "| eta | exact dH | -eta Cov(log pi, A) | per-prompt correlation |", "|---|---|---|---|"]
        lines += [f"| {e} | {a:.5g} | {p:.5g} | {c:.5f} |" for e, a, p, c in bandit_rows]
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
        env = groups.runs[labels[0]][0].get("env")
        title = f"{env}: {d.name}" if env else d.name
        lines += [f"### {md(title)}", ""] + plot_lines(groups, labels, png, title)
        for rk in (rk for rk in found if rk.folder == str(d) and rk.unit == "responses generated"):
            lines += plot_lines(groups, labels, png.with_name(f"{png.stem}_budget.png"), title,
                                [k for k in (rk.metric, rk.pass_k) if k], x="generated", budget=rk.budget)
        lines += [""]
    write_claims(out_md.parent, run_sets, "cliplab simulator report", f"`{report_cmd}`")
    write_text(out_md, "\n".join(lines) + "\n")
    return out_md
