"""User callables past the loss call: rollout corrections' weights (kind=rollout_correction), a user's training step
(--level step with a module:function) and a float32 GSPO loss. Each published bug is written in its buggy and its
fixed form: the buggy one differs with a finding (or a matched step) that names it, the fixed one agrees."""
import textwrap

import pytest
from conftest import conform_report, failing, importable_module

from harness.conform.engine import run_check
from harness.conform.targets.callable import CallableTarget, parse_adapter

MODULE = textwrap.dedent('''
    import math

    import torch

    def _log_rho(old_logp, rollout_logp, mask):
        return torch.where(mask > 0, old_logp - rollout_logp, torch.zeros_like(old_logp))

    def _mis(log_w, mask):
        rho = torch.exp(log_w)
        return torch.where((rho >= 0.5) & (rho <= 5.0), rho, torch.zeros_like(rho)).expand_as(mask) * mask

    def seq_mis_product(old_logp, rollout_logp, mask):
        """IcePop's sequence weight as the product of the token ratios: exp of the row's sum of log-ratios."""
        return _mis(_log_rho(old_logp.detach(), rollout_logp, mask).sum(-1, keepdim=True), mask)

    def seq_mis_geometric(old_logp, rollout_logp, mask):
        """The geometric mean: exp of the mean log-ratio over the row's tokens."""
        lens = mask.sum(-1, keepdim=True).clamp(min=1)
        return _mis(_log_rho(old_logp.detach(), rollout_logp, mask).sum(-1, keepdim=True) / lens, mask)

    def seq_mis_geometric_over_padding(old_logp, rollout_logp, mask):
        """The mean log-ratio over the padded width: padding counted in the length."""
        return _mis(_log_rho(old_logp.detach(), rollout_logp, mask).mean(-1, keepdim=True), mask)

    def seq_mis_sum_of_ratios(old_logp, rollout_logp, mask):
        """The sequence weight as the sum of the token ratios."""
        rho = torch.where(mask > 0, torch.exp(old_logp.detach() - rollout_logp), torch.zeros_like(old_logp))
        return _mis(torch.log(rho.sum(-1, keepdim=True)), mask)

    def tis_not_detached(old_logp, rollout_logp, mask):
        """min(rho, 2) from log-probs that carry gradient: the weight is differentiated too."""
        return torch.clamp(torch.exp(_log_rho(old_logp, rollout_logp, mask)), max=2.0)

    def tis(old_logp, rollout_logp, mask):
        return torch.clamp(torch.exp(_log_rho(old_logp, rollout_logp, mask)), max=2.0).detach()

    def tis_as_floor(old_logp, rollout_logp, mask):
        """The cap on the wrong side: clamp(min=C)."""
        return torch.clamp(torch.exp(_log_rho(old_logp, rollout_logp, mask)), min=2.0).detach()

    def mis_with_rejection_mask(old_log_prob, rollout_log_probs, response_mask):
        """verl's shape: token IS weights and a mask of the tokens kept."""
        rho = torch.exp(_log_rho(old_log_prob, rollout_log_probs, response_mask)).detach()
        return rho, ((rho >= 0.5) & (rho <= 5.0)).to(rho.dtype) * response_mask, {"metrics": 0}

    def _clipped(logp, old_logp, adv):
        r = torch.exp(logp - old_logp)
        return -torch.min(r * adv, torch.clamp(r, 0.8, 1.28) * adv)

    def dapo_step(logp, old_logp, adv, mask, num_items_in_batch, num_processes, gradient_accumulation_steps,
                  steps_per_generation):
        """A token mean over the optimisation step: the generation batch's tokens per process, scaled by
        gradient_accumulation_steps / steps_per_generation (TRL's fix)."""
        normaliser = num_items_in_batch / num_processes * gradient_accumulation_steps / steps_per_generation
        return (_clipped(logp, old_logp, adv) * mask).sum() / normaliser

    def dapo_step_generation_normaliser(logp, old_logp, adv, mask, num_items_in_batch, num_processes):
        """The generation batch's tokens per process, whatever the steps per generation (TRL before its fix)."""
        return (_clipped(logp, old_logp, adv) * mask).sum() / (num_items_in_batch / num_processes)

    def dapo_step_divided_again(logp, old_logp, adv, mask, num_items_in_batch, num_processes,
                                gradient_accumulation_steps, steps_per_generation):
        """A loss already normalised over the step, divided by the accumulation steps again."""
        return dapo_step(logp, old_logp, adv, mask, num_items_in_batch, num_processes,
                         gradient_accumulation_steps, steps_per_generation) / gradient_accumulation_steps

    def dapo_step_ranks_mean_kept(logp, old_logp, adv, mask, num_items_in_batch):
        """The global token count on each rank, under DDP's mean over the ranks."""
        return (_clipped(logp, old_logp, adv) * mask).sum() / num_items_in_batch

    def dapo_step_micro_batch_mean(logp, old_logp, adv, mask, gradient_accumulation_steps):
        """Each micro-batch's own token mean, divided by the accumulation steps (TRL's bnpo)."""
        return (_clipped(logp, old_logp, adv) * mask).sum() / mask.sum().clamp(min=1) / gradient_accumulation_steps

    def _gspo(logp, old_logp, adv, mask, guarded):
        logp, old_logp, adv, mask = (x.float() for x in (logp, old_logp, adv, mask))
        lens = mask.sum(-1)
        log_s = ((logp - old_logp) * mask).sum(-1) / lens.clamp(min=1)
        a = (adv * mask).sum(-1) / lens.clamp(min=1)
        if guarded:  # bounded where the clip wins anyway: the same loss and gradient, no overflow
            log_s = torch.where(a >= 0, log_s.clamp(max=math.log1p(4e-4)), log_s.clamp(min=math.log1p(-3e-4)))
        s = torch.exp(log_s)
        per_seq = -torch.min(s * a, s.clamp(1 - 3e-4, 1 + 4e-4) * a)
        return (per_seq * (lens > 0)).sum() / (lens > 0).sum().clamp(min=1)

    def gspo_float32(logp, old_logp, adv, mask):
        """GSPO in float32 with exp of the sequence log-ratio unbounded: inf past 88.7."""
        return _gspo(logp, old_logp, adv, mask, guarded=False)

    def gspo_float32_guarded(logp, old_logp, adv, mask):
        return _gspo(logp, old_logp, adv, mask, guarded=True)
''')


@pytest.fixture(scope="module")
def user():
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as folder, importable_module(Path(folder), "cliplab_user_steps", MODULE):
        import cliplab_user_steps
        yield cliplab_user_steps


def report_of(fn, adapter: str, seeds: int = 2) -> dict:
    return conform_report(fn, adapter, seeds)


SEQ_MIS = "kind=rollout_correction,correction=seq_mis"


@pytest.mark.parametrize("fn, claimed, other", [("seq_mis_product", "geometric", "product"),
                                                 ("seq_mis_geometric", "product", "geometric")])
def test_a_sequence_weight_of_the_other_convention_is_named(user, fn, claimed, other):
    bad = failing(report_of(getattr(user, fn), f"{SEQ_MIS},seq_weight={claimed}"))
    # float64 and float32 (bfloat16's tolerance holds no weight to the reference)
    assert {knob for knob, _ in bad} == {f"seq_mis[{claimed}], float64", f"seq_mis[{claimed}], float32"}
    assert all(r["closest"].startswith(f"seq_mis[{other}]") for r in bad.values())
    assert report_of(getattr(user, fn), f"{SEQ_MIS},seq_weight={other}")["ok"]


@pytest.mark.parametrize("fn, adapter, words", [
    ("seq_mis_geometric_over_padding", f"{SEQ_MIS},seq_weight=geometric", "padding counted in the length"),
    ("seq_mis_sum_of_ratios", SEQ_MIS, "sum of the token ratios"),
    ("tis_as_floor", "kind=rollout_correction,correction=tis", "cap on the wrong side: max(rho, 2)"),
])
def test_a_sequence_weight_or_cap_formed_wrongly_is_named(user, fn, adapter, words):
    bad = failing(report_of(getattr(user, fn), adapter))
    assert bad and all(words in r["closest"] for r in bad.values())


def test_weights_not_detached_are_named_and_detached_ones_agree(user):
    bad = failing(report_of(user.tis_not_detached, "kind=rollout_correction,correction=tis"))
    assert {knob for knob, _ in bad} == {"tis, float64", "tis, float32"}
    for row in bad.values():
        assert row["findings"][0]["name"].startswith("weights not detached: gradient flows through them")
        assert row["grad_diff"] > 0.1 and row["loss_diff"] <= row["tolerance"]  # the weights, and a gradient
    assert report_of(user.tis, "kind=rollout_correction,correction=tis")["ok"]
    from harness.conform.engine import assert_conforms  # the claim as the algorithm, as for the other kinds
    assert_conforms(user.tis, "tis", kind="rollout_correction", seeds=1)
    with pytest.raises(AssertionError, match="weights not detached"):
        assert_conforms(user.tis_not_detached, "tis", kind="rollout_correction", seeds=1)


def test_weights_with_a_kept_token_mask_are_multiplied(user):
    adapter = "kind=rollout_correction,correction=mis,kept=1"
    assert report_of(user.mis_with_rejection_mask, adapter)["ok"]
    bad = failing(report_of(user.mis_with_rejection_mask, "kind=rollout_correction,correction=mis"))
    assert bad and all("returns" not in r["closest"] for r in bad.values())  # without it: weights uncut


@pytest.mark.parametrize("adapter, words", [
    ("kind=rollout_correction", "kind=rollout_correction needs correction=NAME"),
    ("kind=rollout_correction,correction=tsi", "did you mean 'tis'"),
    ("kind=rollout_correction,correction=tis,seq_weight=geometric", "seq_weight applies to correction=seq_mis"),
    (f"{SEQ_MIS},seq_weight=mean", "seq_weight='mean'; expected product or geometric"),
    ("kind=rollout_correction,correction=tis,mis_low=0.5", "mis_low is not read by correction=tis"),
    ("kind=rollout_correction,correction=tis,tis_cap=-1", "tis_cap"),
    ("kind=rollout_correction,correction=mis,kept=0", "kept=0; expected the index"),
    ("kind=step,algorithm=dapo", "kind=step is checked with --level step"),
])
def test_rollout_correction_adapter_errors_are_one_line(adapter, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")) as err:
        parse_adapter(adapter)
    assert "\n" not in str(err.value)


# ---- a user's training step ----------------------------------------------------------------------------------

DAPO = "algorithm=dapo,agg=token_mean,eps_high=0.28"


def step_rows(fn, knob: int) -> list[dict]:
    """The rows (both step families) of one knob of a user's step, in float64: 0, steps_per_generation =
    gradient_accumulation_steps; 3, twice that (1, 2, 4, 5: in float32 and bfloat16)."""
    from harness.conform.kinds_step import UserStep
    from harness.conform.step import run_step_check
    target = UserStep(fn, DAPO)
    try:
        return run_step_check(target.step_checks()[knob], seeds=1)
    finally:
        target.close()


def test_a_step_loss_divided_again_by_the_accumulation_steps_is_named(user):
    for row in step_rows(user.dapo_step_divided_again, 0):
        assert row["status"] == "differs"
        assert row["matches"] == ["loss divided again by gradient_accumulation_steps (factor 1 / "
                                  "gradient_accumulation_steps)"]
        for cell in row["grid"]:  # micro-batches per rank: 8 rows / ranks / micro (the whole share: one)
            accumulation = 1 if cell["micro"] == "whole" else 8 // cell["ranks"] // cell["micro"]
            assert cell["status"] == ("exact" if accumulation == 1 else "scaled")
            if accumulation > 1:
                assert cell["factor_mean"] == pytest.approx(1 / accumulation, rel=1e-9)


def test_a_generation_batch_normaliser_is_off_by_accumulation_over_steps_per_generation(user):
    assert all(r["status"] == "agrees" for r in step_rows(user.dapo_step_generation_normaliser, 0))
    for row in step_rows(user.dapo_step_generation_normaliser, 3):
        assert row["matches"] == [next(m for m in row["matches"] if m.startswith("normaliser of the generation "
                                                                                "batch"))]
        assert {c["status"] for c in row["grid"]} == {"scaled"}
        assert all(c["factor_mean"] == pytest.approx(0.5, rel=1e-9) for c in row["grid"])


def test_a_global_count_not_scaled_by_the_ranks_is_named(user):
    for row in step_rows(user.dapo_step_ranks_mean_kept, 0):
        assert row["matches"] == [next(m for m in row["matches"] if m.startswith("the ranks' mean not undone"))]
        for cell in row["grid"]:
            assert cell["status"] == ("exact" if cell["ranks"] == 1 else "scaled")
            assert cell.get("factor_mean", 1.0) == pytest.approx(1 / cell["ranks"], rel=1e-9)


def test_a_micro_batch_token_mean_is_named_where_the_step_needs_a_global_one(user):
    rows = step_rows(user.dapo_step_micro_batch_mean, 0)
    for row in rows:
        assert row["matches"] == ["a token_mean per micro-batch (each normalised by its own count, divided by "
                                  "gradient_accumulation_steps) instead of the step's token_mean"]
        whole_share = [c for c in row["grid"] if c["micro"] == "whole" and c["ranks"] == 1]
        assert whole_share[0]["status"] == "exact"  # one micro-batch on one rank is the step
        assert "not proportional" in {c["status"] for c in row["grid"]}


def test_the_fixed_step_agrees_at_every_split_through_the_command(user, capsys):
    from harness.conform.step import step_command
    report = step_command(user.dapo_step, seeds=1, adapter=DAPO)
    assert report["ok"] and len(report["rows"]) == 12  # 2 knobs x 3 dtypes x 2 families
    assert capsys.readouterr().out.count("agrees at every split") == 12


def test_a_step_adapter_names_what_is_wrong(user):
    from harness.conform.kinds_step import UserStep
    from harness.conform.step import conform_step
    target = UserStep(user.dapo_step, f"kind=step,{DAPO},num_items_in_batch=num_items_in_batch")
    target.close()
    assert target.counts["num_items_in_batch"] == "num_items_in_batch" and target.algorithm == "dapo"
    with pytest.raises(ValueError, match="algorithm=NAME is required"):
        conform_step("cliplab_user_steps:dapo_step", seeds=1, adapter="agg=token_mean")
    with pytest.raises(ValueError, match="not kind=kl"):
        conform_step("cliplab_user_steps:dapo_step", seeds=1, adapter="kind=kl,kl=k1")


# ---- low precision on the policy path -----------------------------------------------------------------------

def test_a_float32_gspo_exponent_that_overflows_is_caught(user):
    for fn, ok in ((user.gspo_float32, False), (user.gspo_float32_guarded, True)):
        target = CallableTarget(fn, "algorithm=gspo")
        try:
            check = target.checks()[0]
            assert check.dtype == "float32"
            check.families = ("extreme",)  # log-ratios up to 100: exp(88.7) is float32's largest
            row = run_check(check, seeds=30)[0]
        finally:
            target.close()
        assert (row["kind"] == "agrees") == ok
        if not ok:
            assert row["findings"][0]["name"].startswith("returns NaN in the value and the gradient where the "
                                                         "reference is finite")
