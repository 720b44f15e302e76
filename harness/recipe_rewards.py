"""cliplab's verifiable rewards with the signature of a verl custom reward function
(``reward.custom_reward_function.path=harness/recipe_rewards.py``, ``.name=dcpo_score``)."""
from __future__ import annotations

from gpu.rewards import accuracy_reward, dapo_reward, dcpo_format_reward


def dcpo_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """+1 correct, 0 wrong, -1 malformed (DCPO 2509.02333 reward rule)."""
    return dcpo_format_reward(solution_str, str(ground_truth))


def dapo_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """+1 correct, -1 otherwise (DAPO 2503.14476 Sec. 2.4)."""
    return dapo_reward(solution_str, str(ground_truth))


def accuracy_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """1 correct, 0 otherwise."""
    return accuracy_reward(solution_str, str(ground_truth))
