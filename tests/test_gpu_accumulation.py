"""Gradient accumulation over micro-batches of whole groups, weighted by agg_units, equals the full batch."""
import pytest
import torch

import gpu
from gpu.aggregation import agg_units
from harness.verify.cases import make_case
from spec.registry import AGG_MODES


@pytest.mark.parametrize("agg", list(AGG_MODES))
@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo", "dcpo"])
def test_weighted_micro_batches_add_up_to_the_batch(name, agg):
    case = make_case(5, prompts=4, group_size=3, length=6, extreme=False)
    case.mask[4] = 0  # an empty row
    case.mask[9:12] = 0  # an empty group
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    kw = dict(group_size=3, agg=agg, max_len=6)
    full = t(case.logp).requires_grad_(True)
    loss, _ = gpu.policy_loss(name, full, t(case.old_logp), t(case.adv), t(case.mask), ref_logp=t(case.ref_logp),
                              **kw)
    loss.backward()
    acc = t(case.logp).requires_grad_(True)
    total = agg_units(t(case.mask), agg, 3)
    for rows in (slice(0, 3), slice(3, 9), slice(9, 12)):  # unequal micro-batches of whole groups
        m = t(case.mask[rows])
        part, _ = gpu.policy_loss(name, acc[rows], t(case.old_logp[rows]), t(case.adv[rows]), m,
                                  ref_logp=t(case.ref_logp[rows]), **kw)
        (part * agg_units(m, agg, 3) / total).backward()
    torch.testing.assert_close(acc.grad, full.grad, rtol=1e-12, atol=1e-15)
