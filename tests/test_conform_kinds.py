"""User callables of kind advantage and kl: published bugs in advantage estimators and KL terms, each written in
its buggy and its fixed form, differ with the convention they follow named, and agree once fixed."""
import textwrap

import pytest
from conftest import conform_report, failing, importable_module

from harness.conform.engine import conform_command
from harness.conform.targets.callable import parse_adapter

MODULE = textwrap.dedent('''
    import torch

    def _groups(rewards, group_index):
        return [group_index == g for g in torch.unique(group_index)]

    def grpo(rewards, group_index):
        """GRPO's (R - mean) / (std + 1e-6) per group id; a NaN or inf reward left out (advantage 0)."""
        out = torch.zeros_like(rewards)
        for rows in _groups(rewards, group_index):
            r = rewards[rows].double()
            ok = torch.isfinite(r)
            if ok.sum() > 1:
                live = r[ok]
                std = live.std()
                part = torch.zeros_like(r)
                part[ok] = torch.where(std > 0, (live - live.mean()) / (std + 1e-6), torch.zeros_like(live))
                out[rows] = part.to(rewards.dtype)
        return out

    def grpo_nan_poisons_group(rewards, group_index):
        """NaN rewards go into the group's mean and std."""
        out = torch.zeros_like(rewards)
        for rows in _groups(rewards, group_index):
            r = rewards[rows].double()
            if len(r) > 1:
                out[rows] = ((r - r.mean()) / (r.std() + 1e-6)).to(rewards.dtype)
        return out

    def grpo_std_flag_ignored(rewards, group_index, norm_adv_by_std=True):
        """norm_adv_by_std is read nowhere: R - mean."""
        out = torch.zeros_like(rewards)
        for rows in _groups(rewards, group_index):
            r = rewards[rows]
            ok = torch.isfinite(r)
            part = torch.zeros_like(r)
            part[ok] = r[ok] - r[ok].mean()
            out[rows] = part
        return out

    def grpo_fixed_stride(rewards, group_index):
        """Groups taken as B / (number of ids) contiguous rows: a partial group shifts every later one."""
        n = len(torch.unique(group_index))
        r = torch.where(torch.isfinite(rewards), rewards, torch.zeros_like(rewards)).view(n, len(rewards) // n)
        return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1)

    def _stride_grpo(rewards, group_size, wide):
        r = rewards.view(-1, group_size)
        if wide:
            r = r.double()
        ok = torch.isfinite(r)
        n = ok.sum(1, keepdim=True)
        mean = torch.where(ok, r, 0.0).sum(1, keepdim=True) / n.clamp_min(1)
        std = (torch.where(ok, r - mean, 0.0) ** 2).sum(1, keepdim=True).div((n - 1).clamp_min(1)).sqrt()
        out = torch.where(ok & (n > 1), (r - mean) / (std + 1e-6), 0.0)
        return out.reshape(-1).to(rewards.dtype)

    def grpo_in_input_dtype(rewards, group_size):
        """Statistics in the rewards' dtype: a constant float32 group's mean is an ulp off, its std 1e-8."""
        return _stride_grpo(rewards, group_size, wide=False)

    def grpo_in_float64(rewards, group_size):
        return _stride_grpo(rewards, group_size, wide=True)

    def _rloo(rewards, group_index, lone_zero):
        ok = torch.isfinite(rewards)
        scores = torch.where(ok, rewards, torch.zeros_like(rewards)).double()
        inv = torch.unique(group_index, return_inverse=True)[1]
        c = torch.bincount(inv, weights=ok.double())[inv]
        total = torch.bincount(inv, weights=scores)[inv]
        loo = (c * scores - total) / (c - 1).clamp_min(1)
        lone = torch.zeros_like(scores) if lone_zero else scores
        return (torch.where(c > 1, loo, lone) * ok).to(rewards.dtype)

    def rloo_vectorized(rewards, group_index):
        """(c r - sum) / (c - 1) * (c > 1): a lone response gets 0."""
        return _rloo(rewards, group_index, lone_zero=True)

    def rloo(rewards, group_index):
        """A lone response keeps its reward (the mean of no others taken as 0)."""
        return _rloo(rewards, group_index, lone_zero=False)

    def _reinforce_pp_returns(rewards, mask):
        """Each row's reward at its last unmasked token, summed back over the row (gamma = 1); a non-finite reward
        leaves its row out."""
        ok = torch.isfinite(rewards)
        on = (mask > 0) & ok[:, None]
        last = on & (on.flip(1).cumsum(1).flip(1) == 1)
        token_r = torch.where(last, torch.where(ok, rewards, 0.0)[:, None].expand_as(mask), torch.zeros_like(mask))
        return token_r.flip(1).cumsum(1).flip(1) * on, on

    def reinforce_pp_whiten_one_token(rewards, mask, group_size):
        """Whitened by torch.var over the batch's tokens: NaN when a single token is unmasked."""
        ret, on = _reinforce_pp_returns(rewards, mask)
        vals = ret[on]
        return torch.where(on, (ret - vals.mean()) / torch.sqrt(vals.var() + 1e-8), torch.zeros_like(ret))

    def reinforce_pp(rewards, mask, group_size):
        """The variance of a single value taken as 0."""
        ret, on = _reinforce_pp_returns(rewards, mask)
        vals = ret[on]
        var = vals.var() if len(vals) > 1 else vals.new_zeros(())
        return torch.where(on, (ret - vals.mean()) / torch.sqrt(var + 1e-8), torch.zeros_like(ret))

    def k1_pathwise(log_prob, ref_log_prob):
        """A k1 penalty backpropagated as is: gradient 1 per token."""
        return log_prob - ref_log_prob

    def k1_plus(log_prob, ref_log_prob):
        """k1's value with k2's gradient (logp - ref_logp), straight through."""
        k2 = 0.5 * (log_prob - ref_log_prob) ** 2
        return (log_prob - ref_log_prob).detach() + k2 - k2.detach()
''')


@pytest.fixture(scope="module")
def user():
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as folder, importable_module(Path(folder), "cliplab_user_estimators",
                                                                     MODULE):
        import cliplab_user_estimators
        yield cliplab_user_estimators


def report_of(fn, adapter: str, seeds: int = 3) -> dict:
    return conform_report(fn, adapter, seeds)


def test_rloo_with_lone_responses_zeroed_is_named_and_the_loop_form_agrees(user):
    bad = failing(report_of(user.rloo_vectorized, "kind=advantage,estimator=rloo"))
    assert "lone" in {family for _, family in bad} <= {"lone", "ragged"}  # ragged: where a group is cut to one
    assert all("lone responses zeroed" in r["closest"] for r in bad.values())
    assert report_of(user.rloo, "kind=advantage,estimator=rloo")["ok"]


def test_an_ignored_std_flag_is_named_std_not_applied(user):
    bad = failing(report_of(user.grpo_std_flag_ignored, "kind=advantage,estimator=grpo"))
    assert bad and all("std not applied" in r["closest"] for r in bad.values())
    assert report_of(user.grpo, "kind=advantage,estimator=grpo")["ok"]


def test_nan_rewards_poisoning_the_group_are_named(user):
    bad = failing(report_of(user.grpo_nan_poisons_group, "kind=advantage,estimator=grpo"))
    assert {family for _, family in bad} == {"nonfinite"}
    for row in bad.values():
        assert row["findings"][0]["name"].startswith("returns NaN in the value where the reference is finite")
        assert "non-finite rewards propagated" in row["closest"]
    assert report_of(user.grpo, "kind=advantage,estimator=grpo")["ok"]  # a NaN or inf reward left out


def test_partial_groups_on_a_fixed_stride_are_named(user):
    bad = failing(report_of(user.grpo_fixed_stride, "kind=advantage,estimator=grpo"))
    ragged = [r for (_, family), r in bad.items() if family == "ragged"]
    assert ragged and all("fixed-stride groups" in r["closest"] for r in ragged)
    assert report_of(user.grpo, "kind=advantage,estimator=grpo")["ok"]  # by group id


def test_whitening_a_single_token_with_nan_is_caught(user):
    bad = failing(report_of(user.reinforce_pp_whiten_one_token, "kind=advantage,estimator=reinforce_pp", seeds=2))
    assert {family for _, family in bad} == {"one_token"}
    assert all(r["findings"][0]["name"].startswith("returns NaN in the value where the reference is finite")
               for r in bad.values())
    assert report_of(user.reinforce_pp, "kind=advantage,estimator=reinforce_pp", seeds=2)["ok"]


def test_float32_std_noise_on_constant_groups_differs_only_in_float32(user):
    bad = failing(report_of(user.grpo_in_input_dtype, "kind=advantage,estimator=grpo", seeds=1))
    assert ("float32", "groups") in bad and {dtype for dtype, _ in bad} == {"float32"}  # bfloat16 passes: its
    # tolerance (32) holds no value to the reference
    minimal = bad["float32", "groups"]["findings"][0]["minimal_input"]
    rewards = [row[0] for row in minimal["input"]["adv"]]
    assert len(set(rewards)) == 1 and len(rewards) > 1  # one constant group shows it
    assert max(abs(v) for row in minimal["target"] for v in row) > 1e-3
    assert report_of(user.grpo_in_float64, "kind=advantage,estimator=grpo", seeds=1)["ok"]


def test_a_pathwise_k1_penalty_is_named_and_k1_plus_agrees(user, capsys):
    report = conform_command("cliplab_user_estimators:k1_pathwise", seeds=2, adapter="kind=kl,kl=k1")
    bad = failing(report)
    assert {knob for knob, _ in bad} == {"kl=k1, float64", "kl=k1, float32"}  # bfloat16's tolerance passes it
    assert all("k1 pathwise: zero expected gradient" in r["closest"] for r in bad.values())
    out = capsys.readouterr().out
    assert "closest known convention: k1 pathwise" in out
    assert report_of(user.k1_plus, "kind=kl,kl=k1", seeds=2)["ok"]
    # each row is held to its own dtype's tolerance, in the console and in a baseline's growth rule (not bfloat16's)
    from harness.conform.baseline import findings_of
    from harness.conform.cases import tolerance_of
    said = {line.split("tolerance ")[1].split(",")[0] for line in out.splitlines() if "(tolerance " in line}
    assert said == {f"{tolerance_of('float64'):g}", f"{tolerance_of('float32'):g}"}
    assert {(e["knob"], e["tolerance"]) for e in findings_of(report)} == {
        ("kl=k1, float64", tolerance_of("float64")), ("kl=k1, float32", tolerance_of("float32"))}


def test_assert_conforms_takes_the_claim_as_its_algorithm(user):
    from harness.conform.engine import assert_conforms
    assert_conforms(user.rloo, "rloo", kind="advantage", seeds=1)
    with pytest.raises(AssertionError, match="lone responses zeroed"):
        assert_conforms(user.rloo_vectorized, "rloo", kind="advantage", seeds=1)


@pytest.mark.parametrize("adapter, words", [
    ("kind=value", "unknown kind 'value'"),
    ("kind=advantage", "kind=advantage needs estimator=NAME"),
    ("kind=advantage,estimator=sas", "estimator=sas keeps a per-prompt history"),
    ("kind=advantage,estimator=rlo", "did you mean 'rloo'"),
    ("kind=kl", "kind=kl needs kl=NAME"),
    ("kind=kl,kl=k1,agg=token_mean", "unknown key 'agg' for kind=kl"),
    ("kind=kl,kl=k1,algorithm=k3", "algorithm='k3' and kl='k1' disagree"),
])
def test_adapter_errors_of_the_kinds_are_one_line(adapter, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")) as err:
        parse_adapter(adapter)
    assert "\n" not in str(err.value)
