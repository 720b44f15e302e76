"""Step-level conformance (``cliplab conform NAME --level step``): the engine's factor, and each finding reproduced
through the trainer's own code against a gradient derived by hand. With old = new log-probs every ratio is 1 and
no clip is active, so the policy gradient's per-token gradient is -A_i times the weight the trainer's
normalisation gives token (i, t); the hand values below are those weights, from the token and row counts."""
import json
from fractions import Fraction

import numpy as np
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.conform.cases import STEP_ROWS, NotApplicable, StepCheck, shards, step_batch
from harness.conform.step import MICRO, RANKS, factor, load_step_target
from harness.conform.targets import reference as ref


def on_policy(seed, family, rows=STEP_ROWS):
    """A step batch with old_logp = logp (every ratio 1)."""
    b = step_batch(seed, family, rows=rows)
    b.old_logp = b.logp.copy()
    return b


def token_weights(b, rows, denominator):
    """-A_i / denominator on the unmasked tokens of ``rows``, zero elsewhere."""
    out = np.zeros(b.mask.shape)
    out[rows] = -b.adv[rows] * b.mask[rows] / np.asarray(denominator, float).reshape(-1, 1)
    return out


# ---- engine -------------------------------------------------------------------------------------------------------
def test_factor_of_a_scaled_gradient_and_of_a_reweighted_one():
    want = np.array([[1.0, -2.0], [0.5, 0.0]])
    fit = factor(0.75 * want, want)
    assert fit["factor"] == pytest.approx(0.75) and fit["residual"] < 1e-15
    bent = want * np.array([[1.0, 1.0], [2.0, 2.0]])  # row 2 weighted twice: no single factor
    fit = factor(bent, want)
    assert fit["residual"] > 0.1 and fit["rel_diff"] == pytest.approx(0.5 / 2.0)
    assert factor(np.zeros(2), np.zeros(2))["factor"] == 1.0


def test_step_batches_and_shards():
    mixed, masked = step_batch(3, "mixed"), step_batch(3, "masked_rows")
    lens = mixed.mask.sum(1)
    assert lens.min() == 1 and lens.max() == mixed.max_len and len(set(lens)) > 2
    assert (masked.mask.sum(1) == 0).sum() == 2
    assert [[list(m) for m in r] for r in shards(8, 2, 2)] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [len(r) for r in shards(8, None, 2)] == [1, 1]
    with pytest.raises(ValueError, match="micro"):
        shards(8, 3, 1)
    with pytest.raises(ValueError, match="ranks"):
        shards(8, 1, 3)


class HalfTarget:
    """A stand-in trainer whose step gives half the reference gradient on rank counts above one and, with
    micro-batches of one row, weighs the first row twice; it cannot be split into 2 ranks of micro-batches of 4."""
    name, versions, how = "half", {"half": "0"}, "A test double."

    def step_checks(self):
        conv = ref.policy("dapo", agg="token_mean")

        def step(b, micro, ranks):
            if (micro, ranks) == (4, 2):
                raise NotApplicable("no such split")
            grad = conv.fn(b)[1] / ranks
            if micro == 1:
                grad[0] *= 2.0
            return grad, b
        return [StepCheck("dapo", "half()", "a knob", step, conv, note="Halves per rank.")]


def test_step_command_writes_grids_and_findings(tmp_path, monkeypatch, capsys):
    import harness.conform.step as cs
    monkeypatch.setattr(cs, "load_step_target", lambda target, adapter=None: HalfTarget())
    report = cs.step_command("half", out=tmp_path, seeds=2)
    grid = {(c["micro"], c["ranks"]): c for c in report["rows"][0]["grid"]}
    assert grid[("whole", 1)]["status"] == "exact" and grid[(2, 2)]["factor_mean"] == pytest.approx(0.5)
    assert grid[(4, 2)]["status"] == "n/a"
    assert grid[(1, 1)]["status"] == "not proportional"
    page = (tmp_path / "step" / "half.md").read_text()
    assert "| mixed | 2 | not proportional" in page and "| 0.5 | n/a | 0.5 |" in page
    assert json.loads((tmp_path / "step" / "half.json").read_text())["rows"][0]["status"] == "differs"
    findings = (tmp_path / "step" / "README.md").read_text()
    assert "[half](half.md)" in findings and "Halves per rank." in findings
    assert "a knob" in capsys.readouterr().out


def test_cli_level_is_checked():
    runner = CliRunner()
    bad = runner.invoke(app, ["conform", "verl", "--level", "batch"])
    assert bad.exit_code == 2 and "level: expected loss or step" in bad.output
    adapter = runner.invoke(app, ["conform", "verl", "--level", "step", "--adapter", "algorithm=grpo"])
    assert adapter.exit_code == 2 and "adapter: --level step drives a trainer" in adapter.output
    missing = runner.invoke(app, ["conform", "m:f", "--level", "step", "--adapter", "algorithm=grpo"])
    assert missing.exit_code == 2 and "cannot import module 'm'" in missing.output  # a user's step, by name
    loss_only = runner.invoke(app, ["conform", "liger", "--level", "step"])
    assert loss_only.exit_code == 2 and "--level step covers" in loss_only.output and "verl" in loss_only.output
    unknown = runner.invoke(app, ["conform", "nosuch", "--level", "step"])
    assert unknown.exit_code == 2 and "nosuch" in unknown.output and "verl" in unknown.output


# ---- verl ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def verl():
    pytest.importorskip("verl")
    return load_step_target("verl")


def verl_step(verl, mode, loss_mode="vanilla", **cfg):
    from verl.workers.config.actor import PolicyLossConfig
    return verl.run(loss_agg_mode=mode, clip_ratio_c=1e9, policy_loss=PolicyLossConfig(loss_mode=loss_mode), **cfg)


def test_verl_token_mean_is_the_global_token_mean_at_every_split(verl):
    """batch_num_tokens (all-reduced) x dp_size, summed over micro-batches and averaged over ranks: -A_i / N."""
    step = verl_step(verl, "token-mean")
    b = on_policy(1, "mixed")
    want = token_weights(b, np.arange(len(b.mask)), [b.mask.sum()] * len(b.mask))
    for micro in MICRO:
        for ranks in RANKS:
            np.testing.assert_allclose(step(b, micro, ranks)[0], want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("mode, loss_mode, cfg, per_row, name, hp", [
    ("seq-mean-token-mean", "vanilla", {}, "length", "grpo", {"beta": 0.0}),
    ("seq-mean-token-sum", "vanilla", {}, 1, "grpo", {"beta": 0.0, "agg": "seq_mean_token_sum"}),
    ("seq-mean-token-sum-norm", "vanilla", {}, 6, "dr_grpo", {"max_len": 6}),
    ("seq-mean-token-sum-norm", "vanilla", {"loss_scale_factor": 8}, 8, "dr_grpo", {"max_len": 8}),
    ("seq-mean-token-mean", "gspo", {}, "length", "gspo", {})])
def test_verl_seq_means_divide_by_every_row_of_the_mini_batch(verl, mode, loss_mode, cfg, per_row, name, hp):
    """Finding: global_batch_size = ppo_mini_batch_size * rollout.n counts fully masked rows, so with 2 of 8 rows
    masked the mean over sequences divides by 8, not by the 6 rows with tokens: -A_i / (d_i * 8) with d_i the
    row's own divisor (its length, 1, the padded width 6 or loss_scale_factor 8); factor 6 / 8 at every split.
    (On policy GSPO's sequence ratio exp(mean_t log r) has gradient 1 / |o_i| per token, as a token mean.)"""
    step = verl_step(verl, mode, loss_mode, **cfg)
    b = on_policy(2, "masked_rows")
    lens = b.mask.sum(1)
    rows = np.flatnonzero(lens > 0)
    divisor = lens[rows] if per_row == "length" else np.full(len(rows), float(per_row))
    want = token_weights(b, rows, divisor * len(b.mask))
    for micro, ranks in ((1, 2), (None, 1)):
        grad = step(b, micro, ranks)[0]
        np.testing.assert_allclose(grad, want, rtol=1e-12, atol=1e-15)
        reference = ref.policy(name, **hp).fn(b)[1]
        assert factor(grad, reference)["factor"] == pytest.approx(len(rows) / len(b.mask)) == pytest.approx(0.75)


# ---- TRL ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl():
    pytest.importorskip("trl")
    return load_step_target("trl")


def trl_step(trl, spg=Fraction(1), **config):
    from harness.conform.targets.trl import make_trainer
    return trl.run(make_trainer(**config), spg)


def with_ids(b, seed=0):
    from harness.conform.targets.step.trl import with_ids as add
    return add(b, seed)


def test_trl_bnpo_takes_a_token_mean_per_slice(trl):
    """Finding: bnpo divides each slice by its own tokens and by gradient_accumulation_steps: token (i, t) of slice s
    on one of P processes gets -A_i / (P * GA * N_s), not -A_i / N; not proportional when slices differ."""
    step = trl_step(trl, loss_type="bnpo")
    b = with_ids(on_policy(4, "mixed"))
    grad, used = step(b, 2, 2)  # 2 processes x GA 2 slices of 2 rows
    want = np.zeros(b.mask.shape)
    for process in shards(len(b.mask), 2, 2):
        for rows in process:
            want += token_weights(b, rows, [2 * 2 * b.mask[rows].sum()] * len(rows))
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
    assert factor(grad, ref.policy("grpo", beta=0.0, agg="token_mean").fn(used)[1])["residual"] > 1e-2


def test_trl_dapo_num_items_in_batch_is_exact_when_a_generation_is_one_step(trl):
    step = trl_step(trl, loss_type="dapo", epsilon_high=0.28)
    b = with_ids(on_policy(5, "masked_rows"))
    grad, _ = step(b, 1, 2)
    np.testing.assert_allclose(grad, token_weights(b, np.arange(8), [b.mask.sum()] * 8), rtol=1e-4, atol=1e-7)


def test_trl_dapo_with_two_steps_per_generation_divides_by_half_the_generation_tokens(trl):
    """Finding: num_items_in_batch counts the generation batch (two optimisation steps here), rescaled by
    gradient_accumulation_steps / steps_per_generation = 1/2: each step divides by N_gen / 2, not by its own
    tokens N_step, so the factor is 2 N_step / N_gen, which varies from batch to batch."""
    step = trl_step(trl, spg=Fraction(2), loss_type="dapo", epsilon_high=0.28)
    b = with_ids(on_policy(6, "mixed", rows=16))
    grad, used = step(b, 2, 2)
    rows = np.r_[0:4, 8:12]  # each process's first half of its 8-row share
    n_gen, n_step = b.mask.sum(), b.mask[rows].sum()
    np.testing.assert_allclose(grad, token_weights(b, rows, [n_gen / 2] * 8)[rows], rtol=1e-4, atol=1e-7)
    fit = factor(grad, ref.policy("dapo", agg="token_mean").fn(used)[1])
    assert n_step * 2 != n_gen and fit["factor"] == pytest.approx(2 * n_step / n_gen, rel=1e-4)


def test_trl_dapo_with_two_generations_per_step_averages_their_token_means(trl):
    """Finding: with steps_per_generation = gradient_accumulation_steps / 2 each generation batch g divides by
    its own tokens N_g (num_items_in_batch / num_processes * GA / SPG = 2 N_g / P per slice, then DDP's 1 / P):
    token (i, t) of generation g gets -A_i / (2 N_g), the mean of two token means, not -A_i / N."""
    step = trl_step(trl, spg=Fraction(1, 2), loss_type="dapo", epsilon_high=0.28)
    b = with_ids(on_policy(8, "mixed"))
    grad, used = step(b, 1, 2)  # 2 processes x 4 slices of 1 row; generation 0 = slices 0-1 of each process
    want = np.zeros(b.mask.shape)
    for rows in (np.r_[0:2, 4:6], np.r_[2:4, 6:8]):
        want += token_weights(b, rows, [2 * b.mask[rows].sum()] * len(rows))
    assert b.mask[0:2].sum() + b.mask[4:6].sum() != b.mask[2:4].sum() + b.mask[6:8].sum()
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
    assert factor(grad, ref.policy("dapo", agg="token_mean").fn(used)[1])["residual"] > 1e-2
    with pytest.raises(NotApplicable):
        step(b, None, 1)  # one accumulation step cannot hold two generation batches


@pytest.mark.parametrize("config, per_row, name, hp", [
    ({"loss_type": "grpo"}, "length", "grpo", {"beta": 0.0}),
    ({"loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4, "importance_sampling_level": "sequence"},
     "length", "gspo", {}),
    ({"loss_type": "dr_grpo"}, 8, "dr_grpo", {"max_len": 8})])
def test_trl_sequence_means_count_masked_rows(trl, config, per_row, name, hp):
    """Finding (also at loss level): grpo's mask.sum(-1).clamp(min=1) and dr_grpo's per_token_loss.size(0) keep
    fully masked rows in each slice's row count: -A_i / (d_i * 8) with d_i = |o_i| or max_completion_length 8,
    2 of 8 rows masked: a factor 6 / 8 at every split."""
    step = trl_step(trl, **config)
    b = with_ids(on_policy(7, "masked_rows"))
    lens = b.mask.sum(1)
    rows = np.flatnonzero(lens > 0)
    divisor = lens[rows] if per_row == "length" else np.full(len(rows), float(per_row))
    grad, used = step(b, 1, 2)
    np.testing.assert_allclose(grad, token_weights(b, rows, divisor * 8), rtol=1e-4, atol=1e-7)
    assert factor(grad, ref.policy(name, **hp).fn(used)[1])["factor"] == pytest.approx(0.75, rel=1e-4)


# ---- OpenRLHF -----------------------------------------------------------------------------------------------------
def test_openrlhf_sample_level_loss_divides_by_the_rows_with_tokens():
    """OpenRLHF's step normalisers (non-empty rows over every rank, / gas) give -A_i / (|o_i| * rows with tokens)
    at every split: no factor where verl and TRL give 6 / 8."""
    from conftest import target_worker
    target_worker("openrlhf").close()  # skips when the environment is not built
    openrlhf = load_step_target("openrlhf")
    step = openrlhf.run(token_level_loss=False)
    b = on_policy(2, "masked_rows")
    lens = b.mask.sum(1)
    rows = np.flatnonzero(lens > 0)
    want = token_weights(b, rows, lens[rows] * len(rows))
    for micro, ranks in ((1, 2), (2, 1), (None, 2)):
        np.testing.assert_allclose(step(b, micro, ranks)[0], want, rtol=1e-12, atol=1e-15)
    openrlhf.worker.close()
