"""Simulator settings: defaults per environment and algorithm, ``--set`` parsing and validation with clear errors."""
from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass

from spec.contract import resolve_hparams
from spec.regime import EXPLORE_SETTINGS
from spec.registry import ALGORITHMS, HPARAMS, POLICY_ALGORITHMS, ROLLOUT_READS
from spec.schema import Rule, did_you_mean


ENVS = ("bandit", "toy_lm", "feature_lm")
REWARD_SCHEMES = {  # reward of (CORRECT, WRONG, MALFORMED)
    "binary": (1.0, 0.0, 0.0),  # Dr.GRPO, GRPO: 1 / 0
    "pm1": (1.0, -1.0, -1.0),  # DAPO: +1 / -1
    "ternary": (1.0, 0.0, -1.0),  # DCPO: +1 correct, 0 wrong but well formed, -1 malformed
}
RANDOM_REWARD = "random"  # 1 or 0 with probability 1/2, independent of the response (Park et al. 2509.26114)
ADVANTAGES = ("grpo", "dr_grpo", "rloo", "gpg", "sas", "gae")
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo", "gpg", "sas")

#: Settings every run has: (default, meaning shown in errors, Rule: type, range, finiteness). Default None = chosen
#: per algorithm or environment. Adding a setting is one line here (or in ENV_SETTINGS).
SETTINGS = {
    "n_prompts": (128, "prompts in the pool", Rule(int, ge=1, le=10 ** 5)),
    "batch_prompts": (16, "prompts per step (P)", Rule(int, ge=1, le=10 ** 5)),
    "group_size": (8, "responses per prompt (G)", Rule(int, ge=1, le=4096)),
    "difficulty_low": (None, "initial logit of the hardest prompt's correct answer", Rule(float, ge=-100, le=100)),
    "difficulty_high": (None, "initial logit of the easiest prompt's correct answer", Rule(float, ge=-100, le=100)),
    "env_seed": (0, "seed of the environment (answers, difficulties, initial policy)", Rule(int, ge=0, le=2 ** 32 - 1)),
    "optimizer": ("adam", "adam or sgd", Rule(str, choices=("adam", "sgd"))),
    "lr": (0.03, "learning rate of the policy logits", Rule(float, gt=0, le=10)),
    "momentum": (0.0, "SGD momentum", Rule(float, ge=0, lt=1)),
    "critic_lr": (0.1, "learning rate of PPO's tabular critic (Adam)", Rule(float, gt=0, le=10)),
    "epochs": (2, "passes over each rollout", Rule(int, ge=1, le=1000)),
    "minibatches": (2, "minibatches per pass (split by whole groups)", Rule(int, ge=1, le=10 ** 5)),
    "reward": (None, "reward scheme: " + ", ".join([*REWARD_SCHEMES, RANDOM_REWARD]),
               Rule(str, choices=(*REWARD_SCHEMES, RANDOM_REWARD))),
    "adv": (None, "advantage estimator: " + ", ".join(ADVANTAGES), Rule(str, choices=ADVANTAGES, optional=True)),
    "adv_eps": (1e-6, "eps in GRPO's (R - mean) / (std + eps)", Rule(float, gt=0, le=1)),
    "adv_unbiased": (True, "unbiased group std in GRPO's advantage", Rule(bool)),
    "dynamic_sampling": (None, "DAPO dynamic sampling: keep groups with 0 < #correct < G and refill", Rule(bool)),
    "ds_max_rounds": (8, "generation rounds per step allowed to fill the batch", Rule(int, ge=1, le=1000)),
    "ds_oversample": (1.0, "prompts drawn per generation round, as a multiple of batch_prompts",
                      Rule(float, ge=1, le=100)),
    "overlong": (None, "DAPO soft overlong punishment (Eq. 13) added to the reward", Rule(bool)),
    "overlong_cache": (4, "DAPO L_cache, in tokens", Rule(int, ge=1, le=4096)),
    "overlong_filter": (False, "mask truncated responses out of the loss", Rule(bool)),
    "gamma": (1.0, "GAE discount", Rule(float, ge=0, le=1)),
    "lam": (0.95, "GAE lambda", Rule(float, ge=0, le=1)),
    "vf_clip": (0.2, "PPO value clip", Rule(float, gt=0, le=1e3)),
    "reward_kl": (0.0, "PPO: coefficient of the k1 KL penalty folded into the per-token reward",
                  Rule(float, ge=0, le=1e3)),
    "staleness": (0, "rollouts come from the policy this many steps back (asynchronous training)",
                  Rule(int, ge=0, le=1000)),
    "eval_every": (None, "exact metrics every this many steps (and at the last step)", Rule(int, ge=1, le=10 ** 6)),
    "rollout_noise": (0.0, "rollout/trainer mismatch: the rollout policy's parameters plus N(0, s^2) noise per step; "
                           "the loss gets the trainer's old_logp and the engine's rollout_logp",
                      Rule(float, ge=0, le=100)),
}
ENV_SETTINGS = {
    "bandit": {"n_arms": (8, "arms per prompt", Rule(int, ge=2, le=4096))},
    "toy_lm": {"max_len": (16, "generation budget T (also Dr.GRPO's constant L)", Rule(int, ge=3, le=1024)),
               "n_think": (2, "filler tokens", Rule(int, ge=1, le=256)),
               "n_answers": (4, "answer tokens", Rule(int, ge=1, le=256))},
    "feature_lm": {"max_len": (8, "generation budget T (also Dr.GRPO's constant L)", Rule(int, ge=2, le=1024)),
                   "vocab": (128, "tokens, EOS included", Rule(int, ge=8, le=10 ** 5)),
                   "answer_len": (4, "answer tokens K before EOS", Rule(int, ge=1, le=256)),
                   "n_correct": (2, "acceptable tokens per answer position", Rule(int, ge=1, le=10 ** 5)),
                   "forks": (2, "forking positions per prompt (the dominant token is wrong there)",
                             Rule(int, ge=0, le=256)),
                   "n_features": (32, "random context features of the log-linear policy", Rule(int, ge=1, le=4096)),
                   "zipf": (1.1, "Zipf exponent of the prior over the vocabulary", Rule(float, ge=0, le=10)),
                   "confidence": (2.0, "prior logit of each context's dominant token (the Zipf head has 0)",
                                  Rule(float, ge=0, le=50)),
                   "offtrack_eos": (4.0, "prior logit of EOS above the dominant token in the off-track context at "
                                         "the answer's end (one more per later position): an instruct model's format",
                                    Rule(float, ge=-50, le=50)),
                   "explore": ("sharpening", "where the tokens RL must raise sit: exploration (the dominant token of "
                                              "ordinary answer positions near-certain, the acceptable ones at forks "
                                              "improbable: most up-clipped tokens have pi_old < 0.2, DAPO Fig. 3a) "
                                              "or sharpening (ordinary positions about as sure of their dominant "
                                              "token as of its runners-up: most up-clipped tokens are likely ones)",
                               Rule(str, choices=EXPLORE_SETTINGS))},
}
ENV_DIFFICULTY = {"bandit": (-4.0, 3.0), "toy_lm": (-6.0, 4.0), "feature_lm": (-8.0, 4.0)}
ENV_DEFAULTS = {"bandit": {"eval_every": 1}, "toy_lm": {"eval_every": 1},
                "feature_lm": {"n_prompts": 256, "eval_every": 10, "staleness": 2, "epochs": 1, "minibatches": 8,
                               "overlong_cache": 2, "lr": 0.008}}
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
DPO_BETA = Rule(float, gt=0, le=1e3)


def known_keys(env: str) -> list[str]:
    """Every key ``--set`` accepts for ``env``."""
    check_env(env)
    return sorted(set(SETTINGS) | set(ENV_SETTINGS[env]) | set(LOSS_KEYS))


def loss_keys(algos) -> list[str]:
    """The loss settings one of ``algos`` can read (``spec.registry.Algorithm.reads`` with a KL term and every
    rollout correction on; DPO reads beta only)."""
    read = set()
    for algo in algos:
        alg = ALGORITHMS[algo]
        read |= set(alg.reads({"beta": 1.0}))
        if alg.clip != "none":
            read |= {k for keys in ROLLOUT_READS.values() for k in keys}
    return [k for k in LOSS_KEYS if k in read]


def expected_keys(env: str, algos) -> str:
    """The ``--set`` keys that mean something to ``algos`` on ``env``, in words: their loss settings, then those of
    every run and of the environment."""
    return (f"the loss settings of {', '.join(algos)} ({', '.join(loss_keys(algos))}) or the run's and {env}'s "
            f"({', '.join(sorted(set(known_keys(env)) - set(LOSS_KEYS)))})")


def check_keys(env: str, algos, keys) -> None:
    """Every ``--set`` key is one ``env`` has: a ValueError naming the unknown ones, the closest known key, and the
    keys that mean something to ``algos`` (those of the sweep)."""
    known = known_keys(env)
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise ValueError(f"set: unknown key(s) {', '.join(unknown)}{did_you_mean(unknown[0], known)} for env "
                         f"{env!r}; expected {expected_keys(env, algos)}")


def check_env(env: str) -> None:
    if env not in ENVS:
        raise ValueError(f"env: unknown environment {env!r}; expected one of {', '.join(ENVS)}")


def check_algo(algo: str) -> None:
    if algo not in ALGORITHMS:
        raise ValueError(f"algos: unknown algorithm {algo!r}{did_you_mean(algo, ALGORITHMS)}; expected one of "
                         f"{', '.join(ALGORITHMS)}")


def resolve(env: str, algo: str, overrides: dict | None = None) -> dict:
    """The full settings of one run: defaults, then the algorithm's, then ``overrides``; every value checked."""
    check_env(env)
    check_algo(algo)
    overrides = dict(overrides or {})
    check_keys(env, [algo], overrides)
    cfg = {k: v for k, (v, _, _) in SETTINGS.items()}
    cfg.update({k: v for k, (v, _, _) in ENV_SETTINGS[env].items()})
    cfg["difficulty_low"], cfg["difficulty_high"] = ENV_DIFFICULTY[env]
    cfg.update(ENV_DEFAULTS[env])
    cfg["dynamic_sampling"], cfg["overlong"] = False, False
    # the algorithm's paper settings, else (the algorithms beyond the seeds) the binary reward and the registry's
    # advantage
    cfg.update(ALGO_SETTINGS.get(algo, {"reward": "binary", "adv": ALGORITHMS[algo].advantage}))
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
        loss = {"beta": DPO_BETA.check("beta", loss_over.get("beta", ALGORITHMS["dpo"].defaults["beta"]))}
    cfg["loss"] = loss
    return cfg


def schema(env: str) -> dict:
    """Every setting's Rule for ``env``: {key: Rule}."""
    return {k: rule for k, (_, _, rule) in {**SETTINGS, **ENV_SETTINGS[env]}.items()}


def _check(env, algo, cfg):
    """Each setting against its Rule (ints widened to float where a float is due), then the ones that depend on
    each other."""
    for key, rule in schema(env).items():
        cfg[key] = rule.check(key, cfg[key])
    if cfg["batch_prompts"] > cfg["n_prompts"]:
        raise ValueError(f"batch_prompts: expected at most n_prompts ({cfg['n_prompts']}), got {cfg['batch_prompts']}")
    if cfg["minibatches"] > cfg["batch_prompts"]:
        raise ValueError(f"minibatches: expected at most batch_prompts ({cfg['batch_prompts']}) since a minibatch "
                         f"holds whole groups, got {cfg['minibatches']}")
    if algo != "dpo" and cfg["adv"] is None:
        raise ValueError(f"adv: expected one of {', '.join(ADVANTAGES)}, got None")
    needs_group = (algo == "dpo" and "preference pairs") or (cfg["adv"] in GROUP_ADVANTAGES and
                                                              f"the {cfg['adv']} advantage")
    if needs_group and cfg["group_size"] < 2:
        raise ValueError(f"group_size: {algo} ({needs_group}) needs G >= 2 responses per prompt, "
                         f"got {cfg['group_size']}")
    if cfg["overlong"] and cfg["overlong_cache"] > cfg["max_len"]:
        raise ValueError(f"overlong_cache: expected at most max_len ({cfg['max_len']}), got {cfg['overlong_cache']}")
    if not cfg["difficulty_low"] <= cfg["difficulty_high"]:
        raise ValueError(f"difficulty_low: expected <= difficulty_high ({cfg['difficulty_high']}), "
                         f"got {cfg['difficulty_low']}")
    if env == "feature_lm":
        _check_feature_lm(cfg)


def _check_feature_lm(cfg):
    """feature_lm's settings that depend on each other."""
    if cfg["max_len"] < cfg["answer_len"] + 1:
        raise ValueError(f"max_len: expected at least answer_len + 1 ({cfg['answer_len'] + 1}), got {cfg['max_len']!r}")
    if cfg["n_correct"] > cfg["vocab"] - 2:
        raise ValueError(f"n_correct: expected at most vocab - 2 ({cfg['vocab'] - 2}), got {cfg['n_correct']}")
    if cfg["forks"] > cfg["answer_len"]:
        raise ValueError(f"forks: expected at most answer_len ({cfg['answer_len']}), got {cfg['forks']}")
    if cfg["explore"] == "exploration" and cfg["n_correct"] > (cfg["vocab"] - 2) // 2:
        raise ValueError(f"n_correct: explore=exploration (forks accept 2 n_correct tokens) needs at most "
                         f"(vocab - 2) // 2 ({(cfg['vocab'] - 2) // 2}), got {cfg['n_correct']}")


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


#: At most this many seeds in a sweep; a sweep's seed s runs in environment draw env_seed + s // SEEDS_PER_DRAW.
MAX_SEEDS, MAX_SEED = 1024, 2 ** 31 - 1
SEEDS_PER_DRAW = 5


@dataclass(frozen=True)
class Seeds:
    """A sweep's seeds: every claim is decided on ``discovery`` and re-checked on the disjoint ``replication``."""
    discovery: tuple[int, ...]
    replication: tuple[int, ...]

    @property
    def all(self) -> tuple[int, ...]:
        return self.discovery + self.replication

    def role(self, seed: int) -> str:
        return "discovery" if seed in self.discovery else "replication"

    def text(self) -> str:
        """The ``--seeds`` form that gives these sets back (ranges where consecutive)."""
        if not self.replication:  # one set: a lone seed as a range, not to be read as a count
            return _ranges(self.discovery) if len(self.discovery) > 1 else f"{self.discovery[0]}-{self.discovery[0]}"
        return f"{_ranges(self.discovery)}:{_ranges(self.replication)}"


def _ranges(seeds) -> str:
    runs: list[list[int]] = []
    for s in seeds:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def env_draw(cfg: dict, seed: int) -> int:
    """The environment draw of a sweep's ``seed``: seeds in blocks of SEEDS_PER_DRAW share one, so a sweep of 20
    seeds spans 4 draws, 2 for each set (a label's seeds stack in one trainer whatever their draws)."""
    return cfg["env_seed"] + seed // SEEDS_PER_DRAW


def parse_seeds(spec) -> Seeds:
    """``--seeds``: a count (``20``: seeds 0-19), a range (``1000-1019``) or a list (``1,5,9``), split in halves into
    the discovery and replication sets; or the two sets given as ``DISCOVERY:REPLICATION`` (``0-9:10-19``)."""
    if isinstance(spec, Seeds):
        return spec
    text = str(spec).strip()
    if ":" in text:
        first, _, second = text.partition(":")
        disc, rep = _seed_list(first, count=False), _seed_list(second, count=False)
        common = sorted(set(disc) & set(rep))
        if common:
            raise ValueError(f"seeds: the discovery and replication sets overlap (seed {common[0]}) in {text!r}")
    else:
        seeds = _seed_list(text, count=True)
        half = (len(seeds) + 1) // 2
        disc, rep = seeds[:half], seeds[half:]
    if len(disc) + len(rep) > MAX_SEEDS:
        raise ValueError(f"seeds: expected at most {MAX_SEEDS} seeds, got {len(disc) + len(rep)} from {text!r}")
    return Seeds(tuple(disc), tuple(rep))


def _seed_list(text: str, count: bool) -> list[int]:
    """One set: a count (if ``count``), a range A-B or a comma-separated list of them."""
    if isinstance(text, int) or (count and re.fullmatch(r"\d+", text.strip())):
        n = int(text)
        if not 1 <= n <= MAX_SEEDS:
            raise ValueError(f"seeds: expected a count from 1 to {MAX_SEEDS}, a range A-B or a list, got {text!r}")
        return list(range(n))
    seeds: list[int] = []
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", item)
        if not m:
            raise ValueError(f"seeds: expected a count, a range A-B or a list of seeds (integers >= 0), got {item!r}"
                             f" in {text!r}")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if lo < 0 or hi < 0:
            raise ValueError(f"seeds: expected seeds >= 0, got {item!r}")
        if hi < lo:
            raise ValueError(f"seeds: the range {item!r} is reversed (empty); expected A-B with A <= B")
        if hi > MAX_SEED or hi - lo + 1 > MAX_SEEDS:
            raise ValueError(f"seeds: expected at most {MAX_SEEDS} seeds, each at most {MAX_SEED}, got {item!r}")
        seeds += range(lo, hi + 1)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: a seed is listed twice in {text!r}")
    return seeds


def split_sets(grid: dict[str, list], algos: list[str]) -> tuple[dict[str, list], dict[str, dict[str, list]]]:
    """``--set`` keys ``algo.key`` apply to that algorithm only: (the shared grid, {algo: its own grid}); an
    algorithm not in the sweep, or a key it does not have, is an error naming both."""
    shared: dict[str, list] = {}
    own: dict[str, dict[str, list]] = {}
    for key, values in grid.items():
        algo, dot, name = key.partition(".")
        if not dot:
            shared[key] = values
            continue
        if algo not in algos:
            raise ValueError(f"set: {key!r} targets algorithm {algo!r}, which is not in this sweep "
                             f"({', '.join(algos)}){did_you_mean(algo, algos)}")
        own.setdefault(algo, {})[name] = values
    return shared, own


def check_algo_keys(env: str, algo: str, keys) -> None:
    """An ``algo.key`` setting must be one ``algo`` has (DPO's only loss setting is beta)."""
    mine = set(known_keys(env))
    if algo not in POLICY_ALGORITHMS:
        mine -= set(LOSS_KEYS) - {"beta"}
    for key in keys:
        if key not in mine:
            raise ValueError(f"set: algorithm {algo!r} has no setting {key!r}{did_you_mean(key, mine)}; expected "
                             f"{expected_keys(env, [algo])}")
