"""``cliplab sim --match``: the target card read from run folders, residuals in tolerance units, an objective
that is zero at the target's own settings, an unreachable card reported as such (exit 1), and targets without a
fittable metric named."""
import json
import math
import re

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.reports.regime import MISSING, residual
from harness.runs.match import Objective, knobs, target_card
from sim.loop import run_stack
from spec.records import write_json


def _sweep_folder(root, label, records_by_seed, algo="grpo", settings=None):
    for seed, records in enumerate(records_by_seed):
        d = root / f"{label}_s{seed}"
        d.mkdir(parents=True)
        write_json(d / "config.json", {"algo": algo, "label": label, "seed": seed, "env": "feature_lm",
                                       "params": {}, "settings": settings or {}})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def test_residuals_are_in_tolerance_units():
    assert residual("clip_frac", 0.02, 0.01) == pytest.approx(1.0)  # a factor of 2
    assert residual("clip_frac", 0.0025, 0.01) == pytest.approx(-2.0)
    assert residual("clip_up_frac", 0.0, 1e-6) == 0.0  # both below the floor: neither clip binds
    assert residual("accuracy_end", 0.45, 0.5) == pytest.approx(-0.5)
    assert residual("entropy_fall", None, 0.5) == MISSING
    assert residual("entropy_fall", math.nan, 0.5) == MISSING


def test_the_objective_is_zero_at_the_targets_own_settings(tmp_path):
    settings = {"lr": 0.01, "minibatches": 4, "staleness": 1, "confidence": 2.5, "difficulty_low": -6.0,
                "difficulty_high": 2.0, "n_features": 64}
    records = run_stack("feature_lm", "grpo", [0, 1], 20, settings)
    _sweep_folder(tmp_path, "grpo", records, settings=settings)
    label, algo, target = target_card([tmp_path], None)
    assert (label, algo) == ("grpo", "grpo") and {"decision_clip_frac", "accuracy_start"} <= set(target)
    assert "clip_frac" not in target and "clip_up_frac" not in target  # the ratios per decision token stand for them
    knob_list = [k for k in knobs() if k.key in settings]
    objective = Objective("grpo", target, knob_list, 2, 20, {})
    x = [math.log10(settings[k.key]) if k.log else settings[k.key] for k in knob_list]
    assert objective.settings(x) == settings
    assert objective(x) == 0.0


def test_the_search_stops_at_the_first_generation_that_matches(tmp_path):
    """The budget is a ceiling: a generation whose best point matches ends the search, and its card is the fit's."""
    from harness.runs.match import fit
    settings = {"lr": 0.01, "minibatches": 4, "staleness": 1, "confidence": 2.5, "difficulty_low": -6.0,
                "difficulty_high": 2.0, "n_features": 64}
    _sweep_folder(tmp_path, "grpo", run_stack("feature_lm", "grpo", [0, 1], 20, settings), settings=settings)
    fixed = {k: v for k, v in settings.items() if k not in ("lr", "confidence")}
    free = [k for k in knobs() if k.key not in fixed]
    found = fit([tmp_path], seeds=2, steps=20, budget=200, workers=1, fixed=fixed)
    assert found.matched and found.evaluations < 200 and found.evaluations % (2 * len(free)) == 0
    again = Objective("grpo", found.target, [], 2, 20, found.settings)
    assert again.residuals([]) == found.residuals  # the card it reports is the one its settings give


def test_an_unreachable_card_is_reported_with_its_residuals_and_exits_1(tmp_path):
    records = [[{"step": s, "clip_frac": 0.5, "accuracy": 0.3} for s in range(10)]]
    _sweep_folder(tmp_path, "grpo", records)
    out = CliRunner().invoke(app, ["sim", "--match", str(tmp_path), "--match-budget", "10", "--steps", "8",
                                   "--seeds", "1", "--workers", "1", "--out", str(tmp_path / "ablation")])
    assert out.exit_code == 1, out.output
    runs = int(re.search(r"card, (\d+) simulator runs", out.output)[1])
    assert runs <= 10  # the budget
    clip = next(line for line in out.output.splitlines() if line.startswith("clip_frac "))
    assert abs(float(clip.split()[3])) > 1  # its residual, in tolerance units
    assert "not matched" in out.output and not any((tmp_path / "ablation").glob("*/metrics.jsonl"))  # no ablation
    record = json.loads((tmp_path / "ablation" / "fit.json").read_text())  # the fit's record, for the reports
    assert record["matched"] is False and record["evaluations"] == runs
    clip_entry = next(e for e in record["entries"] if e["entry"] == "clip_frac")
    assert clip_entry["target"] == 0.5 and clip_entry["residual"] == pytest.approx(float(clip.split()[3]), abs=0.01)


def test_a_target_without_a_fittable_metric_names_the_entries_and_metrics(tmp_path):
    _sweep_folder(tmp_path, "grpo", [[{"step": s, "loss": 0.1} for s in range(5)]])
    with pytest.raises(ValueError, match=r"logs no card entry the fit can target.*clip_frac needs clip_frac "
                                         r"\(verl actor/pg_clipfrac"):
        target_card([tmp_path], None)


def test_a_budget_below_one_run_per_knob_names_the_knobs_it_must_cover(tmp_path):
    """The first population of the search is one point per knob fitted: a budget below it cannot be kept."""
    from harness.runs.match import fit
    _sweep_folder(tmp_path, "grpo", [[{"step": s, "clip_frac": 0.01, "accuracy": 0.3} for s in range(5)]])
    free = [k.key for k in knobs() if k.key not in ("lr", "explore")]
    with pytest.raises(ValueError, match=rf"match-budget: expected at least {len(free)} simulator runs \(one per "
                                         rf"knob fitted: {', '.join(free)}\), got {len(free) - 1}"):
        fit([tmp_path], budget=len(free) - 1, fixed={"lr": 0.01, "explore": "exploration"})


def test_several_labels_need_match_label(tmp_path):
    _sweep_folder(tmp_path, "grpo", [[{"step": 0, "clip_frac": 0.01}]])
    _sweep_folder(tmp_path, "dapo", [[{"step": 0, "clip_frac": 0.01}]], algo="dapo")
    with pytest.raises(ValueError, match="match-label: .* hold 2 labels"):
        target_card([tmp_path], None)
    assert target_card([tmp_path], "dapo")[1] == "dapo"
    with pytest.raises(ValueError, match="match-label: no label 'ppo'"):
        target_card([tmp_path], "ppo")


def test_fitted_runs_at_a_fits_settings_in_no_label_and_bad_fits_are_one_line_errors(tmp_path):
    fit = tmp_path / "fit.json"
    write_json(fit, {"env": "feature_lm", "settings": {"lr": 0.02, "minibatches": 2, "explore": "exploration",
                                                      "overlong_filter": True}})
    out = CliRunner().invoke(app, ["sim", "--env", "feature_lm", "--fitted", str(fit), "--algos", "grpo",
                                   "--set", "eps_high=0.2,0.28", "--seeds", "1", "--steps", "2", "--workers", "1",
                                   "--out", str(tmp_path / "sweep")])
    assert out.exit_code == 0, out.output
    configs = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("runs/*/config.json"))]
    assert {c["label"] for c in configs} == {"grpo[eps_high=0.2]", "grpo[eps_high=0.28]"}
    assert all(c["settings"]["lr"] == 0.02 and c["settings"]["explore"] == "exploration"
               and c["settings"]["overlong_filter"] is True for c in configs)  # a fixed true/false setting too
    write_json(tmp_path / "other.json", {"env": "toy_lm", "settings": {"lr": 0.02}})
    (tmp_path / "broken.json").write_text("{")
    for bad, message in ((tmp_path / "missing.json", "is missing; expected the fit.json"),
                         (tmp_path / "other.json", "expected a fit record"),
                         (tmp_path / "broken.json", "not valid JSON")):
        out = CliRunner().invoke(app, ["sim", "--env", "feature_lm", "--fitted", str(bad), "--out",
                                       str(tmp_path / "x")])
        assert out.exit_code == 2 and out.output.startswith("error: fitted: ") and message in out.output, out.output
        assert len(out.output.strip().splitlines()) == 1
    out = CliRunner().invoke(app, ["sim", "--env", "toy_lm", "--fitted", str(fit), "--out", str(tmp_path / "x")])
    assert out.exit_code == 2 and "error: env: --fitted" in out.output
    out = CliRunner().invoke(app, ["sim", "--fitted", str(fit), "--match", str(tmp_path), "--out",
                                   str(tmp_path / "x")])
    assert out.exit_code == 2 and "error: fitted: --match fits anew" in out.output


def test_a_log_scaled_whole_number_knob_is_searched_in_log_space_and_rounded():
    from harness.runs.match import Knob
    k = next(k for k in knobs() if k.key == "n_features")
    assert k.log and k.integer and not k.integral  # x is log10(n): integrality on x would allow only 10, 100
    assert k.bounds() == (math.log10(32), math.log10(256))
    assert [k.value(math.log10(n)) for n in (32, 64, 100, 256)] == [32, 64, 100, 256]
    assert Knob("minibatches", 1, 16, integer=True).integral


def test_the_ablations_arguments_are_checked_before_the_fit_spends_its_budget(tmp_path):
    _sweep_folder(tmp_path, "grpo", [[{"step": s, "clip_frac": 0.01, "accuracy": 0.3} for s in range(10)]])
    out = CliRunner().invoke(app, ["sim", "--match", str(tmp_path), "--seeds", "0", "--out", str(tmp_path / "x")])
    assert out.exit_code == 2 and out.output.startswith("error: seeds: ") and "fit of the simulator" not in out.output


def test_a_fit_asked_the_same_again_is_reused_and_one_asked_otherwise_is_run(tmp_path, monkeypatch):
    """simulate.sh reruns --match into the same folder: the same card, budget and settings reuse its fit.json (the
    fit is deterministic), which the ablations then resume at; a changed budget or target card fits again."""
    import harness.runs.match as match
    records = [[{"step": s, "clip_frac": 0.5, "accuracy": 0.3} for s in range(10)]]
    _sweep_folder(tmp_path / "target", "grpo", records)
    args = ["sim", "--match", str(tmp_path / "target"), "--steps", "8", "--seeds", "1", "--workers", "1",
            "--out", str(tmp_path / "ablation")]
    first = CliRunner().invoke(app, [*args, "--match-budget", "10"])
    record = json.loads((tmp_path / "ablation" / "fit.json").read_text())
    calls = []
    monkeypatch.setattr(match.Objective, "card", lambda self, x: calls.append(x) or dict.fromkeys(self.target, 0.5))
    again = CliRunner().invoke(app, [*args, "--match-budget", "10"])
    assert (first.exit_code, again.exit_code) == (1, 1) and calls == []
    assert "reused" in again.output and json.loads((tmp_path / "ablation" / "fit.json").read_text()) == record
    assert again.stdout.split("reused (delete it to fit again)\n")[1] == first.stdout  # the same fit, printed
    assert "fit feature_lm to grpo" in first.stderr and "10/10" in first.stderr  # the progress bar, in runs
    other = CliRunner().invoke(app, [*args, "--match-budget", "11"])
    assert other.exit_code == 1 and calls and "reused" not in other.output  # fitted again (the stand-in's card)
    assert json.loads((tmp_path / "ablation" / "fit.json").read_text())["inputs"]["budget"] == 11


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_point_whose_learning_rate_diverges_is_the_farthest_fit_not_the_fits_end():
    """The search may try a learning rate that diverges (sim.loop.Diverged): that point's every entry reads as
    missing, and it scores worse than any point with a card, however far (a finite sum of squares), so the fit
    goes on elsewhere."""
    target = {"clip_frac": 0.01, "accuracy_start": 0.3}
    diverging = {"optimizer": "sgd", "lr": 10.0, "minibatches": 16, "epochs": 4, "n_features": 32}
    objective = Objective("grpo", target, [], 1, 3, diverging)
    assert objective.residuals([]) == dict.fromkeys(target, MISSING)
    assert objective([]) == math.inf
    far = Objective("grpo", {"clip_frac": 0.9, "accuracy_start": 1.0}, [], 1, 3, {"optimizer": "sgd", "lr": 1e-4})
    assert math.isfinite(far([])) and far([]) > 2 * MISSING ** 2  # a bad card still beats a diverged run
