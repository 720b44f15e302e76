"""The conformance engine on user callables: verdicts, shrinking, what a target matches, reports, bad input."""
import json
import textwrap

import numpy as np
import pytest
from conftest import importable_module

from harness.conform.engine import conform, conform_command, markdown, shrink, strict_json
from harness.conform.cases import TOLERANCE, Batch
from harness.conform.targets import BUILTIN, load_target
from harness.conform.targets import reference as ref

MODULE = textwrap.dedent('''
    import torch

    def token_mean_dapo(log_prob, old_log_prob, advantages, response_mask):
        """DAPO's clip (0.2 / 0.28) averaged over all tokens of the batch, as the libraries do."""
        r = torch.exp(log_prob - old_log_prob)
        loss = -torch.min(r * advantages, torch.clamp(r, 0.8, 1.28) * advantages)
        return (loss * response_mask).sum() / response_mask.sum().clamp(min=1)

    def paper_grpo(logp, old_logp, adv, mask):
        """GRPO without KL: per-sequence token means, averaged over non-empty sequences."""
        r = torch.exp(logp - old_logp)
        loss = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv) * mask
        lens = mask.sum(1)
        keep = lens > 0
        return (loss.sum(1)[keep] / lens[keep]).mean() if keep.any() else loss.sum() * 0

    def as_tuple(logp, old_logp, adv, mask):
        return (paper_grpo(logp, old_logp, adv, mask), {"metric": 1.0})

    def two_args(x, y):
        return x

    def returns_text(logp, old_logp, adv, mask):
        return "loss"

    NOT_CALLABLE = 3
''')


@pytest.fixture(scope="module", autouse=True)
def user_module(tmp_path_factory):
    with importable_module(tmp_path_factory.mktemp("usercode"), "cliplab_user_losses", MODULE):
        yield


def test_a_paper_grpo_callable_agrees_and_a_tuple_is_unpacked():
    for name in ("paper_grpo", "as_tuple"):
        report = conform(f"cliplab_user_losses:{name}", seeds=8, adapter="algorithm=grpo,beta=0")
        assert {r["status"] for r in report["rows"]} == {"agrees"}
        assert all(r["loss_diff"] <= TOLERANCE and r["grad_diff"] <= TOLERANCE for r in report["rows"])


def test_a_token_mean_dapo_is_found_to_match_token_mean_not_eq_8():
    report = conform("cliplab_user_losses:token_mean_dapo", seeds=6, adapter="algorithm=dapo")
    typical = next(r for r in report["rows"] if r["family"] == "typical")
    assert typical["status"] == "differs" and typical["reference"] == "dapo"
    assert "dapo[agg=token_mean]" in typical["matches"]
    minimal = typical["minimal"]
    # token_mean and group_token_mean differ only with two groups whose token counts differ: at least 2 rows and
    # 3 tokens, and the shrinker gets there
    assert minimal["rows"] == 2 and minimal["tokens"] == 3
    assert abs(minimal["reference_exact"] - minimal["reference"]) < 1e-12
    assert abs(minimal["target"] - minimal["reference"]) > TOLERANCE


def test_without_a_claimed_algorithm_the_engine_names_what_the_callable_computes():
    report = conform("cliplab_user_losses:token_mean_dapo", seeds=3)
    assert all(r["status"] == "no reference" for r in report["rows"])
    assert all("dapo[agg=token_mean]" in r["matches"] for r in report["rows"])


def test_shrink_keeps_the_difference_and_only_removes():
    target = load_target("cliplab_user_losses:token_mean_dapo", "algorithm=dapo")
    check = target.checks()[0]
    from harness.conform.cases import batch_of
    batch = next(b for b in (batch_of(s, "typical") for s in range(50))
                 if abs(check.run(b)[0] - check.reference.fn(b)[0]) > 1e-3)
    small = shrink(check, batch, check.reference)
    assert small.mask.sum() <= batch.mask.sum() and len(small.mask) <= len(batch.mask)
    assert abs(check.run(small)[0] - check.reference.fn(small)[0]) > TOLERANCE


def test_conform_command_writes_markdown_and_json(tmp_path, capsys):
    report = conform_command("cliplab_user_losses:token_mean_dapo", json_out=True, out=tmp_path, seeds=4,
                             adapter="algorithm=dapo")
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"] == json.loads(json.dumps(strict_json(report["rows"])))
    md = (tmp_path / "cliplab_user_losses_token_mean_dapo.md").read_text()
    assert "matches dapo[agg=token_mean]" in md and "Minimal input" in md
    assert json.loads((tmp_path / "cliplab_user_losses_token_mean_dapo.json").read_text())["target"] == \
        report["target"]
    assert markdown(report) == md


@pytest.mark.parametrize("target, adapter, words", [
    ("no_such_module_xyz:f", None, "cannot import module 'no_such_module_xyz'"),
    ("cliplab_user_losses:missing", None, "has no callable 'missing'"),
    ("cliplab_user_losses:NOT_CALLABLE", None, "has no callable 'NOT_CALLABLE'"),
    ("cliplab_user_losses:two_args", None, "wrong signature two_args(x, y)"),
    ("cliplab_user_losses:returns_text", None, "expected a callable f(logp, old_logp, adv, mask"),
    ("cliplab_user_losses:paper_grpo", "algorithm=grpo,agg=token_sum", "unknown aggregation mode 'token_sum'"),
    ("cliplab_user_losses:paper_grpo", "algorithm=nope", "unknown algorithm 'nope'"),
    ("cliplab_user_losses:paper_grpo", "logp=log_prob", "has no parameter 'log_prob'"),
    ("cliplab_user_losses:paper_grpo", "colour=red", "unknown key 'colour'"),
    ("cliplab_user_losses:paper_grpo", "eps_high=0.28", "need algorithm=NAME"),
    ("cliplab_user_losses:paper_grpo", "algorithm=grpo,eps_low=-1", "eps_low: expected a number >= 0"),
    ("megatron", None, f"unknown target 'megatron'; expected one of {', '.join(BUILTIN)} or module:function"),
    ("", None, f"expected one of {', '.join(BUILTIN)} or module:function"),
    ("verl", "algorithm=grpo", "only a module:function target takes an adapter"),
])
def test_bad_input_names_what_was_expected(target, adapter, words):
    with pytest.raises(ValueError) as err:
        load_target(target, adapter)
    assert words in str(err.value)


@pytest.mark.parametrize("seeds", [0, -3, 2.5, True])
def test_a_bad_seed_count_is_refused(seeds):
    with pytest.raises(ValueError, match="seeds: expected a positive integer"):
        conform_command("cliplab_user_losses:paper_grpo", seeds=seeds)


def test_reference_rows_counted_variant_differs_only_with_empty_rows():
    b = Batch(np.array([[-1.0], [-1.0]]), np.array([[-1.2], [-1.0]]), np.array([[1.0], [1.0]]),
              np.array([[1.0], [0.0]]), np.zeros((2, 1)), 1)
    full = ref.policy_value("grpo", {"beta": 0.0}, b)[0]
    counted = ref.policy_value("grpo", {"beta": 0.0}, b, rows_counted=True)[0]
    assert counted == pytest.approx(full / 2)


def test_minimal_input_shows_the_batch_extras():
    b = Batch(np.array([[-1.0]]), np.array([[-1.5]]), np.array([[1.0]]), np.array([[1.0]]), np.zeros((1, 1)), 1,
              {"rollout_logp": np.array([[-2.5]]), "ids": np.array([[7]])})
    out = b.to_json()
    assert out["rollout_logp"] == [[-2.5]] and out["ids"] == [[7]] and isinstance(out["ids"][0][0], int)
    assert json.loads(json.dumps(out))["old_logp"] == [[-1.5]]
