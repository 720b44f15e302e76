"""Baselines and --accept by name: a conformance gate that a framework's CI can keep green on today's findings and
that fails only on what is new. Driven on verl's own GSPO loss (in cliplab's venv, in-process): its token-mean
aggregation is today's finding; a change that raises past a log-ratio of 20 is a new one."""
import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.conform import baseline as bl
from harness.conform.cases import StepCheck
from harness.conform.engine import (NUMERIC, _accepting, _accepting_part, conform, console_lines, parse_accept,
                                    settle)
from harness.conform.targets import load_target, reference as ref

SEEDS = 2


class Narrow:
    """verl with its default GSPO check alone (cheap), optionally with its loss changed by ``change`` and its
    generated batches by ``cases``."""

    def __init__(self, change=None, cases=None):
        self.verl = load_target("verl")
        self.name, self.versions, self.how = self.verl.name, self.verl.versions, self.verl.how
        self.change, self.cases = change, cases

    def checks(self):
        (check,) = [c for c in self.verl.checks() if c.algorithm == "gspo" and "default" in c.knob]
        if self.change:
            check = replace(check, run=self.change(check.run))
        return [replace(check, cases=self.cases(check.cases))] if self.cases else [check]


def raises_past_20(run):
    """The loss as verl computes it, raising where a log-ratio exceeds 20 (a regression a commit might bring)."""
    def changed(b):
        if (np.abs(b.logp - b.old_logp) * b.mask).max() > 20:
            raise FloatingPointError("log-ratio past 20")
        return run(b)
    return changed


def nan_when_empty(run):
    def changed(b):
        value, grad, used = run(b)
        return (float("nan") if b.mask.sum() == 0 else value), grad, used
    return changed


@pytest.fixture(scope="module")
def today(tmp_path_factory):
    """verl's GSPO report today, and the baseline written from it."""
    path = tmp_path_factory.mktemp("baseline") / "verl.json"
    target = Narrow()
    report = settle(target, conform(target, seeds=SEEDS))
    assert not report["ok"] and bl.write_baseline(report, path) == 3  # token mean, in each of three families
    return report, path


def test_a_baseline_lets_todays_findings_pass_and_names_only_a_new_one(today):
    report, path = today
    text = path.read_text()
    written = json.loads(text)
    assert written["cliplab_baseline"] == bl.VERSION and written["target"] == "verl" and written["seeds"] == SEEDS
    assert [f["family"] for f in written["findings"]] == sorted(f["family"] for f in written["findings"])
    assert text.count("\n  {") == 3  # one finding a line: a diff shows which changed
    target = Narrow()
    again = settle(target, conform(target, seeds=SEEDS), base=bl.read_baseline(path, "loss", SEEDS))
    assert again["ok"] and {r["outcome"] for r in again["rows"]} == {"baselined"}
    assert again["baseline"] == {"file": str(path), "known": 3, "new": 0, "grew": 0, "gone": []}

    target = Narrow(change=raises_past_20)
    changed = settle(target, conform(target, seeds=SEEDS), base=bl.read_baseline(path, "loss", SEEDS))
    assert not changed["ok"]
    failing = [r for r in changed["rows"] if r["outcome"] == "raises"]
    assert [r["family"] for r in failing] == ["extreme"]
    out = "\n".join(console_lines(changed))
    assert "raises FloatingPointError: log-ratio past 20" in out and "[new: not in the baseline]" in out
    assert "RAISES   gspo" in out and "matches gspo[agg=token_mean]" not in out.split("RAISES")[1].split("\n")[0]
    # both extreme batches now raise: the token mean recorded there is no longer seen, and said so
    assert "1 new, 0 grown, 2 known; 1 recorded no longer seen" in out


def test_a_grown_magnitude_fails_and_a_baseline_for_other_batches_or_targets_is_refused(today, tmp_path):
    report, path = today
    written = json.loads(path.read_text())
    tol = report["tolerance"]
    within, grown = (dict(written, findings=[dict(f, max_err=f["max_err"] - d) for f in written["findings"]])
                     for d in (tol / 2, 0.01))
    for name, content in (("within.json", within), ("grown.json", grown)):
        (tmp_path / name).write_text(json.dumps(content))
    counts = bl.apply_baseline(report, bl.read_baseline(tmp_path / "within.json", "loss", SEEDS))
    assert counts["known"] == 3
    counts = bl.apply_baseline(report, bl.read_baseline(tmp_path / "grown.json", "loss", SEEDS))
    assert counts["grew"] == 3 and all(f["baseline"].startswith("grown: the baseline has a largest difference of")
                                       for r in report["rows"] for f in r["findings"])
    bad = {"other_target.json": (dict(written, target="trl"), "written for target 'trl'"),
           "other_algorithm.json": (dict(written, algorithms=["dapo"]), "written for algorithm dapo"),
           "other_seeds.json": (dict(written, seeds=30), "written with --seeds 30"),
           "not_a_baseline.json": ({"rows": []}, "not a cliplab baseline of version 1"),
           "garbled.json": (dict(written, findings=[{"family": "typical"}]), "a finding lacks or garbles"),
           "truncated.json": (path.read_text()[:40], "not valid JSON")}
    for name, (content, words) in bad.items():
        file = tmp_path / name
        file.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(ValueError) as err:
            bl.apply_baseline(report, bl.read_baseline(file, "loss", SEEDS))
        assert str(file) in str(err.value) and words in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="written at --level loss; this run is at --level step"):
        bl.read_baseline(path, "step", SEEDS)


def test_the_cli_exits_0_on_todays_findings_and_1_naming_a_new_one_alone(today, monkeypatch, tmp_path):
    from harness.conform import targets
    _, path = today
    monkeypatch.setattr(targets, "load_target", lambda name, adapter=None: Narrow())
    result = CliRunner().invoke(app, ["conform", "verl", "--seeds", str(SEEDS), "--baseline", str(path)])
    assert result.exit_code == 0, result.output
    assert "0 new, 0 grown, 3 known" in result.stdout
    monkeypatch.setattr(targets, "load_target", lambda name, adapter=None: Narrow(change=raises_past_20))
    result = CliRunner().invoke(app, ["conform", "verl", "--seeds", str(SEEDS), "--baseline", str(path),
                                      "--write-baseline", str(tmp_path / "next.json")])
    assert result.exit_code == 1, result.output
    failing = [line for line in result.stdout.splitlines() if line.startswith(("DIFFERS", "RAISES"))]
    assert len(failing) == 1 and "FloatingPointError: log-ratio past 20" in failing[0]
    assert "token_mean" not in failing[0]  # the known finding of the same check is not named
    # today's: the new raise, and the token mean where batches still reach the loss
    assert [f["finding"] for f in json.loads((tmp_path / "next.json").read_text())["findings"]] == [
        "raises FloatingPointError: log-ratio past 20", "matches gspo[agg=token_mean]", "matches gspo[agg=token_mean]"]


def test_every_kind_of_finding_is_accepted_by_its_name():
    target = Narrow(change=lambda run: nan_when_empty(raises_past_20(run)),
                    cases=empty_first)
    report = conform(target, seeds=SEEDS)
    accepts = {f["name"].split(" (")[0].split(":")[0]: f["accept"] for r in report["rows"] for f in r["findings"]}
    assert accepts == {"matches gspo[agg=token_mean]": [["agg=token_mean"]],
                       "raises FloatingPointError": [["raises=FloatingPointError"]],
                       "returns nan on a batch without tokens": [["empty_batch=nan"]]}
    assert not settle(target, report, parse_accept(["agg=token_mean"]))["ok"]
    settled = settle(target, report, parse_accept(["agg=token_mean,raises=FloatingPointError,empty_batch=nan"]))
    assert settled["ok"] and {r["outcome"] for r in settled["rows"]} == {"accepted"}


def empty_first(cases):
    """The check's batches, the first typical one without tokens."""
    def changed(seed, family):
        b = cases(seed, family)
        return replace(b, mask=np.zeros_like(b.mask)) if seed == 0 and family == "typical" else b
    return changed


def test_clamps_empty_rows_and_settings_name_their_accept_items():
    (check,) = Narrow().checks()
    # as TRL's candidates: max_len set, which neither mean reads, so it is no difference to accept
    grpo = ref.policy_grid(["grpo"], {"beta": 0.0, "max_len": 8}, {"agg": ("token_mean", "seq_mean_token_mean")},
                           rows_counted=True)
    check = replace(check, reference=ref.policy_grid(["grpo"], {"beta": 0.0}, {"agg": ("seq_mean_token_mean",)})[0])
    assert sorted(map(tuple, _accepting(check, grpo))) == [("agg=token_mean",), ("empty_rows=counted",)]
    norm = ref.policy_grid(["grpo"], {"beta": 0.0, "max_len": 8}, {"agg": ("seq_mean_token_sum_norm",)})
    assert _accepting(check, norm) == [["agg=seq_mean_token_sum_norm", "max_len=8"]]  # read there: named
    kl_grpo = ref.policy_grid(["grpo"], {"beta": 0.04}, {"agg": ("token_mean",)})[0]
    dppo, rejection = ref.policy("dppo_tv"), ref.policy("grpo", beta=0.0, rollout_correction="seq_rs")
    parts = {make.__name__: v.part for make in ref.VARIANTS
             for conv in (grpo[0], kl_grpo, check.candidates[0], dppo, rejection)
             if (v := make(conv)) is not None and v.part}
    assert len(parts) == len(ref.VARIANTS)  # every clamp, cap and floor has its name in --accept
    named = {make: _accepting_part(part) for make, part in parts.items()}
    assert named == {"log_ratio_clamped": [["log_ratio_clamp=20"]], "seq_log_ratio_capped": [["seq_log_ratio_cap=10"]],
                     "kl_term_capped": [["k3_cap=10"]], "ratio_truncated": [["ratio_truncation=3"]],
                     "surrogate_value": [["value=surrogate"]], "rejected_rows_dropped": [["rejected_rows=dropped"]]}
    assert {"log_ratio_clamp", "seq_log_ratio_cap", "k3_cap", "ratio_truncation", "max_len"} <= set(NUMERIC)
    assert parse_accept(["rejected_rows=dropped,value=surrogate"]) == {"rejected_rows": {"dropped"},
                                                                      "value": {"surrogate"}}
    assert parse_accept(["empty_rows=counted,non_finite=inf,log_ratio_clamp=20"]) == {
        "empty_rows": {"counted"}, "non_finite": {"inf"}, "log_ratio_clamp": {20.0}}


class StepTarget:
    """A stand-in trainer whose step scales the reference gradient by ``scale`` on two ranks."""
    name, versions, how = "scaled", {"scaled": "0"}, "A test double."

    def __init__(self, scale):
        self.scale = scale

    def step_checks(self):
        conv = ref.policy("dapo", agg="token_mean")
        return [StepCheck("dapo", "scaled()", "a knob", lambda b, micro, ranks: (
            conv.fn(b)[1] * (self.scale if ranks == 2 else 1.0), b), conv)]


def test_step_level_findings_are_grid_cells_held_to_their_baseline(tmp_path, monkeypatch, capsys):
    import harness.conform.step as cs
    path = tmp_path / "step.json"
    monkeypatch.setattr(cs, "load_step_target", lambda target, adapter=None: StepTarget(0.5))
    assert not cs.step_command("scaled", seeds=1, write_baseline=path)["ok"]
    cells = json.loads(path.read_text())["findings"]
    assert written_level(path) == "step" and len(cells) == 2 * len(cs.MICRO)  # both families, every micro at 2 ranks
    assert cs.step_command("scaled", seeds=1, baseline=path)["ok"]
    monkeypatch.setattr(cs, "load_step_target", lambda target, adapter=None: StepTarget(0.25))
    report = cs.step_command("scaled", seeds=1, baseline=path)
    out = capsys.readouterr().out
    assert not report["ok"] and report["baseline"]["grew"] == len(cells) and "grown: the baseline has" in out
    with pytest.raises(ValueError, match="written at --level step; this run is at --level loss"):
        bl.read_baseline(path, "loss", 1)


def written_level(path):
    return json.loads(path.read_text())["level"]


def token_mean_grpo(logp, old_logp, adv, mask):
    """GRPO's clip over the batch's tokens (a token mean, where GRPO means each sequence's tokens)."""
    import torch
    r = torch.exp(logp - old_logp)
    loss = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv)
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def test_assert_conforms_takes_a_baseline(tmp_path):
    from cliplab import assert_conforms
    path = tmp_path / "mine.json"
    with pytest.raises(AssertionError, match="matches grpo"):
        assert_conforms(token_mean_grpo, "grpo", beta=0, seeds=1)
    assert_conforms(token_mean_grpo, "grpo", beta=0, seeds=1, write_baseline=path)
    report = assert_conforms(token_mean_grpo, "grpo", beta=0, seeds=1, baseline=path)
    assert report["ok"] and report["baseline"]["new"] == 0 and report["baseline"]["known"] > 0
    with pytest.raises(ValueError, match="written with --seeds 1"):
        assert_conforms(token_mean_grpo, "grpo", beta=0, seeds=2, baseline=path)


def test_the_committed_baselines_record_the_committed_reports(tmp_path):
    # `cliplab conform all` writes each report's baseline beside it: a stale or missing one is written again there
    import glob
    from pathlib import Path

    from harness.conform.matrix import baseline_stem
    folder = Path(__file__).resolve().parents[1] / "reports" / "conformance"
    reports = [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(folder / "*.json"))
                                                                 + glob.glob(str(folder / "step" / "*.json")))]
    reports = [r for r in reports if isinstance(r, dict) and "rows" in r]
    assert {r["target"] for r in reports} >= {"verl", "trl", "skyrl"}
    for report in reports:
        bl.write_baseline(report, tmp_path / "want.json")
        committed = folder / "baselines" / f"{baseline_stem(report)}.json"
        assert committed.exists() and committed.read_text() == (tmp_path / "want.json").read_text(), (
            f"{committed} is missing or stale: cliplab conform all --out reports/conformance")
