"""``cliplab report``: markdown with curves per algorithm (seed bands) and a table of the papers' claims.

Reads any folder of runs that ``harness.reports.rundirs`` understands (the simulator's sweeps; the real-model harness writes
the same files), so the same report serves both.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from spec.extras import require
from spec.records import naming, read_json, safe_name, write_text

from harness.reports.claims import bandit_entropy_check, claim_bandit, run_claims, seed_sets
from harness.reports.rundirs import (Groups, check_dirs, fmt, fmt_interval, load_runs, md, mean_se, output_file,
                                     shell_line)
from harness.reports.stats import MIN_SEEDS, t_interval

PANELS = ("accuracy_exact", "pass@64", "entropy", "entropy_relevant", "entropy_offtrack", "malformed", "clip_frac",
          "clip_up_frac", "rur", "kl_ref", "resp_len", "gen_per_trained")
MAX_PANELS = 6  # a figure's panels at most, so that each stays readable
TABLE = ("accuracy", "accuracy_exact", "pass@64_final", "entropy_final", "clip_frac", "clip_up_frac", "rur",
         "zero_grad_frac", "gen_per_trained", "kl_ref_final")


# ---- plots ---------------------------------------------------------------------------------------------------
def plot_curves(groups: Groups, labels: list[str], path: Path, panels=PANELS, smooth: int = 10) -> list[Path]:
    """The mean over seeds (moving average of ``smooth`` steps) and a min-max seed band of each metric that has
    data, at most MAX_PANELS panels a figure (``path``, then ``path``_2 ...), 100 dpi; returns the files."""
    panels = [k for k in panels if any(np.isfinite(groups.curve(lbl, k)).any() for lbl in labels)]
    paths = []
    for n, start in enumerate(range(0, len(panels), MAX_PANELS)):
        chunk = panels[start:start + MAX_PANELS]
        out = path if n == 0 else path.with_name(f"{path.stem}_{n + 1}{path.suffix}")
        _figure(groups, labels, chunk, out, smooth)
        paths.append(out)
    return paths


def _figure(groups: Groups, labels: list[str], panels: list[str], path: Path, smooth: int) -> None:
    require("reports", "plotting")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = min(3, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.9), squeeze=False)
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
                ax.plot(x, np.nanmean(c, 0), color=colors(i % 10), lw=1.4, label=label.replace("$", r"\$"))
                ax.fill_between(x, np.nanmin(c, 0), np.nanmax(c, 0), color=colors(i % 10), alpha=0.15, lw=0)
        ax.set_title(key, fontsize=11)
        ax.tick_params(labelsize=9)
        ax.set_xlabel("step", fontsize=9)
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
                   "track EOS is the likeliest token, as in an instruct model, so about 0.01% of responses are "
                   "malformed at step 0. The random features sit on a 2^-12 grid and the products are exact "
                   "fixed-point sums, so every number is the same under any BLAS kernel. "
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
                       "--out", d)
            for c in commands(sweep)]


def claim_lines(runs: list[dict]) -> list[str]:
    """A claims table per environment (runs without one, from the real-model harness, form their own), each claim
    decided on the discovery seeds and re-checked on the replication seeds."""
    lines = ["## Claims", "",
             "Each claim is decided on the discovery seeds and re-checked on the disjoint replication seeds (other "
             "seeds in other environment draws: seeds in blocks of 5 share one draw); a verdict stands only where "
             "both sets give it, else it reads \"not replicated\". Means ± the half-width of their 95% t interval "
             "(n - 1 degrees of freedom); differences by a paired t test where seeds pair (the same seeds and "
             "draws), Welch's test where they do not, at 5% with Holm's correction across all the tests of a "
             "set's claims in this report (family-wise error 5%). A difference the test does not find reads \"not "
             "detectable with N seeds (smallest detectable effect X)\": X is the true difference found with 80% "
             "power, never \"no effect\". A claim that an environment cannot show is \"not testable here\". A "
             "claim measured in several regimes has one row per regime (the settings that are not compared).", ""]
    by_env: dict = {}
    for r in runs:
        by_env.setdefault(r.get("env"), []).append(r)
    for env, env_runs in by_env.items():
        if len(by_env) > 1 or env:
            lines += [f"### {md(env) if env else 'real model runs'}", ""]
        rows, info = run_claims(env_runs)
        (n_d, n_r), (s_d, s_r) = info["tests"], info["seeds"]
        lines += [f"Discovery seeds {s_d} ({n_d} tests, Holm-adjusted together)"
                  + (f"; replication seeds {s_r} ({n_r} tests)." if s_r else "; no replication seeds."), "",
                  "| claim | regime | measured | verdict | why |", "|---|---|---|---|---|"]
        lines += [f"| {text} | {md(regime)} | {md(meas)} | **{md(verdict)}** | {md(why)} |"
                  for text, regime, meas, verdict, why in rows]
        lines.append("")
    return lines


RANK_KEYS = ("accuracy_exact", "pass@8", "pass@64")


def at_budget(groups: Groups, label: str, key: str, budget: float) -> np.ndarray:
    """Per seed, ``key`` at the last evaluated step whose policy had consumed at most ``budget`` generated
    responses (the responses generated before that step)."""
    gen = groups.curve(label, "generated")
    used = np.concatenate([np.zeros((len(gen), 1)), np.nancumsum(gen, axis=1)[:, :-1]], axis=1)
    vals = groups.curve(label, key)
    out = np.full(len(vals), np.nan)
    for i, (u, v) in enumerate(zip(used, vals)):
        ok = np.flatnonzero((u <= budget) & np.isfinite(v))
        if ok.size:
            out[i] = v[ok[-1]]
    return out


def ranking(runs: list[dict]) -> tuple[float, list[dict]]:
    """The algorithms of the plain comparison (labels without grid settings) ranked by exact accuracy at an equal
    generation budget, the fewest responses any of them generated (so DAPO's extra rounds buy it nothing), on the
    discovery seeds, with pass@k, t intervals and the rank on the replication seeds."""
    disc, rep = seed_sets(runs)
    gd, gr = Groups(disc), Groups(rep) if rep else None
    labels = [lbl for lbl in gd.labels() if not gd.runs[lbl][0]["params"]
              and np.isfinite(gd.curve(lbl, "accuracy_exact")).any()
              and np.isfinite(gd.curve(lbl, "generated")).any()]
    if len(labels) < 2:
        return float("nan"), []
    sets = [g for g in (gd, gr) if g is not None]
    budget = min(np.nansum(g.curve(lbl, "generated")[:, :-1], axis=1).min() for g in sets for lbl in labels
                 if lbl in g.runs)
    rows = []
    for lbl in labels:
        row = {"label": lbl, "reward": (gd.runs[lbl][0].get("settings") or {}).get("reward")}
        for name, g in (("discovery", gd), ("replication", gr)):
            for key in RANK_KEYS:
                row[(name, key)] = t_interval(at_budget(g, lbl, key, budget)) if g is not None and lbl in g.runs \
                    else None
        rows.append(row)
    fewest = min(iv.n for row in rows for k, iv in row.items() if isinstance(k, tuple) and iv is not None)
    if fewest < MIN_SEEDS:
        warnings.warn(f"ranking: {fewest} seed(s) in a set, fewer than {MIN_SEEDS}; its intervals read n/a (too few "
                      "seeds)", stacklevel=2)
    rows.sort(key=lambda r: -r[("discovery", "accuracy_exact")].mean)
    order = sorted(rows, key=lambda r: -(r[("replication", "accuracy_exact")].mean
                                         if r[("replication", "accuracy_exact")] else np.nan))
    for i, row in enumerate(rows):
        row["rank"] = i + 1
        row["rank_replication"] = order.index(row) + 1 if row[("replication", "accuracy_exact")] else None
    return budget, rows


def ranking_lines(runs: list[dict]) -> list[str]:
    """The ranking as a markdown table per environment."""
    from sim.config import REWARD_SCHEMES
    lines = []
    by_env: dict = {}
    for r in runs:
        by_env.setdefault(r.get("env"), []).append(r)
    for env, env_runs in by_env.items():
        budget, rows = ranking(env_runs)
        if not rows:
            continue
        lines += [f"### {env}: ranking at equal generation budget", "",
                  f"Exact accuracy and pass@k of each algorithm's policy once it had generated {budget:.0f} "
                  "responses (the fewest any algorithm generated in its run: equal generation, not equal steps), "
                  "mean ± 95% t half-width over seeds. Ranked on the discovery seeds; the replication seeds' rank "
                  "beside. Rewards differ by paper (named beside each algorithm); accuracy is the one scale.", "",
                  "| rank | algorithm (its reward: correct/wrong/malformed) | accuracy | pass@8 | pass@64 | "
                  "replication accuracy | replication pass@64 | replication rank |", "|---|---|---|---|---|---|---|---|"]
        for row in rows:
            scheme = "/".join(f"{v:g}" for v in REWARD_SCHEMES.get(row["reward"], ())) or "coin flips"
            cells = [str(row["rank"]), f"{row['label']} ({row['reward']}: {scheme})"]
            for name, key in (("discovery", "accuracy_exact"), ("discovery", "pass@8"), ("discovery", "pass@64"),
                              ("replication", "accuracy_exact"), ("replication", "pass@64")):
                iv = row[(name, key)]
                cells.append(fmt_interval(iv) if iv is not None else "-")
            same = row["rank_replication"] == row["rank"]
            cells.append("-" if row["rank_replication"] is None else
                         f"{row['rank_replication']} ({'same' if same else 'differs'})")
            lines.append("| " + " | ".join(md(c) for c in cells) + " |")
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
        env = groups.runs[labels[0]][0].get("env")
        title = md(f"{env}: {d.name}" if env else d.name)
        lines += [f"### {title}", ""] + [f"![{title}]({p.name})" for p in plot_curves(groups, labels, png)] + [""]
    lines += ["## Ranking", ""] + (ranking_lines(runs) or ["No plain comparison of several algorithms here.", ""])
    write_text(out_md, "\n".join(lines) + "\n")
    return out_md
