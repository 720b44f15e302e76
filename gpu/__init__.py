"""Torch layer: the same losses for real models (any float dtype and device), and the real-model harness."""
from .advantages import (SmoothAdvantage, dynamic_sampling_filter, gae, gdpo_advantages, group_advantages,
                         overlong_penalty, reinforce_pp_advantages)
from .losses import dcpo_bounds, dpo_loss, kl, policy_loss, rollout_weights, value_loss

__all__ = ["policy_loss", "dpo_loss", "kl", "dcpo_bounds", "rollout_weights", "value_loss", "gae",
           "group_advantages", "gdpo_advantages", "SmoothAdvantage", "overlong_penalty", "dynamic_sampling_filter",
           "reinforce_pp_advantages"]
