"""The tiny tier's report (harness/reports/tiny.py) on fabricated run folders whose answers are worked by hand: the
settings the claims compare, DCPO's RUR attribution, the simulator's verdicts read and compared, the agreement rate,
what moved; and the committed reports/tiny/README.md against what `python -m harness.reports.tiny` writes."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.reports import tiny
from harness.reports.claim_record import Claim, ClaimRecord, Kind, RunSet, SetResult, Source, Verdict
from harness.reports.claim_render import json_text, read_claims
from harness.reports.claims import run_claims
from harness.reports.regime import CardValue, run_set_card

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "reports" / "tiny"
STEPS = 20


def _config(name: str, seed: int, algo: dict, model: str = "tiny_char") -> dict:
    return {"run": {"out_dir": f"runs/tiny/{name}/seed{seed}", "seed": seed, "steps": STEPS},
            "model": {"name": model}, "data": {"source": "addition", "n": 512, "digits": 3},
            "rollout": {"engine": "hf", "prompts_per_step": 16, "group_size": 8, "max_new_tokens": 24,
                        "temperature": 1.0},
            "train": {"lr": 2e-4, "epochs": 1, "minibatch_size": 32},
            "algo": {"reward": "auto", "advantage": "auto", "hp": {}, **algo}}


def _write(root: Path, name: str, algo: dict, metrics, seeds=range(10), model: str = "tiny_char") -> None:
    """Run folders root/name/seed<k>/ whose step s logs metrics(seed, s) (the trainer's names)."""
    for seed in seeds:
        folder = root / name / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(_config(name, seed, algo, model)))
        base = {"accuracy": 0.5, "reward": 0.5, "entropy": 1.0 - 0.01 * seed, "zero_grad_frac": 0.5,
                "gen_per_trained": 1.0, "len_mean": 20.0, "len_wrong": 22.0, "tcr": 0.0005, "rur": 0.5}
        lines = [json.dumps({**base, "step": s + 1, **metrics(seed, s)}) for s in range(STEPS)]
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _wiggle(seed: int) -> float:
    """Zero-mean over seeds 0-9 (and over each of 0-4 and 5-9): +-0.01."""
    return 0.01 * (1 if seed % 2 else -1) * (1 if seed != 4 and seed != 9 else 0)


def _attribution_runs(root: Path) -> None:
    """RUR per seed: GRPO 0.3, DCPO 0.7, binary-reward DCPO 0.5, DCPO without SAS 0.6 (means over seeds exact):
    a gain of 0.4 of which the reward scheme is 0.2 (50%) and SAS 0.1 (25%); at step 1 DCPO and its SAS-less
    variant are equal (no history), the binary one equals GRPO."""
    def rur(mean, step1, k):  # k: each label's own zero-mean noise, so that the paired differences vary
        return lambda seed, s: {"rur": (step1 if s == 0 else mean) + k * _wiggle(seed)}
    _write(root, "grpo", {"name": "grpo"}, rur(0.3, 0.3, 1))
    _write(root, "dcpo", {"name": "dcpo"}, rur(0.7, 0.5, -2))
    _write(root, "dcpo_binary_reward", {"name": "dcpo", "reward": "accuracy"}, rur(0.5, 0.3, 3))
    _write(root, "dcpo_no_sas", {"name": "dcpo", "advantage": "grpo"}, rur(0.6, 0.5, 0.5))


def test_the_trainer_rewards_are_the_simulator_schemes_they_are_named_as():
    from gpu.rewards import OUTCOMES
    from sim.config import REWARD_SCHEMES
    assert set(tiny.REWARD_NAMES) == set(OUTCOMES)
    for name, scheme in tiny.REWARD_NAMES.items():
        assert OUTCOMES[name] == REWARD_SCHEMES[scheme], name


def test_runs_carry_the_settings_their_configs_name_under_the_simulators_names(tmp_path):
    _attribution_runs(tmp_path)
    _write(tmp_path, "grpo_beta0_unclipped", {"name": "grpo", "hp": {"beta": 0.0, "eps_high": 1e6}},
           lambda seed, s: {}, seeds=[0, 7])
    _write(tmp_path, "grpo_beta0_unclipped_sharpening", {"name": "grpo", "hp": {"beta": 0.0, "eps_high": 1e6}},
           lambda seed, s: {}, seeds=[0], model="tiny_char_sharpening")
    runs = {(r["label"], r["seed"]): r for r in tiny.load_tiny(tmp_path)}
    explore = {}  # the tier's default prior (exploration); another names its setting as the simulator's knob does
    assert runs["dcpo", 0]["params"] == explore and runs["grpo", 3]["set"] == "discovery"
    assert runs["dcpo_binary_reward", 5]["params"] == {"reward": "binary", **explore}
    assert runs["dcpo_no_sas", 9]["params"] == {"adv": "grpo", **explore}
    assert runs["dcpo_no_sas", 9]["set"] == "replication"
    assert runs["grpo_beta0_unclipped", 7]["params"] == {"beta": 0.0, "eps_high": 100.0, **explore}
    assert runs["grpo_beta0_unclipped_sharpening", 0]["params"] == {"beta": 0.0, "eps_high": 100.0,
                                                                    "explore": "sharpening"}
    # the simulator's summary over these records: RUR is the mean over steps
    assert runs["grpo", 0]["summary"]["rur"] == pytest.approx(0.3 - 0.01)


def test_dcpo_rur_gain_is_split_between_the_reward_and_sas(tmp_path):
    _attribution_runs(tmp_path)
    lines = tiny.attribution_lines(tiny.load_tiny(tmp_path))
    over, step1 = (next(line for line in lines if line.startswith(f"| {w}")) for w in ("mean over steps", "step 1"))
    cells = [c.strip() for c in over.strip("|").split("|")]
    # the step-1 value is part of the mean over 20 steps: the hand-worked means are over the other 19 steps too
    gain = (0.7 * 19 + 0.5 - 0.3 * 20) / 20
    reward = (0.2 * 19 + 0.2) / 20
    sas = (0.1 * 19 + 0.0) / 20
    assert cells[5].startswith(f"{100 * gain:.3g}%")
    assert f"share of the gain {100 * reward / gain:.3g}%" in cells[6]
    assert f"share of the gain {100 * sas / gain:.3g}%" in cells[7]
    s1 = [c.strip() for c in step1.strip("|").split("|")]
    assert s1[0] == "step 1 (10 seeds)"
    assert "share of the gain 100%" in s1[6] and "share of the gain 0%" in s1[7]  # no SAS history at step 1


def test_missing_ablations_are_named():
    assert tiny.attribution_lines([{"label": "grpo", "seed": 0}]) == [
        "Not measured: no runs of dcpo, dcpo_binary_reward, dcpo_no_sas yet."]


def _rec(claim: str, kind: Kind, regime: str = "", status: str = "both", seeds: int | None = None,
         replication: Kind | None = None, algorithm: str | None = None) -> ClaimRecord:
    """A claim record of ``kind`` (not replicated: discovery ``kind``'s other side ``replication``)."""
    v = Verdict(kind, seeds, 0.1 if seeds else None, note="measured" if kind is Kind.NA else "")
    rep = SetResult(Verdict(replication or kind, seeds))
    final = kind if replication in (None, kind) else Kind.NOT_REPLICATED
    return ClaimRecord(Claim(claim, claim, Source("p", None, "")), regime, final, "r", SetResult(v),
                       rep if status == "both" else None, status, mechanism=regime.endswith(": mechanism"),
                       algorithm=algorithm)


@pytest.mark.parametrize("here, sim, said", [
    (_rec("c", Kind.NOT_DETECTABLE, seeds=5), _rec("c", Kind.NOT_DETECTABLE, seeds=10), "yes"),
    (_rec("c", Kind.REPRODUCED), _rec("c", Kind.PARTLY), "no"),
    (_rec("c", Kind.REVERSED, replication=Kind.REPRODUCED), _rec("c", Kind.PARTLY, replication=Kind.REPRODUCED),
     "yes"),
    (_rec("c", Kind.NOT_MEASURED), _rec("c", Kind.REPRODUCED), None), (_rec("c", Kind.REPRODUCED), None, None),
    (_rec("c", Kind.NOT_TESTABLE), _rec("c", Kind.NOT_TESTABLE), None),  # neither tier can test it
    (_rec("c", Kind.REPRODUCED, status="discovery only"), _rec("c", Kind.REPRODUCED), None),
    (_rec("c", Kind.NA, "x: mechanism"), _rec("c", Kind.NA, "x: mechanism"), None),  # a mechanism row's numbers
])
def test_a_prediction_is_the_same_kind_of_verdict(here, sim, said):
    assert tiny.predicted(here, sim) == said


RUR, GSPO = "DCPO's RUR is well above GRPO's: 71.8% vs 43.8%", "GSPO clips far more tokens than GRPO, about two " \
    "orders of magnitude"


def _gspo_at(kind: Kind, grpo_clip: float) -> ClaimRecord:
    """GSPO's clipping claim measured where GRPO clips ``grpo_clip`` of its tokens (its regime card condition)."""
    from dataclasses import replace

    from harness.reports.claim_record import CardCheck
    from spec.regime import CLIP_BINDS
    return replace(_rec("gspo_clips", kind), conditions=(CardCheck(CLIP_BINDS, grpo_clip, "grpo"),))


def _sim_dir(root: Path) -> Path:
    """A simulator report whose feature_lm records give DCPO's RUR "reproduced" and GSPO's clipping "not
    reproduced" (where GRPO clips 0.08% of its tokens by its card, within a factor of 2 of this tier's 0.05%); its
    summary: GSPO clips 18%, GRPO 5%."""
    sim = root / "sim"
    (sim / "summaries").mkdir(parents=True)
    (sim / "claims.json").write_text(json_text([
        RunSet("feature_lm", (_rec("dcpo_rur", Kind.REPRODUCED), _gspo_at(Kind.NOT_REPRODUCED, 0.0008))),
        RunSet("toy_lm", (_rec("gspo_clips", Kind.REPRODUCED),))]))
    (sim / "summaries" / "feature_lm_main.json").write_text(json.dumps(
        {"algorithms": {"gspo": {"clip_frac": 0.18}, "grpo": {"clip_frac": 0.05}}}))
    return sim


def _lines(runs_dir: Path, sim: Path) -> tuple[list[str], RunSet]:
    runs = tiny.load_tiny(runs_dir)
    rs = tiny.tier_records(runs)
    return tiny.claims_lines(rs, runs, sim), rs


def _row(lines: list[str], text: str) -> str:
    """The summary line of the claim stated as ``text`` (its link's text)."""
    return next(line for line in lines if line.startswith(f"| [{text}]("))


def test_the_claims_table_compares_with_the_simulator_and_names_what_moved(tmp_path):
    runs_dir = tmp_path / "runs"
    _attribution_runs(runs_dir)  # DCPO's RUR 0.7 against GRPO's 0.3: reproduced here, as in the simulator
    # GSPO clips 1000x GRPO here (50% vs 0.05%): reproduced here, "not reproduced" in the simulator
    _write(runs_dir, "gspo", {"name": "gspo"}, lambda seed, s: {"tcr": 0.5 + _wiggle(seed)})
    lines, rs = _lines(runs_dir, _sim_dir(tmp_path))
    assert _row(lines, RUR).endswith("| **reproduced** | yes |")
    # the attribution is measured: the ablations' RURs (discovery seeds, step 1 included), not a credit to SAS
    rur = next(r for r in rs.records if r.claim.id == "dcpo_rur")
    assert "DCPO with the binary reward, SAS kept: RUR 49% ± " in rur.attribution  # (0.3 + 19 x 0.5) / 20
    assert "DCPO with the +1/0/-1 reward, no SAS: RUR 59.5% ± " in rur.attribution  # (0.5 + 19 x 0.6) / 20
    assert _row(lines, GSPO).endswith("| **not reproduced** | no |") and "| **reproduced** |" in _row(lines, GSPO)
    text = "\n".join(lines)
    assert "The simulator predicted 1 of the 2 verdicts both tiers could test at a matching regime card (50%" in text
    # a claim without runs here names what it needs, not the simulator's command
    assert "cliplab sim" not in text and "not measured; needs clip_cov / kl_cov runs beside grpo with the same " \
        "settings; not in this tier's runs yet (reports/tiny/run_sweep.sh, configs/tiny)" in text
    # the disagreement: GRPO's clipping fell 100x from the simulator's (0.05% vs 5%), GSPO's rose under 3x
    moved = next(line for line in lines if line.startswith(f"- {GSPO}"))
    assert "what moved most (this tier vs the simulator): grpo clip_frac 0.0005 vs 0.05; gspo clip_frac 0.5 vs 0.18" \
        in moved


def test_a_collapse_without_the_entropy_split_says_so(tmp_path):
    """This tier logs the total entropy only: the collapse row's why says that, not an empty list of contexts."""
    runs_dir = tmp_path / "runs"
    _write(runs_dir, "grpo", {"name": "grpo"}, lambda seed, s: {"entropy": 1.0 / (1 + s) + 0.001 * seed})
    _, rs = _lines(runs_dir, _sim_dir(tmp_path))
    rec = next(r for r in rs.records if r.claim.id == "entropy_collapse")
    assert rec.attribution == "these runs log the total entropy only, not its split by context"


def test_the_readme_regenerates_from_fabricated_runs_and_says_what_is_wrong(tmp_path):
    runs_dir = tmp_path / "runs"
    _attribution_runs(runs_dir)
    out = tiny.write_readme(tmp_path / "out" / "README.md", runs_dir, _sim_dir(tmp_path))
    text = out.read_text()
    assert "## DCPO's RUR gain: its reward scheme against SAS" in text and "40 runs" in text
    assert (tmp_path / "out" / "tiny_curves.png").exists()
    with pytest.raises(ValueError, match="runs: no <config>/seed<k>/ folders"):
        tiny.write_readme(tmp_path / "o2" / "README.md", tmp_path / "sim", tmp_path / "sim")
    with pytest.raises(SystemExit, match="error: runs: .*nowhere is missing"):
        tiny.main(["--readme", str(tmp_path / "o3" / "README.md"), "--runs", str(tmp_path / "nowhere")])


def test_the_run_length_is_explained_by_the_sweeps_time_and_the_cards_headroom(tmp_path, monkeypatch):
    # 2 settings x 10 seeds x 20 steps at a median 90 s a step in two lanes: 20 * 20 * 90 / 2 s = 5 h; at 300: 75 h
    times = lambda seed, s: {"step_time_s": 90.0 if s % 4 else 1000.0}  # one slow step in four: the median is 90
    _write(tmp_path / "a", "grpo", {"name": "grpo"}, lambda seed, s: {**times(seed, s), "accuracy": 0.95})
    _write(tmp_path / "a", "grpo_sharpening", {"name": "grpo"}, lambda seed, s: {**times(seed, s), "accuracy": 0.5},
           model="tiny_char_sharpening")
    runs = tiny.load_tiny(tmp_path / "a")
    line = tiny.length_line(runs, run_set_card(runs))
    assert "take 5.0 h at 20 steps and 75.0 h at 300 steps, against" in line
    assert "5% (grpo), 50% (grpo_sharpening): the regime has ended for grpo (headroom below 0.1)" in line
    _write(tmp_path / "b", "grpo", {"name": "grpo"}, lambda seed, s: {"accuracy": 0.5})
    runs = tiny.load_tiny(tmp_path / "b")
    line = tiny.length_line(runs, run_set_card(runs))
    assert "log no step times" in line and "the regime has not ended" in line and "for the time budget" in line
    monkeypatch.setattr(tiny, "PLANNED_STEPS", 20)  # runs of the planned length: one figure, and no budget cut
    runs = tiny.load_tiny(tmp_path / "a")
    line = tiny.length_line(runs, run_set_card(runs))
    assert "take 5.0 h at 20 steps, against" in line
    runs = tiny.load_tiny(tmp_path / "b")
    assert tiny.length_line(runs, run_set_card(runs)).endswith("so the runs stop at the planned 20.")


def test_the_smollm2_verdicts_credit_the_reward_and_call_clip_higher_untestable():
    """reports/real/README.md: DCPO's RUR gain there is largest at step 1, before SAS has history; clip-higher
    cannot act in 3 steps."""
    (real,) = read_claims(ROOT / "reports" / "real" / "claims.json")
    by = {r.claim.id: r for r in real.records}
    rur = by["dcpo_rur"]
    measured = rur.discovery.measured
    assert "the gain is largest at step 1, where SAS has no history yet" in measured and "not from SAS" in measured
    assert rur.kind is Kind.NOT_DETECTABLE and rur.verdict_text().startswith("not detectable with 5 seeds")
    assert by["clip_higher"].kind is Kind.NOT_TESTABLE and "no effect" not in by["clip_higher"].reason


def test_the_committed_tiny_report_is_what_the_command_writes(tmp_path, monkeypatch):
    """Once the tiny tier's report or its runs are committed, both must be, and the report must be what
    `python -m harness.reports.tiny` writes from the runs, plots included (run from the repository's root, as the
    command is: its simulator column reads reports/tiny/sim where it exists)."""
    readme, runs = TINY / "README.md", TINY / "runs_regime"
    if not readme.exists() and not runs.exists():
        pytest.skip("the tiny tier's runs are not committed yet (reports/tiny/run_sweep.sh)")
    assert readme.exists(), "reports/tiny/runs_regime is committed without its report: python -m harness.reports.tiny"
    assert runs.is_dir(), "reports/tiny/README.md is committed without its runs (reports/tiny/runs_regime)"
    monkeypatch.chdir(ROOT)
    out = tiny.write_readme(tmp_path / "README.md", runs)
    assert out.read_text() == readme.read_text(), "reports/tiny/README.md is stale: python -m harness.reports.tiny"
    for name in ("claims.json", "claims.md"):
        assert (tmp_path / name).read_text() == (TINY / name).read_text(), f"reports/tiny/{name} is stale"
    for png in sorted(tmp_path.glob("*.png")):
        assert png.read_bytes() == (TINY / png.name).read_bytes(), f"reports/tiny/{png.name} is stale"
    shutil.rmtree(tmp_path)


def test_each_tier_setting_has_its_counterpart_in_the_fitted_simulators_committed_summaries():
    """SIM_LABELS names, per tier config, the label reports/tiny/simulate.sh's sweeps give its setting."""
    summaries = TINY / "sim" / "summaries"
    if not summaries.is_dir():
        pytest.skip("the fitted simulator's report is not committed yet (reports/tiny/simulate.sh)")
    for config, (sweep, label) in tiny.SIM_LABELS.items():
        assert (ROOT / "configs" / "tiny" / f"{config}.yaml").exists(), config
        found = json.loads((summaries / f"{tiny.SIM_ENV}_{sweep}.json").read_text())["algorithms"]
        assert label in found, f"{config}: no {label} in {sweep} ({', '.join(found)})"


#: The simulator's records of claims in several regimes, the default regime first (as reports/sim/claims.json).
SIM_RECORDS = [_rec("clip_higher", Kind.NOT_DETECTABLE, "grpo, beta=0", seeds=10, algorithm="grpo"),
               _rec("clip_higher", Kind.NOT_REPRODUCED, "grpo, beta=0: mechanism", algorithm="grpo"),
               _rec("clip_higher", Kind.REPRODUCED, "grpo, beta=0, forks=1", algorithm="grpo"),
               _rec("clip_higher", Kind.REPRODUCED, "grpo, beta=0, forks=1: mechanism", algorithm="grpo"),
               _rec("sapo_temperatures", Kind.NOT_TESTABLE, "defaults"),
               _rec("sapo_temperatures", Kind.NA, "defaults: mechanism"),
               _rec("sapo_temperatures", Kind.REPRODUCED, "lr=0.06, staleness=6"),
               _rec("cov_entropy", Kind.PARTLY, "clip_cov, beta=0, clip_cov_ratio=0.02", algorithm="clip_cov"),
               _rec("cov_entropy", Kind.REPRODUCED, "kl_cov, beta=0, kl_cov_ratio=0.02", algorithm="kl_cov"),
               _rec("rollout_correction", Kind.NOT_DETECTABLE, "tis, beta=0, rollout_noise=0.2"),
               _rec("rollout_correction", Kind.REVERSED, "mis, beta=0, rollout_noise=0.2")]


@pytest.mark.parametrize("claim, regime, algorithm, found", [
    ("clip_higher", "grpo, beta=0, forks=1", "grpo", "grpo, beta=0, forks=1"),  # the same regime
    ("clip_higher", "", None, "grpo, beta=0"),  # not measured here: the simulator's default regime
    ("clip_higher", "grpo, beta=0.0", "grpo", "grpo, beta=0"),  # the same algorithm, the default regime
    ("clip_higher", "grpo, beta=0.0: mechanism", "grpo", "grpo, beta=0: mechanism"),  # a mechanism with a mechanism
    ("clip_higher", "dapo, beta=0.0", "dapo", None),  # another algorithm's verdict predicts nothing
    ("sapo_temperatures", "beta=0.0", None, "defaults"),
    ("sapo_temperatures", "beta=0.0: mechanism", None, "defaults: mechanism"),
    ("cov_entropy", "", None, "clip_cov, beta=0, clip_cov_ratio=0.02"),
    ("cov_entropy", "kl_cov, beta=0.0", "kl_cov", "kl_cov, beta=0, kl_cov_ratio=0.02"),
    ("no_such_claim", "", None, None),
    # another mismatch: the regime sharing the most settings (MIS with MIS, not the first record, TIS)
    ("rollout_correction", "mis, beta=0, old_logp=policy, staleness=2", None, "mis, beta=0, rollout_noise=0.2"),
    ("rollout_correction", "tis, beta=0, old_logp=policy, staleness=2", None, "tis, beta=0, rollout_noise=0.2"),
])
def test_the_simulator_record_is_the_same_claim_kind_and_algorithm_in_its_default_regime(claim, regime, algorithm,
                                                                                          found):
    rec = tiny.sim_record(SIM_RECORDS, _rec(claim, Kind.REPRODUCED, regime, algorithm=algorithm))
    assert (rec.regime if rec else None) == found


def _pair_runs(root: Path) -> None:
    """The tiny configs CISPO's and clip-higher's claims pair, as configs/tiny names them: cispo leaves beta at its
    registry default 0; GRPO at beta 0 with eps_high 0.2, 0.28 and no upper clip; GRPO at its defaults (beta 0.04).
    CISPO's updates hold 1% of tokens PPO-clip would zero; every label's accuracy is 0.5 + _wiggle (no difference);
    the unclipped runs' final entropy is 0.05 + _wiggle above the eps_high 0.2 runs' (seeds 0-4: 0.05 +- 0.01, and
    0.05 in seed 4)."""
    def metrics(entropy_gain=0.0, k=1):
        return lambda seed, s: {"accuracy": 0.5 + _wiggle(seed), "ppo_zeroed_frac": 0.01, "trunc_frac": 0.001,
                                "entropy": 0.5 + (entropy_gain + k * _wiggle(seed) if s == STEPS - 1 else 0.0),
                                "clip_up_frac": 0.001}
    _write(root, "cispo", {"name": "cispo"}, metrics())
    _write(root, "grpo", {"name": "grpo"}, metrics())
    _write(root, "grpo_beta0", {"name": "grpo", "hp": {"beta": 0.0}}, metrics())
    _write(root, "grpo_beta0_eps_high028", {"name": "grpo", "hp": {"beta": 0.0, "eps_high": 0.28}}, metrics())
    _write(root, "grpo_beta0_unclipped", {"name": "grpo", "hp": {"beta": 0.0, "eps_high": 1e6}}, metrics(0.05, 2))


def test_cispo_and_clip_higher_pair_the_tiny_configs_that_differ_only_by_the_compared_setting(tmp_path):
    _pair_runs(tmp_path)
    runs = tiny.load_tiny(tmp_path)
    params = {r["label"]: r["params"] for r in runs}
    explore = {}
    assert params["cispo"] == params["grpo_beta0"] == {"beta": 0.0, **explore} and params["grpo"] == explore
    rows = {(r.claim.id, r.regime): r for r in run_claims(runs).records}
    # CISPO beside GRPO at beta 0, not beside GRPO's beta 0.04: on both seed sets equal accuracy, 1% of tokens kept
    rec = rows["cispo", "beta=0"]
    assert rec.kind is Kind.REPRODUCED and rec.reason.startswith("CISPO's gradient on those 1% of tokens is -sg(w) A")
    assert rec.compared == ("cispo", "grpo_beta0")
    # clip-higher: the unclipped runs end higher by 0.05 (paired differences over seeds 0-4: t = 0.05 / (SD 0.0089 /
    # sqrt 5) = 12.5, p < 0.001, significant after Holm's correction)
    assert rows["clip_higher", "grpo, beta=0"].kind is Kind.REPRODUCED
    assert ("clip_higher", "grpo, beta=0: mechanism") in rows


def test_verdicts_are_compared_only_at_a_matching_regime_card():
    from dataclasses import replace

    from harness.reports.claim_record import CardCheck
    from spec.regime import CLIP_BINDS, HEADROOM

    def at(rec, clip, headroom):
        return replace(rec, conditions=(CardCheck(CLIP_BINDS, clip, "grpo"), CardCheck(HEADROOM, headroom, "grpo")))
    here, sim = _rec("c", Kind.REPRODUCED), _rec("c", Kind.PARTLY)
    assert tiny.predicted(at(here, 0.01, 0.5), at(sim, 0.015, 0.45)) == "no"  # 1.5x and 0.05 apart: a match
    far = at(sim, 0.05, 0.45)  # 5x the clip share: beyond a factor of 2
    assert tiny.predicted(at(here, 0.01, 0.5), far) is None
    assert tiny.not_compared(at(here, 0.01, 0.5), far) == ("regime cards differ: clip_frac 0.01 vs 0.05 (this "
                                                            "tier, the simulator)")
    assert "no regime card entry measured in both" in tiny.not_compared(at(here, 0.01, 0.5), sim)


def test_a_verdict_whose_regime_fails_on_one_seed_set_is_not_compared_and_says_which_set_and_value():
    from dataclasses import replace

    from harness.reports.claim_record import CardCheck, combine, finding, regime_checked
    from spec.regime import HEADROOM

    def decided(kind, headroom):
        return regime_checked(finding("r", kind, "x", conditions=(CardCheck(HEADROOM, headroom, "dcpo"),)))
    claim = Claim("c", "c", Source("p", None, ""))
    # the replication seeds saturate: "not replicated", but no verdict changed, so nothing to compare
    here = replace(combine(decided(Kind.PARTLY, 0.2), decided(Kind.PARTLY, 0.05), ("0-4", "5-9")), claim=claim)
    assert here.kind is Kind.NOT_REPLICATED
    sim = replace(combine(decided(Kind.PARTLY, 0.3), decided(Kind.PARTLY, 0.3), ("0-9", "10-19")), claim=claim)
    assert tiny.predicted(here, sim) is None
    assert tiny.not_compared(here, sim) == ("not testable on this tier's replication seeds (dcpo's headroom is 0.05; "
                                            "the claim needs headroom >= 0.1)")
    assert tiny.not_compared(sim, here).startswith("not testable on the simulator's replication seeds")
    first = replace(combine(decided(Kind.PARTLY, 0.05), decided(Kind.PARTLY, 0.2), ("0-4", "5-9")), claim=claim)
    assert tiny.not_compared(first, sim).startswith("not testable on this tier's discovery seeds (dcpo's headroom")
    assert tiny.predicted(replace(here, replication=replace(here.replication, verdict=Verdict(Kind.REVERSED)),
                                  kind=Kind.NOT_REPLICATED), sim) == "no"  # a verdict that did change is compared


def test_the_fit_to_this_tiers_card_is_shown_entry_by_entry_and_its_report_is_the_simulator_column(tmp_path):
    fitted, default = tmp_path / "fitted", tmp_path / "default"
    assert tiny.simulator_dir(fitted, default) == default  # no fit yet: the simulator at its own defaults
    assert tiny.fit_lines(fitted)[0].startswith("Not fitted yet")
    fitted.mkdir()
    (fitted / "fit.json").write_text(json.dumps({
        "env": "feature_lm", "label": "grpo", "algo": "grpo", "settings": {"lr": 0.0113, "minibatches": 6},
        "evaluations": 241, "matched": False,
        "entries": [{"entry": "clip_frac", "target": 0.0035, "fitted": 0.009, "residual": 1.36},
                    {"entry": "upclip_pold_lt02", "target": 0.52, "fitted": None, "residual": 3.0}]}))
    lines = tiny.fit_lines(fitted)
    assert "in 241 simulator runs: lr 0.0113, minibatches 6. **Not matched**" in lines[0]
    assert "| clip_frac | 0.0035 | 0.009 | +1.36 |" in lines and "| upclip_pold_lt02 | 0.52 | - | +3.00 |" in lines
    (fitted / "claims.json").write_text("[]")
    assert tiny.simulator_dir(fitted, default) == fitted


def test_the_exploration_axis_names_each_claims_prior_beside_where_its_up_clipped_tokens_sit(tmp_path):
    _pair_runs(tmp_path)  # the exploration prior's clip-higher runs; their up-clipped tokens: 0.7 below 0.2
    def sharp(gain, k):  # the looser bound's first 3 seeds run on: 20% malformed
        return lambda seed, s: {"entropy": 0.5 + (gain + k * _wiggle(seed) if s == STEPS - 1 else 0.0),
                                "clip_up_frac": 0.001, "upclip_pold_lt02": 0.1,
                                "malformed": 0.2 if gain and seed < 3 else 0.0}
    for name, hp, gain, k in (("grpo_beta0_sharpening", {"beta": 0.0}, 0.0, 1),
                              ("grpo_beta0_unclipped_sharpening", {"beta": 0.0, "eps_high": 1e6}, -0.05, 2)):
        _write(tmp_path, name, {"name": "grpo", "hp": hp}, sharp(gain, k), model="tiny_char_sharpening")
    for folder in (tmp_path / "grpo_beta0").glob("seed*"):  # where the exploration prior's up-clipped tokens sit:
        lines = (folder / "metrics.jsonl").read_text().splitlines()  # 0.9 in the first 2 of 20 steps, then 0.3
        (folder / "metrics.jsonl").write_text("\n".join(
            json.dumps({**json.loads(x), "upclip_pold_lt02": 0.9 if i < 2 else 0.3}) for i, x in enumerate(lines))
            + "\n")
    runs = tiny.load_tiny(tmp_path)
    lines = tiny.axis_lines(run_claims(runs), runs, run_set_card(runs))
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| Clip-higher")}  # by regime
    # the looser bound ends 0.05 higher on the exploration prior and 0.05 lower on the sharpening one; the
    # exploration prior's share over its first tenth and its first 100 steps (all 20): (2 * 0.9 + 18 * 0.3) / 20
    assert rows["grpo, beta=0"].endswith("| **reproduced** | exploration | 90% / 36% | grpo_beta0 0/10, "
                                         "grpo_beta0_eps_high028 0/10, grpo_beta0_unclipped 0/10 |")
    # where the looser bound runs on (3 discovery seeds), the discovery set cannot test it; the replication set
    # reads the reversal
    assert rows["grpo, beta=0, explore=sharpening"].endswith(
        "replication: reversed)** | sharpening | 10% / 10% | grpo_beta0_sharpening 0/10, "
        "grpo_beta0_unclipped_sharpening 3/10 |")
    assert "discovery: not testable here" in rows["grpo, beta=0, explore=sharpening"]
    assert "| **not reproduced** | sharpening | 10% / 10% |" in rows["grpo, beta=0, explore=sharpening: mechanism"]
    transient = next(line for line in lines if line.startswith("On the exploration prior"))
    assert "90% of the up-clipped tokens are below pi_old 0.2 over the first tenth of the steps, 36% over" in transient
    steady = (CardValue(0.9, 10), CardValue(0.6, 10))  # most up-clipped tokens below 0.2 throughout: no caveat
    assert tiny.transient_line(steady) == [] and tiny.transient_line((CardValue(0.4, 10), CardValue(0.3, 10))) == []
    assert tiny.axis_lines(RunSet("tiny", ()), [], {}) == ["Not measured: none of clip_higher, cov_entropy, "
                                                       "sapo_temperatures has runs here yet.", ""]


def test_the_claims_the_fit_cannot_predict_are_said_in_advance_from_its_residuals(tmp_path):
    from harness.reports.claim_record import CardCheck, finding
    from spec.regime import CLIP_BINDS, ENTROPY_FALLS
    (tmp_path / "fit.json").write_text(json.dumps({"entries": [
        {"entry": "entropy_relevant_fall", "target": 0.72, "fitted": 0.42, "residual": -2.98},
        {"entry": "clip_frac", "target": 0.0035, "fitted": 0.005, "residual": 0.5}]}))
    misses = tiny.fit_misses(tmp_path)
    assert misses == {"entropy_relevant_fall": -2.98}  # within -1 to 1 is reached
    collapse = finding("grpo", Kind.REPRODUCED, "", conditions=(CardCheck(ENTROPY_FALLS, 0.72, "grpo"),
                                                                CardCheck(CLIP_BINDS, 0.0035, "grpo")))
    clips = finding("grpo", Kind.REPRODUCED, "", conditions=(CardCheck(CLIP_BINDS, 0.0035, "grpo"),))
    assert tiny.said_in_advance(collapse, misses) == "no: the fit misses entropy_relevant_fall (-3.0)"
    assert tiny.said_in_advance(clips, misses) == "yes"
    assert tiny.said_in_advance(finding("dapo", Kind.REPRODUCED, ""), misses) == "yes (no card condition)"
    assert tiny.fit_misses(tmp_path / "none") == {}
    # a fit on the clip ratios per decision token: a miss there is the clip condition's (its across entry)
    assert tiny.said_in_advance(clips, {"decision_clip_frac": 1.52}) == "no: the fit misses decision_clip_frac (+1.5)"


def test_a_stale_sampler_and_a_recomputed_pi_old_are_settings_of_the_run_under_the_simulators_names():
    algo, model = {"name": "sapo"}, {"name": "tiny_char"}
    assert tiny._params(algo, model, {"epochs": 4}) == {}
    assert tiny._params(algo, model, {"staleness": 2}) == {"staleness": 2}  # SAPO at staleness 2: its own regime
    assert tiny._params({"name": "grpo", "hp": {"beta": 0.0}}, {"name": "tiny_char_sharpening"},
                        {"staleness": 2, "old_logp": "policy"}) == {"beta": 0.0, "explore": "sharpening",
                                                                    "staleness": 2, "old_logp": "policy"}


def test_clip_cov_and_kl_cov_pair_with_grpo_at_their_settings_not_at_grpos_defaults():
    import yaml
    params = {}
    for name in ("clip_cov", "kl_cov", "grpo", "grpo_cov_baseline", "clip_cov_sharpening",
                 "grpo_cov_baseline_sharpening"):
        cfg = yaml.safe_load((ROOT / "configs" / "tiny" / f"{name}.yaml").read_text())
        params[name] = tiny._params(cfg["algo"], cfg["model"], cfg["train"])
    assert params["clip_cov"] == params["kl_cov"] == params["grpo_cov_baseline"] != params["grpo"]
    assert params["clip_cov"]["beta"] == 0 and params["clip_cov"]["agg"] == "token_mean"
    assert params["clip_cov_sharpening"] == params["grpo_cov_baseline_sharpening"] == {**params["clip_cov"],
                                                                                       "explore": "sharpening"}


def test_the_attribution_names_the_seeds_that_leave_the_well_formed_regime(tmp_path):
    """A run whose malformed share averages above 3% over 10 consecutive steps (the claims' WELL_FORMED) is named,
    with its seed and value: seed 2 of dcpo_no_sas at 50% on steps 5-14 (mean over 10 steps exactly 0.5); a spike
    of one step at 20% (mean 2% over any 10 steps) is not."""
    _attribution_runs(tmp_path)
    lines = tiny.attribution_lines(tiny.load_tiny(tmp_path))
    assert "Every run of these labels stays well formed (malformed_max <= 0.03 on each)." in lines
    shutil.rmtree(tmp_path / "dcpo_no_sas")
    _write(tmp_path, "dcpo_no_sas", {"name": "dcpo", "advantage": "grpo"},
           lambda seed, s: {"rur": 0.6, "malformed": 0.5 if seed == 2 and 5 <= s < 15 else
                            0.2 if seed == 4 and s == 3 else 0.0})
    line = next(x for x in tiny.attribution_lines(tiny.load_tiny(tmp_path)) if x.startswith("**Outside"))
    assert "dcpo_no_sas in 1 of 10 seeds (seeds 2; up to 50%, seed 2)" in line and "dcpo;" not in line
