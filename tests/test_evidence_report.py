"""The evidence section of the real-model README (harness/reports/evidence.py, harness/real_report.write_readme) on
fabricated run folders, against values worked by hand; and the evidence runner's bookkeeping."""
import json
import shutil

import pytest
import yaml

from gpu.config import from_dict
from gpu_helpers import tiny_config, tiny_path  # noqa: F401  (fixture)
from harness.runs.evidence import finished, jobs, main, run_lane
from harness.reports.claim_record import Claim, ClaimRecord, Kind, RunSet, SetResult, Source, Verdict
from harness.reports.claim_render import json_text, read_claims
from harness.reports.evidence import Evidence, paired, t_interval
from harness.reports.real import KEEP, write_readme

STEPS = 3
#: two-sided p of t = 4 sqrt(3) on 2 degrees of freedom, where P(|T| > t) = 1 - t / sqrt(2 + t^2)
P_T4SQRT3 = 1 - 4 * 3 ** 0.5 / 50 ** 0.5


def _run(root, algo, seed, name=None, hp=None, **per_step):
    """A run folder <name>/seed<k>/ (name: the algorithm's by default) whose metrics are constant over the steps
    except those given as lists."""
    folder = root / (name or algo) / f"seed{seed}"
    folder.mkdir(parents=True)
    cfg = from_dict({"algo": {"name": algo, "hp": hp or {}}, "run": {"seed": seed, "steps": STEPS},
                     "rollout": {"group_size": 4, "max_new_tokens": 16}}).to_dict()
    (folder / "config.json").write_text(json.dumps(cfg))
    base = {"reward": 0.5, "accuracy": 0.5, "entropy": 1.0, "tcr": 0.1, "rur": 0.5, "len_wrong": 10.0,
            "truncated_frac": 0.2, "gen_per_trained": 1.0, "ratio_dev_median": 0.05, "step_time_s": 10.0,
            "pass@1": 0.5, "pass@4": 0.75, "zero_grad_frac": 0.5}
    with (folder / "metrics.jsonl").open("w") as f:
        for i in range(STEPS):
            rec = {"step": i + 1, **base, **{k: (v[i] if isinstance(v, list) else v) for k, v in per_step.items()}}
            f.write(json.dumps(rec) + "\n")


@pytest.fixture
def evidence(tmp_path):
    root = tmp_path / "evidence"
    for seed, (tcr, rur) in enumerate([(0.01, 0.5), (0.02, 0.5), (0.03, 0.5)]):
        _run(root, "grpo", seed, tcr=tcr, rur=rur)
    for seed, rur in enumerate([0.9, 1.0, 0.8]):
        _run(root, "dcpo", seed, tcr=0.001, rur=rur)
        _run(root, "dapo", seed, tcr=0.05, gen_per_trained=[1.5, 2.0, 1.0 + seed / 2])
        _run(root, "gspo", seed, tcr=0.5, entropy=[1.0, 0.9, 0.8])
        _run(root, "sapo", seed, tcr=0.0, entropy=[1.0, 0.95, 0.8])
    return root


def test_t_interval_and_pairing_by_hand():
    iv = t_interval([0.01, 0.02, 0.03])  # sd 0.01, t(0.975, 2) = 4.303
    assert (iv.mean, iv.n) == (pytest.approx(0.02), 3) and iv.half == pytest.approx(4.303 * 0.01 / 3 ** 0.5,
                                                                                      rel=1e-4)
    a = {0: {"x": 0.5}, 1: {"x": 0.5}, 2: {"x": 0.5}, 3: {"x": 9.0}}
    b = {0: {"x": 0.9}, 1: {"x": 1.0}, 2: {"x": 0.8}}
    c = paired(a, b, "x")  # seeds 0-2 only; differences 0.4, 0.5, 0.3: t = 0.4 / (0.1 / sqrt 3) on 2 df
    assert (c.diff, c.n_a) == (pytest.approx(0.4), 3) and c.half == pytest.approx(4.303 * 0.1 / 3 ** 0.5, rel=1e-4)
    assert c.p == pytest.approx(P_T4SQRT3, rel=1e-6)
    assert not paired(a, {0: {"x": 0.6}, 1: {"x": 0.4}}, "x").significant()  # +0.1, -0.1: the interval holds 0


def test_evidence_summaries(evidence):
    ev = Evidence(evidence)
    assert sorted(ev.s) == ["dapo", "dcpo", "grpo", "gspo", "sapo"] and set(ev.s["grpo"]) == {0, 1, 2}
    assert ev.vals("grpo", "clip_frac") == pytest.approx([0.01, 0.02, 0.03])  # tcr read under the simulator's name
    # gen_per_trained is the mean over steps: seed 0 (1.5 + 2 + 1) / 3, seed 2 (1.5 + 2 + 2) / 3
    assert ev.vals("dapo", "gen_per_trained") == pytest.approx([1.5, 1.5 + 0.5 / 3, 1.5 + 1 / 3])
    assert ev.vals("gspo", "entropy_final") == pytest.approx([0.8] * 3)
    assert ev.cell("grpo", "clip_frac", pct=True) == "2% ± 2.48%"


def test_readme_regenerates_with_claims(evidence, tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "grpo", 0)
    sim = tmp_path / "sim"
    sim.mkdir()
    for env, rur in (("toy_lm", 0.98), ("feature_lm", 0.6)):
        (sim / "summaries").mkdir(exist_ok=True)
        (sim / "summaries" / f"{env}_main.json").write_text(json.dumps({"env": env, "steps": 300, "algorithms": {
            "dcpo": {"rur": rur, "rur_std": 0.01, "seeds": 5}, "grpo": {"rur": 0.3, "rur_std": 0.02, "seeds": 5}}}))
    sim_rur = ClaimRecord(Claim("dcpo_rur", "x", Source("DCPO", None, "")), "", Kind.REPRODUCED, "y",
                          SetResult(Verdict(Kind.REPRODUCED), measured="median |r - 1| 0"))
    (sim / "claims.json").write_text(json_text([RunSet("toy_lm", (sim_rur,)), RunSet("feature_lm", ())]))
    readme = tmp_path / "out" / "README.md"
    readme.parent.mkdir()
    readme.write_text(f"old text\n{KEEP}\n\n## Speed\nkept\n")
    text = write_readme(readme, evidence, runs, sim).read_text()
    assert text.endswith(f"{KEEP}\n\n## Speed\nkept\n") and "old text" not in text
    row = next(line for line in text.splitlines() if line.startswith("| [DCPO's RUR"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "**reproduced**" and cells[3] == "no record"  # the simulator's records, per environment
    assert ("- DCPO's RUR is well above GRPO's: simulator toy LM dcpo rur 98% ± 1% sd; grpo rur 30% ± 2% sd (5 "
            "seeds, 300 steps); simulator feature LM dcpo rur 60% ± 1% sd") in text
    # real, paired t tests over 3 seeds, Holm across the 4 claims tested: RUR differences 0.4, 0.5, 0.3 and DAPO's
    # generations per trained response minus 1, 0.5, 0.667, 0.833, both t = 4 sqrt(3), p 0.0202; GSPO's TCR
    # differences 49%, 48%, 47% (t = 83.1, p 0.00015); DCPO's TCR against GRPO's seeds (1%, 2%, 3%): -0.9%, -1.9%,
    # -2.9% (t = -3.29, p 0.081; against DAPO the same -4.9% on every seed: structural). Holm: 4 x 0.00015;
    # 3 x 0.0202 = 0.061; 0.061; 0.081: only GSPO's stays under 5%
    assert cells[5].startswith("**not detectable with 3 seeds (smallest detectable effect ")
    assert cells[4] == "RUR, dcpo - grpo: 40% ± 24.8% (paired, Holm p 0.061)"  # 3 x 0.0202
    (real,) = read_claims(readme.parent / "claims.json")  # the records, with every number measured
    by = {r.claim.id: r for r in real.records}
    assert "RUR dcpo 90% ± 24.8% vs grpo 50%" in by["dcpo_rur"].discovery.measured
    assert by["dcpo_tcr"].kind is Kind.NOT_DETECTABLE and "TCR dcpo 0.1%" in by["dcpo_tcr"].discovery.measured
    assert by["gspo_clips"].kind is Kind.REPRODUCED and "(25x;" in by["gspo_clips"].discovery.measured
    assert by["dynamic_sampling"].kind is Kind.NOT_DETECTABLE
    assert "dapo generates 1.67 ± 0.414" in by["dynamic_sampling"].discovery.measured
    assert by["clip_higher"].kind is Kind.NOT_TESTABLE  # 3 steps: entropy has not fallen
    assert by["sapo_temperatures"].claim.source.arxiv == "2511.20347"
    details = (readme.parent / "claims.md").read_text()
    assert "### dcpo_rur-1" in details and "RUR dcpo 90% ± 24.8% vs grpo 50%" in details
    assert "Holm-corrected across the 4 claims tested here" in text
    assert "- seed 0: entropy differs from step 2 on (largest gap 0.05)" in text
    # paired section: Holm over every (algorithm, metric) test against GRPO; rur's p 0.0202 is not significant
    # after it, GSPO's TCR (p 0.00015, times at most 7 tests here) is
    assert "- dcpo - grpo, rur" not in text and "- gspo - grpo, clip_frac: 0.48 ± 0.0248 (n = 3 seeds" in text
    assert (readme.parent / "evidence_curves.png").stat().st_size > 1000


def test_runner_jobs_and_finished(tmp_path):
    assert jobs(("a", "b"), (0, 1)) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # seed-major
    assert jobs(("a", "b"), (0, 1), lane=1, lanes=2) == [("b", 0), ("b", 1)]
    with pytest.raises(ValueError, match="^lane: "):
        jobs(lane=2, lanes=2)
    _run(tmp_path, "grpo", 0)
    assert finished(tmp_path / "grpo" / "seed0", STEPS) and not finished(tmp_path / "grpo" / "seed0", STEPS + 1)
    assert not finished(tmp_path / "nothing", 1)


def test_runner_extends_finished_runs_as_if_they_had_been_started_longer(tmp_path, tiny_path):
    """``--steps`` past the configs' run.steps: a finished run resumes from its last checkpoint and its copy is
    replaced; its steps are those of a run started at the longer length (resume is exact up to float order)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    raw = tiny_config(tmp_path / "unused", "grpo", steps=2, run={"resume": True, "threads": 1})
    (configs / "grpo.yaml").write_text(yaml.safe_dump(raw))
    lane = {"algos": ["grpo"], "seeds": [0], "commit": False}
    run_lane(configs, tmp_path / "runs", tmp_path / "copy", **lane)
    assert finished(tmp_path / "copy" / "grpo" / "seed0", 2)
    first_two = (tmp_path / "runs" / "grpo" / "seed0" / "metrics.jsonl").read_text()
    run_lane(configs, tmp_path / "runs", tmp_path / "copy", **lane, steps=3)
    # resumed, not started over: the first two steps' lines (their timings among them) are the ones written before
    assert (tmp_path / "copy" / "grpo" / "seed0" / "metrics.jsonl").read_text().startswith(first_two)
    shutil.rmtree(tmp_path / "runs")  # a new clone: the weights are gone, the committed copy is whole
    run_lane(configs, tmp_path / "runs", tmp_path / "copy", **lane, steps=3)
    assert not (tmp_path / "runs").exists()  # so nothing is trained again
    run_lane(configs, tmp_path / "straight", tmp_path / "straight_copy", **lane, steps=3)
    extended, straight = ([json.loads(x) for x in (root / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()]
                          for root in (tmp_path / "copy", tmp_path / "straight_copy"))
    assert [m["step"] for m in extended] == [m["step"] for m in straight] == [1, 2, 3]
    for x, y in zip(extended, straight):
        for k in ("reward", "loss", "rur", "len_mean", "grad_norm"):
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)


def test_runner_applies_a_setting_to_every_config(tmp_path, tiny_path):
    """``--set``: each run's config.json records the setting; the configs on disk are left as they are."""
    configs = tmp_path / "configs"
    configs.mkdir()
    raw = tiny_config(tmp_path / "unused", "grpo", steps=1, run={"resume": True, "threads": 1})
    (configs / "grpo.yaml").write_text(yaml.safe_dump(raw))
    main(["--configs", str(configs), "--out", str(tmp_path / "runs"), "--copy-to", str(tmp_path / "copy"),
          "--algos", "grpo", "--seeds", "0", "--no-commit", "--set", "algo.overlong_filter=true"])
    written = json.loads((tmp_path / "copy" / "grpo" / "seed0" / "config.json").read_text())
    assert written["algo"]["overlong_filter"] is True and written["run"]["seed"] == 0
    assert "overlong_filter" not in yaml.safe_load((configs / "grpo.yaml").read_text())["algo"]


def test_verdict_rules():
    from harness.reports.evidence import Measured, verdict
    from harness.reports.stats import paired_test
    up = paired_test([0, 0, 0], [0.3, 0.5, 0.4])  # differences 0.3, 0.5, 0.4
    down = paired_test([0.3, 0.5, 0.4], [0, 0, 0])
    def kind(m, p):
        return verdict(m, p).kind
    assert kind(Measured("", up, +1), 0.01) is Kind.REPRODUCED
    assert kind(Measured("", up, +1, magnitude=False), 0.01) is Kind.PARTLY
    assert kind(Measured("", down, +1), 0.01) is Kind.REVERSED and kind(Measured("", down, -1), 0.01) is Kind.REPRODUCED
    assert verdict(Measured("", up, +1), 0.2).text().startswith("not detectable with 3 seeds (smallest detectable "
                                                                "effect ")
    assert kind(Measured("", paired_test([1.0], [2.0]), +1), float("nan")) is Kind.NOT_TESTABLE
    assert kind(Measured("", up, +1, fixed=Kind.NOT_MEASURED), 0.01) is Kind.NOT_MEASURED
    assert kind(Measured("", paired_test([1, 2], [1.5, 2.5]), +1), float("nan")) is Kind.REPRODUCED  # structural
    same = verdict(Measured("", paired_test([1, 2], [1, 2]), +1), float("nan"))
    assert same.kind is Kind.NOT_REPRODUCED and same.text() == "not reproduced (identical on every seed)"
    assert verdict(Measured("", up, +1, note="confounded"), 0.01).text() == "reproduced (confounded)"


def test_clip_higher_reads_the_clean_pair_when_it_ran(evidence):
    for seed, ent in enumerate([0.9, 0.95, 1.0]):
        _run(evidence, "grpo", seed, name="grpo_beta0", hp={"beta": 0.0}, entropy=0.8)
        _run(evidence, "grpo", seed, name="grpo_beta0_eps_high028", hp={"beta": 0.0, "eps_high": 0.28}, entropy=ent)
    from harness.reports.evidence import real_clip_higher
    ev = Evidence(evidence)
    assert "grpo_beta0" in ev.s and ev.vals("grpo", "clip_frac") == pytest.approx([0.01, 0.02, 0.03])
    m = real_clip_higher(ev)  # differences 0.1, 0.15, 0.2: mean 0.15, half-width 4.303 * 0.05 / sqrt 3
    assert m.text.startswith("GRPO without KL, final entropy eps_high 0.28 0.95 ± 0.124 vs 0.2 0.8")
    assert m.test.diff == pytest.approx(0.15) and m.test.half == pytest.approx(4.303 * 0.05 / 3 ** 0.5, rel=1e-4)
    assert m.fixed is Kind.NOT_TESTABLE  # 3 steps: entropy has not fallen yet
