"""The papers' published numbers that the cluster reports print beside the measured ones, keyed by
(recipe, run) of ``configs/recipes``. Values are fractions (AIME24 38.8 is 0.388)."""
from __future__ import annotations

DCPO_T1 = "DCPO 2509.02333 Table 1 (Qwen2.5-Math-7B, AIME24 Avg@32)"
DCPO_T2 = "DCPO 2509.02333 Table 2 (average RUR over 400 steps)"
DAPO_T1 = "DAPO 2503.14476 Table 1 (Qwen2.5-32B, AIME24 avg@32)"

#: (recipe, run) -> {cliplab metric: (value, citation)}; ``accuracy`` is the AIME24 avg@32 of the validation set.
PUBLISHED: dict[tuple[str, str], dict[str, tuple[float, str]]] = {
    ("dcpo_math7b", "grpo"): {"accuracy": (0.321, DCPO_T1), "rur": (0.438, DCPO_T2)},
    ("dcpo_math7b", "dapo"): {"accuracy": (0.316, DCPO_T1)},
    ("dcpo_math7b", "gspo"): {"accuracy": (0.349, DCPO_T1), "rur": (0.456, DCPO_T2)},
    ("dcpo_math7b", "dcpo"): {"accuracy": (0.388, DCPO_T1), "rur": (0.718, DCPO_T2)},
    ("dapo_ladder_32b", "naive_grpo"): {"accuracy": (0.30, DAPO_T1)},
    ("dapo_ladder_32b", "overlong_filter"): {"accuracy": (0.36, DAPO_T1)},
    ("dapo_ladder_32b", "clip_higher"): {"accuracy": (0.38, DAPO_T1)},
    ("dapo_ladder_32b", "soft_overlong"): {"accuracy": (0.41, DAPO_T1)},
    ("dapo_ladder_32b", "token_level"): {"accuracy": (0.42, DAPO_T1)},
    ("dapo_ladder_32b", "dynamic_sampling"): {"accuracy": (0.50, DAPO_T1)},
}


def published(recipe: str | None, run: str | None) -> dict[str, tuple[float, str]]:
    """The published numbers of one recipe run ({} when the paper gives none)."""
    return PUBLISHED.get((recipe, run), {})
