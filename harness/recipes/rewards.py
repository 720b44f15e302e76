"""cliplab's verifiable rewards with the signature of a verl custom reward function
(``reward.custom_reward_function.path=harness/recipes/rewards.py``, ``.name=dcpo_score``).

Each returns ``{"score": reward, "acc": 1.0 | 0.0}``: verl trains on the score and logs ``acc`` (its validation
``val-core/<source>/acc/mean@N`` is then the accuracy whatever the reward scheme; DAPO's group filter reads it).
"""
from __future__ import annotations

from gpu.rewards import accuracy_reward, dapo_reward, dcpo_format_reward


def _scored(reward, solution_str, ground_truth) -> dict:
    gold = str(ground_truth)
    return {"score": reward(solution_str, gold), "acc": accuracy_reward(solution_str, gold)}


def dcpo_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """+1 correct, 0 wrong, -1 malformed (DCPO 2509.02333 reward rule)."""
    return _scored(dcpo_format_reward, solution_str, ground_truth)


def dapo_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """+1 correct, -1 otherwise (DAPO 2503.14476 Sec. 2.4)."""
    return _scored(dapo_reward, solution_str, ground_truth)


def accuracy_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """1 correct, 0 otherwise (Dr.GRPO 2503.20783's 1/0 reward)."""
    return _scored(accuracy_reward, solution_str, ground_truth)
