"""NumPy layer: the losses with analytic gradients, advantages, and the simulator built on them."""
import os

# The simulator's matrices are small: BLAS threads only contend with the sweep's worker processes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .advantages import (SmoothAdvantage, dynamic_sampling_filter, gae, gdpo_advantages,  # noqa: E402
                         group_advantages, overlong_penalty, reinforce_pp_advantages)
from .losses import dcpo_bounds, dpo_loss, kl, policy_loss, value_loss

__all__ = ["policy_loss", "dpo_loss", "kl", "dcpo_bounds", "value_loss", "gae", "group_advantages",
           "gdpo_advantages", "SmoothAdvantage", "overlong_penalty", "dynamic_sampling_filter",
           "reinforce_pp_advantages"]
