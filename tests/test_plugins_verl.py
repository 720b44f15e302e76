"""cliplab's losses and SAS through verl's own registries: get_policy_loss_fn / get_adv_estimator_fn return
functions whose values are cliplab's (exact spec), with verl's settings read from its ActorConfig."""
import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos")
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn  # noqa: E402

import gpu  # noqa: E402
import spec  # noqa: E402
from gpu.integrations import verl_plugin  # noqa: E402
from harness.verify.cases import make_case  # noqa: E402
from harness.conform.targets.verl import actor_config  # noqa: E402
from harness.verify.layers import scaled_diff  # noqa: E402

#: cliplab loss name -> (algorithm, verl config that sets the paper's widths, hp the reference gets).
PAPER = {
    "cliplab_dcpo": ("dcpo", {"clip_ratio_low": 0.16, "clip_ratio_high": 0.2}, {}),
    "cliplab_dcpo_seq_mean_token_sum": ("dcpo", {"clip_ratio_low": 0.16, "clip_ratio_high": 0.2},
                                        {"agg": "seq_mean_token_sum"}),
    "cliplab_sapo": ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, {}),
    "cliplab_gspo": ("gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, {}),
    "cliplab_gspo_token": ("gspo_token", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, {}),
    "cliplab_dr_grpo": ("dr_grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}, {}),
    "cliplab_dapo": ("dapo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {}),
    "cliplab_dapo_token_mean": ("dapo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {"agg": "token_mean"}),
}


def t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


def verl_call(loss_mode, case, **cfg):
    config = actor_config(rollout_n=case.group_size, **cfg)
    logp = t(case.logp, grad=True)
    loss, metrics = get_policy_loss_fn(loss_mode)(t(case.old_logp), logp, t(case.adv), t(case.mask) > 0,
                                                  "token-mean", config)
    loss.backward()
    return float(loss.detach()), logp.grad.numpy(), metrics


@pytest.mark.parametrize("loss_mode", list(PAPER))
def test_verls_entry_point_returns_cliplabs_exact_values(loss_mode):
    name, cfg, hp = PAPER[loss_mode]
    for seed in range(4):
        case = make_case(7000 + seed, length=3, prompts=2, group_size=2)
        loss, grad, metrics = verl_call(loss_mode, case, **cfg)
        e_loss, e_grad = spec.policy_loss(name, case.logp, case.old_logp, case.adv, case.mask,
                                          group_size=case.group_size, max_len=case.max_len, **hp)
        assert scaled_diff(loss, float(e_loss)) < 1e-9
        assert scaled_diff(grad, e_grad.astype(float)) < 1e-9
        assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0


def test_every_algorithm_and_aggregation_is_registered():
    names = verl_plugin.register()
    for alg in spec.registry.POLICY_ALGORITHMS:
        assert f"cliplab_{alg}" in names
        for agg in spec.registry.AGG_MODES:
            assert get_policy_loss_fn(f"cliplab_{alg}_{agg}") is verl_plugin._LOSS_FNS[f"cliplab_{alg}_{agg}"]
    assert verl_plugin.register() == names  # registering twice is harmless


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "group_token_mean"])
def test_micro_batches_with_global_batch_info_add_up_to_the_whole_batch(agg):
    case = make_case(11, prompts=4, group_size=2, length=4)
    case.mask[:, 0] = 1.0  # no empty rows, so every micro-batch has tokens
    whole, whole_grad, _ = verl_call(f"cliplab_dapo_{agg}", case)
    parts, grads = 0.0, []
    for rows in (slice(0, 4), slice(4, 8)):
        sub = make_case(11, prompts=4, group_size=2, length=4)
        sub.mask[:, 0] = 1.0
        for field in ("logp", "old_logp", "adv", "mask"):
            setattr(sub, field, getattr(sub, field)[rows])
        config = {"global_batch_info": {"dp_size": 1, "batch_num_tokens": float(case.mask.sum()),
                                        "global_batch_size": len(case.mask)}}
        loss, grad, _ = verl_call(f"cliplab_dapo_{agg}", sub, **config)
        parts += loss
        grads.append(grad)
    assert parts == pytest.approx(whole, rel=1e-12)
    assert np.concatenate(grads) == pytest.approx(whole_grad, rel=1e-12)


def test_sas_through_verls_registry_keeps_history_per_prompt_key():
    sas = get_adv_estimator_fn(verl_plugin.SAS_NAME)
    reference = gpu.SmoothAdvantage()
    mask = torch.ones(4, 3)
    for visit, rewards in enumerate(([1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0])):
        scores = torch.zeros(4, 3, dtype=torch.float64)
        scores[:, -1] = torch.tensor(rewards, dtype=torch.float64)
        uids = np.array([f"b{visit}", f"a{visit}", f"b{visit}", f"a{visit}"], dtype=object)  # new at every step
        adv, ret = sas(scores, mask, uids, prompt_keys=["b", "a", "b", "a"])  # groups need not be contiguous
        want = reference(["b", "a"], torch.tensor([rewards[0], rewards[2], rewards[1], rewards[3]],
                                                  dtype=torch.float64), 2)
        got = adv[[0, 2, 1, 3], 0]
        assert got.numpy() == pytest.approx(want.numpy())
        assert torch.equal(adv, ret)
    assert (adv[:, 0] != 0).any()  # the all-equal third visit still trains (A_total / i)
    with pytest.raises(ValueError, match="no stable prompt key"):
        sas(scores, mask, uids)


def test_bad_settings_are_clear_errors():
    case = make_case(3, prompts=1, group_size=3, length=2)
    with pytest.raises(ValueError, match="needs whole groups of 2"):
        verl_call_with_rollout("cliplab_dapo", case, 2)
    with pytest.raises(ValueError, match="rollout correction"):
        get_policy_loss_fn("cliplab_grpo")(t(case.old_logp), t(case.logp), t(case.adv), t(case.mask),
                                           "token-mean", actor_config(), rollout_is_weights=t(case.mask))
    with pytest.raises(ValueError, match="Unsupported loss mode: cliplab_nope"):
        get_policy_loss_fn("cliplab_nope")


def verl_call_with_rollout(loss_mode, case, rollout_n):
    config = actor_config(rollout_n=rollout_n)
    return get_policy_loss_fn(loss_mode)(t(case.old_logp), t(case.logp), t(case.adv), t(case.mask), "token-mean",
                                         config)
