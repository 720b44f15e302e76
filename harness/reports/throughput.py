"""Markdown for the JSON of gpu/bench_h200.py: `cliplab report FILE.json` (or a folder holding throughput.json)
writes a table of tokens/s, model TFLOP/s and MFU per algorithm, the generation rate, and a row per tiny-tier run."""
from __future__ import annotations

import json
from pathlib import Path

from spec.records import read_text, write_text

from harness.reports.rundirs import fmt, md, output_file

KIND = "cliplab-throughput"  # the "kind" field gpu/bench_h200.py writes
COLUMNS = (("algo", "algorithm"), ("steps", "timed steps"), ("step_s", "step s"),
           ("train_tokens_per_s", "trained tokens/s"), ("all_tokens_per_s", "all tokens/s"),
           ("model_tflops", "model TFLOP/s"), ("mfu", "MFU"), ("peak_mem_gib", "peak GiB"))


def _load(path: Path):
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    return data if isinstance(data, dict) and data.get("kind") == KIND else None


def find(dirs) -> list[Path]:
    """The throughput JSON files among ``dirs``: each a .json file of that kind or a folder with throughput.json."""
    found = []
    for d in map(Path, dirs):
        p = d / "throughput.json" if d.is_dir() else d
        if p.suffix == ".json" and p.is_file() and _load(p) is not None:
            found.append(p)
    return found


def _cell(key, v):
    if v is None:
        return "n/a"
    if key == "mfu":
        return fmt(v, pct=True)
    return md(v) if isinstance(v, (str, int)) else fmt(v)


TIER_COLUMNS = (("algo", "run"), ("seed", "seed"), ("status", "status"), ("steps", "steps"),
                ("step_time_s_median", "s/step"), ("rollout_s_median", "rollout s"),
                ("gen_tokens_per_s_median", "generated tokens/s"), ("accuracy_first", "accuracy, first tenth"),
                ("accuracy_last", "accuracy, last tenth"))


def _table(columns, rows) -> list[str]:
    return (["| " + " | ".join(h for _, h in columns) + " |", "|---" * len(columns) + "|"]
            + ["| " + " | ".join(_cell(k, r.get(k)) for k, _ in columns) + " |" for r in rows])


def render(data: dict, source: str) -> list[str]:
    """Markdown lines for one result: the throughput part and the tiny tier's sweep, each where it has run."""
    lines = [f"## {md(data.get('model', 'bench_h200'))} on {md(data['device'])} ({md(source)})", ""]
    if "batch" in data:
        b = data["batch"]
        lines += [f"{md(data['precision'])}; gradient checkpointing {data['grad_checkpointing']}; {b['prompts']} "
                  f"prompts x G={b['group']}, prompt {b['prompt_len']} + up to {b['gen_len']} generated tokens; "
                  f"{data['params'] / 1e6:.1f}M parameters; {fmt(data['flops_per_step'] / 1e12)} model TFLOP per "
                  f"step; MFU against {fmt(data['peak_tflops']) if data['peak_tflops'] else 'no'} peak TFLOP/s, "
                  f"of the {md(data['mfu_scope'])}; {fmt(data['total_s'])} s in all.", "", *_table(COLUMNS, data["rows"])]
        if "generation" in data:
            g = data["generation"]
            lines += ["", f"Generation ({md(g['engine'])}): {g['sequences']} sequences, {g['tokens']} new tokens in "
                          f"{fmt(g['s'])} s: {fmt(g['tokens_per_s'])} tokens/s."]
        lines.append("")
    if "tier" in data:
        t, p = data["tier"], data["tier"]["pretrain"]
        m, task = t["recipe"]["model"], t["recipe"]["task"]
        lines += ["### The tiny tier's sweep", "",
                  f"tiny_char at width {m['hidden']}, {m['layers']} layers, on {task['digits']}-digit additions, "
                  f"pretrained on the device in {fmt(p['wall_s'])} s (loss {fmt(p['loss_first'])} -> "
                  f"{fmt(p['loss_last'])}); configs/tiny with {md(', '.join(t['sets']))}; {t['seeds']} seeds at once, "
                  f"{t['steps']} steps each; every run's metrics.jsonl is in its folder.", "", *_table(TIER_COLUMNS,
                                                                                                    t["runs"]), ""]
    return lines


def write_report(paths, out_md=None) -> Path:
    """Write ``out_md`` (default: throughput.md beside the first file) for the throughput JSON ``paths``."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("dirs: no throughput JSON files")
    out_md = output_file(out_md or paths[0].with_name("throughput.md"), inputs=paths)
    lines = ["# cliplab training-step throughput", "",
             "Model FLOPs (6 per weight per token, plus causal attention; recomputation not counted) per second of "
             "the timed steps; MFU = model FLOP/s over the device's peak.", ""]
    for p in paths:
        data = _load(p)
        if data is None:
            raise ValueError(f"{p}: expected a JSON object with kind {KIND!r}")
        try:
            lines += render(data, p.name)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{p}: not a result of gpu/bench_h200.py (at {exc!r})") from None
    write_text(out_md, "\n".join(lines))
    return out_md
