"""Simulator settings: defaults per environment and algorithm, ``--set`` parsing and validation with clear errors."""
from __future__ import annotations

import itertools
import json

from spec.contract import resolve_hparams
from spec.registry import ALGORITHMS, HPARAMS, POLICY_ALGORITHMS

ENVS = ("bandit", "toy_lm", "feature_lm")
REWARD_SCHEMES = {  # reward of (CORRECT, WRONG, MALFORMED)
    "binary": (1.0, 0.0, 0.0),  # Dr.GRPO, GRPO: 1 / 0
    "pm1": (1.0, -1.0, -1.0),  # DAPO: +1 / -1
    "ternary": (1.0, 0.0, -1.0),  # DCPO: +1 correct, 0 wrong but well formed, -1 malformed
}
RANDOM_REWARD = "random"  # 1 or 0 with probability 1/2, independent of the response (Park et al. 2509.26114)
ADVANTAGES = ("grpo", "dr_grpo", "sas", "gae")
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "sas")

#: Settings every run has, with their meaning (shown in errors). None = chosen per algorithm or environment.
SETTINGS = {
    "n_prompts": (128, "prompts in the pool"),
    "batch_prompts": (16, "prompts per step (P)"),
    "group_size": (8, "responses per prompt (G)"),
    "difficulty_low": (None, "initial logit of the hardest prompt's correct answer"),
    "difficulty_high": (None, "initial logit of the easiest prompt's correct answer"),
    "env_seed": (0, "seed of the environment (answers, difficulties, initial policy)"),
    "optimizer": ("adam", "adam or sgd"),
    "lr": (0.03, "learning rate of the policy logits"),
    "momentum": (0.0, "SGD momentum"),
    "critic_lr": (0.1, "learning rate of PPO's tabular critic (Adam)"),
    "epochs": (2, "passes over each rollout"),
    "minibatches": (2, "minibatches per pass (split by whole groups)"),
    "reward": (None, "reward scheme: " + ", ".join(REWARD_SCHEMES)),
    "adv": (None, "advantage estimator: " + ", ".join(ADVANTAGES)),
    "adv_eps": (1e-6, "eps in GRPO's (R - mean) / (std + eps)"),
    "adv_unbiased": (True, "unbiased group std in GRPO's advantage"),
    "dynamic_sampling": (None, "DAPO dynamic sampling: keep groups with 0 < #correct < G and refill"),
    "ds_max_rounds": (8, "generation rounds per step allowed to fill the batch"),
    "ds_oversample": (1.0, "prompts drawn per generation round, as a multiple of batch_prompts"),
    "overlong": (None, "DAPO soft overlong punishment (Eq. 13) added to the reward"),
    "overlong_cache": (4, "DAPO L_cache, in tokens"),
    "overlong_filter": (False, "mask truncated responses out of the loss"),
    "gamma": (1.0, "GAE discount"),
    "lam": (0.95, "GAE lambda"),
    "vf_clip": (0.2, "PPO value clip"),
    "reward_kl": (0.0, "PPO: coefficient of the k1 KL penalty folded into the per-token reward"),
    "staleness": (0, "rollouts come from the policy this many steps back (asynchronous training)"),
    "eval_every": (None, "exact metrics every this many steps (and at the last step)"),
}
ENV_SETTINGS = {
    "bandit": {"n_arms": (8, "arms per prompt")},
    "toy_lm": {"max_len": (16, "generation budget T (also Dr.GRPO's constant L)"),
               "n_think": (2, "filler tokens"), "n_answers": (4, "answer tokens")},
    "feature_lm": {"max_len": (8, "generation budget T (also Dr.GRPO's constant L)"),
                   "vocab": (128, "tokens, EOS included"), "answer_len": (4, "answer tokens K before EOS"),
                   "n_correct": (2, "acceptable tokens per answer position"),
                   "forks": (2, "forking positions per prompt (the dominant token is wrong there)"),
                   "n_features": (32, "random context features of the log-linear policy"),
                   "zipf": (1.1, "Zipf exponent of the prior over the vocabulary"),
                   "confidence": (2.0, "prior logit of each context's dominant token (the Zipf head has 0)")},
}
#: Integer settings and their least value, and real ones with their range, of the keys added for feature_lm.
NEW_INTS = {"staleness": 0, "eval_every": 1, "vocab": 8, "answer_len": 1, "n_correct": 1, "forks": 0,
            "n_features": 1}
NEW_REALS = {"zipf": (0.0, 10.0), "confidence": (0.0, 50.0)}
ENV_DIFFICULTY = {"bandit": (-4.0, 3.0), "toy_lm": (-6.0, 4.0), "feature_lm": (-8.0, 4.0)}
ENV_DEFAULTS = {"bandit": {"eval_every": 1}, "toy_lm": {"eval_every": 1},
                "feature_lm": {"n_prompts": 256, "eval_every": 5, "staleness": 2, "epochs": 1, "minibatches": 8,
                               "overlong_cache": 2}}
ALGO_SETTINGS = {
    "ppo": {"reward": "binary", "adv": "gae"},
    "grpo": {"reward": "binary", "adv": "grpo"},
    "dr_grpo": {"reward": "binary", "adv": "dr_grpo"},
    "dapo": {"reward": "pm1", "adv": "grpo", "dynamic_sampling": True, "overlong": True},
    "gspo": {"reward": "binary", "adv": "grpo"},
    "gspo_token": {"reward": "binary", "adv": "grpo"},
    "dcpo": {"reward": "ternary", "adv": "sas"},
    "sapo": {"reward": "binary", "adv": "grpo"},
    "dpo": {"reward": "binary"},
}
LOSS_KEYS = tuple(k for k in HPARAMS if k != "max_len")


def known_keys(env: str) -> list[str]:
    """Every key ``--set`` accepts for ``env``."""
    check_env(env)
    return sorted(set(SETTINGS) | set(ENV_SETTINGS[env]) | set(LOSS_KEYS))


def check_env(env: str) -> None:
    if env not in ENVS:
        raise ValueError(f"env: unknown environment {env!r}; expected one of {', '.join(ENVS)}")


def check_algo(algo: str) -> None:
    if algo not in ALGORITHMS:
        raise ValueError(f"algos: unknown algorithm {algo!r}; expected one of {', '.join(ALGORITHMS)}")


def resolve(env: str, algo: str, overrides: dict | None = None) -> dict:
    """The full settings of one run: defaults, then the algorithm's, then ``overrides``; every value checked."""
    check_env(env)
    check_algo(algo)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(known_keys(env)))
    if unknown:
        raise ValueError(f"set: unknown key(s) {', '.join(unknown)} for env {env!r}; expected among "
                         f"{', '.join(known_keys(env))}")
    cfg = {k: v for k, (v, _) in SETTINGS.items()}
    cfg.update({k: v for k, (v, _) in ENV_SETTINGS[env].items()})
    cfg["difficulty_low"], cfg["difficulty_high"] = ENV_DIFFICULTY[env]
    cfg.update(ENV_DEFAULTS[env])
    cfg["dynamic_sampling"], cfg["overlong"] = False, False
    cfg.update(ALGO_SETTINGS.get(algo, {"reward": "binary", "adv": "grpo"}))  # a new registry algorithm
    if env == "bandit":
        cfg["max_len"], cfg["overlong"] = 1, False
    loss_over = {k: overrides.pop(k) for k in LOSS_KEYS if k in overrides}
    cfg.update(overrides)
    _check(env, algo, cfg)
    if algo in POLICY_ALGORITHMS:
        loss = resolve_hparams(algo, {**loss_over, "max_len": cfg["max_len"]})
    else:
        extra = sorted(set(loss_over) - {"beta"})
        if extra:
            raise ValueError(f"set: dpo takes only beta among the loss settings, got {', '.join(extra)}")
        loss = {"beta": loss_over.get("beta", ALGORITHMS["dpo"].defaults["beta"])}
        if not (isinstance(loss["beta"], (int, float)) and loss["beta"] > 0):
            raise ValueError(f"beta: expected a number > 0, got {loss['beta']!r}")
    cfg["loss"] = loss
    return cfg


def _check(env, algo, cfg):
    for key in ("n_prompts", "batch_prompts", "group_size", "epochs", "minibatches", "ds_max_rounds", "max_len",
                "overlong_cache", *(k for k in ENV_SETTINGS[env] if k not in NEW_INTS and k not in NEW_REALS)):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{key}: expected a positive integer, got {v!r}")
    _check_new(env, cfg)
    if cfg["batch_prompts"] > cfg["n_prompts"]:
        raise ValueError(f"batch_prompts: expected at most n_prompts ({cfg['n_prompts']}), got {cfg['batch_prompts']}")
    if cfg["minibatches"] > cfg["batch_prompts"]:
        raise ValueError(f"minibatches: expected at most batch_prompts ({cfg['batch_prompts']}) since a minibatch "
                         f"holds whole groups, got {cfg['minibatches']}")
    if cfg["reward"] not in REWARD_SCHEMES and cfg["reward"] != RANDOM_REWARD:
        raise ValueError(f"reward: expected one of {', '.join([*REWARD_SCHEMES, RANDOM_REWARD])}, "
                         f"got {cfg['reward']!r}")
    if algo != "dpo" and cfg["adv"] not in ADVANTAGES:
        raise ValueError(f"adv: expected one of {', '.join(ADVANTAGES)}, got {cfg['adv']!r}")
    needs_group = (algo == "dpo" and "preference pairs") or (cfg["adv"] in GROUP_ADVANTAGES and
                                                              f"the {cfg['adv']} advantage")
    if needs_group and cfg["group_size"] < 2:
        raise ValueError(f"group_size: {algo} ({needs_group}) needs G >= 2 responses per prompt, "
                         f"got {cfg['group_size']}")
    for key in ("dynamic_sampling", "overlong", "overlong_filter", "adv_unbiased"):
        if not isinstance(cfg[key], bool):
            raise ValueError(f"{key}: expected true or false, got {cfg[key]!r}")
    if cfg["overlong"] and cfg["overlong_cache"] > cfg["max_len"]:
        raise ValueError(f"overlong_cache: expected at most max_len ({cfg['max_len']}), got {cfg['overlong_cache']}")
    if isinstance(cfg["ds_oversample"], bool) or not isinstance(cfg["ds_oversample"], (int, float)) \
            or not cfg["ds_oversample"] >= 1:
        raise ValueError(f"ds_oversample: expected a number >= 1, got {cfg['ds_oversample']!r}")
    for key in ("lr", "critic_lr", "vf_clip"):
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], (int, float)) or not cfg[key] > 0:
            raise ValueError(f"{key}: expected a number > 0, got {cfg[key]!r}")
    for key in ("gamma", "lam"):
        if not isinstance(cfg[key], (int, float)) or not 0 <= cfg[key] <= 1:
            raise ValueError(f"{key}: expected a number in [0, 1], got {cfg[key]!r}")
    if not isinstance(cfg["reward_kl"], (int, float)) or cfg["reward_kl"] < 0:
        raise ValueError(f"reward_kl: expected a number >= 0, got {cfg['reward_kl']!r}")
    if cfg["optimizer"] not in ("adam", "sgd"):
        raise ValueError(f"optimizer: expected 'adam' or 'sgd', got {cfg['optimizer']!r}")
    if not cfg["difficulty_low"] <= cfg["difficulty_high"]:
        raise ValueError(f"difficulty_low: expected <= difficulty_high ({cfg['difficulty_high']}), "
                         f"got {cfg['difficulty_low']}")


def _check_new(env, cfg):
    """Type, range and finiteness of the keys added with feature_lm (staleness, eval_every, the environment's)."""
    for key in (k for k in cfg if k in NEW_INTS):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < NEW_INTS[key]:
            raise ValueError(f"{key}: expected an integer >= {NEW_INTS[key]}, got {v!r}")
    for key in (k for k in cfg if k in NEW_REALS):
        v, (lo, hi) = cfg[key], NEW_REALS[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise ValueError(f"{key}: expected a finite number in [{lo:g}, {hi:g}], got {v!r}")
    if env == "feature_lm":
        if cfg["max_len"] < cfg["answer_len"] + 1:
            raise ValueError(f"max_len: expected at least answer_len + 1 ({cfg['answer_len'] + 1}), "
                             f"got {cfg['max_len']!r}")
        if cfg["n_correct"] > cfg["vocab"] - 2:
            raise ValueError(f"n_correct: expected at most vocab - 2 ({cfg['vocab'] - 2}), got {cfg['n_correct']}")
        if cfg["forks"] > cfg["answer_len"]:
            raise ValueError(f"forks: expected at most answer_len ({cfg['answer_len']}), got {cfg['forks']}")


def parse_value(text: str):
    """A ``--set`` value: JSON (numbers, true/false/null), Python's True/False/None, else the string itself."""
    word = {"True": True, "False": False, "None": None}.get(text)
    if word is not None or text == "None":
        return word
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_sets(sets: list[str] | None) -> dict[str, list]:
    """``["lr=0.01,0.05", "epochs=2"]`` -> ``{"lr": [0.01, 0.05], "epochs": [2]}`` (commas make a grid)."""
    grid: dict[str, list] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise ValueError(f"set: expected key=value (or key=v1,v2 for a grid), got {item!r}")
        if key in grid:
            raise ValueError(f"set: key {key!r} given twice; give its values once as {key}=v1,v2")
        grid[key] = [parse_value(v.strip()) for v in value.split(",")]
    return grid


def grid_points(grid: dict[str, list]) -> list[dict]:
    """Every combination of the grid's values (one empty point for an empty grid)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
