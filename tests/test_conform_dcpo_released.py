"""DCPO's released code (lime-RL/DCPO) as a named reference convention: a callable written from its documented
formulas (shared/reference/anchors.md) is reported as matching "DCPO's released code"; the paper's version agrees."""
import textwrap

import pytest
from conftest import importable_module

from harness.conform.engine import conform, verdict
from harness.conform.targets import reference as ref
from spec.registry import RELEASED, dcpo_released_hparams

MODULE = textwrap.dedent('''
    import torch

    def _bounds(q, eps_low, eps_high, cap):
        """DCPO Eq. 21-27: roots of |(r - 1) r q| = eps around r = 1; the upper one capped."""
        lo = 0.5 + 0.5 * torch.sqrt(torch.clamp(1 - 4 * eps_low / q, min=0.0))
        hi = torch.clamp(0.5 + 0.5 * torch.sqrt(1 + 4 * eps_high / q), max=cap)
        return lo, hi

    def _token_loss(logp, old_logp, adv, eps_low, eps_high, c):
        r = torch.exp(logp - old_logp)
        lo, hi = _bounds(torch.exp(old_logp), eps_low, eps_high, max(c, 10.0))
        loss = -torch.min(r * adv, torch.clamp(r, lo, hi) * adv)  # clamp keeps r's gradient at an exact tie
        return torch.where(adv < 0, torch.min(loss, -c * adv), loss)  # dual clip for A < 0

    def released(log_prob, old_log_prob, advantages, response_mask):
        """The released DCPO script: eps 0.2 / 0.28, clip_ratio_c 10, only-token-mean over the whole batch."""
        loss = _token_loss(log_prob, old_log_prob, advantages, 0.2, 0.28, 10.0) * response_mask
        return loss.sum() / response_mask.sum().clamp(min=1)

    def paper(logp, old_logp, adv, mask, group_size):
        """DCPO Eq. 8 (OTM): per-response token means summed in each group, averaged over non-empty groups."""
        loss = _token_loss(logp, old_logp, adv, 0.16, 0.2, 10.0) * mask
        lens = mask.sum(1)
        per_row = loss.sum(1) / lens.clamp(min=1)
        groups = per_row.reshape(-1, group_size).sum(1)
        live = lens.reshape(-1, group_size).sum(1) > 0
        return groups[live].sum() / live.sum().clamp(min=1)
''')


@pytest.fixture(scope="module", autouse=True)
def user_module(tmp_path_factory):
    with importable_module(tmp_path_factory.mktemp("dcpo_code"), "cliplab_dcpo_code", MODULE):
        yield


def test_the_released_settings_follow_clip_ratio_c():
    assert dcpo_released_hparams(3.0) == {"eps_low": 0.2, "eps_high": 0.28, "r_max": 10.0, "dual_clip": 3.0,
                                          "agg": "token_mean"}
    assert dcpo_released_hparams(12.0)["r_max"] == 12.0  # the cap is max(clip_ratio_c, 10)
    assert dict(RELEASED["dcpo"]["hp"]) == dcpo_released_hparams(10.0)


def test_the_released_setting_is_named_whichever_way_it_is_written():
    assert ref.label("dcpo", dict(RELEASED["dcpo"]["hp"])).startswith("DCPO's released code (dcpo[")
    spelled = {"agg": "token_mean", "eps_low": 0.2, "eps_high": 0.28}  # r_max 10 and dual clip 10 by default
    assert ref.is_released("dcpo", spelled) and not ref.is_released("dcpo", {**spelled, "dual_clip": 3.0})
    assert ref.label("dcpo", {}) == "dcpo" and not ref.is_released("dapo", spelled)


def test_a_callable_written_as_the_released_code_matches_it():
    report = conform("cliplab_dcpo_code:released", seeds=6, adapter="algorithm=dcpo")
    for row in report["rows"]:
        assert row["kind"] == "differs"
        assert [m for m in row["matches"] if m.startswith("DCPO's released code")], verdict(row)
    assert "matches DCPO's released code (dcpo[agg=token_mean" in verdict(report["rows"][0])


def test_claiming_the_released_setting_agrees():
    report = conform("cliplab_dcpo_code:released", seeds=4,
                     adapter="algorithm=dcpo,eps_low=0.2,eps_high=0.28,agg=token_mean")
    assert {r["kind"] for r in report["rows"]} == {"agrees"}
    assert report["rows"][0]["reference"].startswith("DCPO's released code")


def test_the_papers_version_agrees():
    report = conform("cliplab_dcpo_code:paper", seeds=6, adapter="algorithm=dcpo")
    assert {r["kind"] for r in report["rows"]} == {"agrees"}
    assert report["rows"][0]["reference"] == "dcpo"
