"""Training configuration: YAML sections as dataclasses, every field checked with an error that names it."""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

import yaml

from spec.contract import resolve_hparams
from spec.registry import ALGORITHMS, HPARAMS, POLICY_ALGORITHMS

ADVANTAGES = ("auto", "grpo", "dr_grpo", "sas", "gae")
AUTO_ADVANTAGE = {"dr_grpo": "dr_grpo", "dcpo": "sas", "ppo": "gae"}  # others: grpo's standardisation
AUTO_REWARD = {"dapo": "dapo", "dcpo": "dcpo"}  # others: accuracy (1/0)


@dataclass
class RunCfg:
    out_dir: str = "runs/run"
    seed: int = 0
    steps: int = 20
    save_every: int = 10
    resume: bool = True
    progress: bool = True
    threads: Optional[int] = None  # torch CPU threads (None = torch's default); 1 is faster on a busy CPU
    tensorboard: bool = False  # also write the per-step metrics as TensorBoard scalars under out_dir/tb


@dataclass
class ModelCfg:
    name: str = "smollm2"  # 'smollm2', 'tiny' or a local checkpoint folder
    tiny: dict = field(default_factory=dict)
    train_top_layers: Optional[int] = None  # train only the top N transformer blocks and the final norm
    lora: Optional[dict] = None  # peft LoraConfig fields, e.g. {r: 8, lora_alpha: 16, target_modules: [q_proj]}
    dtype: str = "float32"  # float32 or bfloat16 (bf16 on GPU)
    device: str = "cpu"
    cache_dir: Optional[str] = None


@dataclass
class DataCfg:
    source: str = "arithmetic"  # arithmetic, gsm8k, math, champ
    n: int = 256
    digits: int = 1
    terms: int = 2
    ops: str = "+"
    path: Optional[str] = None
    limit: Optional[int] = None
    system: Optional[str] = None


@dataclass
class RolloutCfg:
    engine: str = "hf"  # hf or vllm
    prompts_per_step: int = 4
    group_size: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    tis_cap: Optional[float] = None  # truncated importance-sampling correction (None = off)
    vllm_kv_cache_mb: int = 64
    max_rounds: int = 3  # generation rounds per step for DAPO dynamic sampling


@dataclass
class AlgoCfg:
    name: str = "grpo"
    hp: dict = field(default_factory=dict)  # policy_loss hyper-parameters over the registry defaults
    advantage: str = "auto"
    unbiased_std: bool = True
    reward: str = "auto"  # accuracy, dapo, dcpo or 'module:function'; auto picks the paper's
    dynamic_sampling: bool = False
    overlong_max_len: Optional[int] = None  # DAPO soft overlong punishment (Eq. 13), in tokens
    overlong_cache_len: Optional[int] = None
    overlong_filter: bool = False
    gamma: float = 1.0
    lam: float = 0.95
    kl_reward_coef: float = 0.0  # PPO: k1 KL to the reference subtracted from the token reward
    value_clip: float = 0.2
    dpo_beta: float = 0.1


@dataclass
class TrainCfg:
    lr: float = 1e-5
    value_lr: float = 1e-4
    weight_decay: float = 0.0
    epochs: int = 1
    minibatch_size: int = 0  # sequences per optimiser step; 0 = the whole batch
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    logprob_chunk: Optional[int] = None  # output-layer tile of logprob_chunk x vocab logits (None: about 2**22)


@dataclass
class Config:
    run: RunCfg = field(default_factory=RunCfg)
    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    rollout: RolloutCfg = field(default_factory=RolloutCfg)
    algo: AlgoCfg = field(default_factory=AlgoCfg)
    train: TrainCfg = field(default_factory=TrainCfg)

    @property
    def advantage(self) -> str:
        """The advantage estimator in use."""
        a = self.algo.advantage
        return AUTO_ADVANTAGE.get(self.algo.name, "grpo") if a == "auto" else a

    @property
    def reward(self) -> str:
        """The reward function in use."""
        r = self.algo.reward
        return AUTO_REWARD.get(self.algo.name, "accuracy") if r == "auto" else r

    def loss_hparams(self) -> dict:
        """Hyper-parameters for policy_loss (Dr.GRPO's max_len defaults to the generation budget)."""
        hp = dict(self.algo.hp)
        agg = hp.get("agg", ALGORITHMS[self.algo.name].defaults.get("agg"))
        if agg == "seq_mean_token_sum_norm" and hp.get("max_len") is None:
            hp["max_len"] = self.rollout.max_new_tokens
        return hp

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_type(name: str, value, tp):
    origin = get_origin(tp)
    if origin is Union:
        opts = [t for t in get_args(tp) if t is not type(None)]
        if value is None:
            return None
        return _check_type(name, value, opts[0])
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads '1e-5' as a string
        except ValueError:
            pass
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if not ok:
        raise ValueError(f"{name}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _known(raw, cls, what: str, prefix: str = "") -> dict:
    """The type hints of ``cls``, once ``raw`` is a mapping that names only those (``what``: fields, sections)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of {what}s, got {type(raw).__name__}")
    hints = get_type_hints(cls)
    unknown = sorted(set(raw) - set(hints))
    if unknown:
        raise ValueError(f"{prefix}{unknown[0]}: unknown {what}; expected one of {', '.join(hints)}")
    return hints


def _section(name: str, cls, raw) -> Any:
    raw = {} if raw is None else raw
    hints = _known(raw, cls, "field", f"{name}.")
    return cls(**{k: _check_type(f"{name}.{k}", v, hints[k]) for k, v in raw.items()})


def _positive(name, value, allow_zero=False):
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}: expected a number {'>=' if allow_zero else '>'} 0, got {value!r}")


def validate(cfg: Config) -> Config:
    """Check values and their combinations; raise ValueError naming the field."""
    r, a, t, d, m = cfg.rollout, cfg.algo, cfg.train, cfg.data, cfg.model
    if a.name not in ALGORITHMS:
        raise ValueError(f"algo.name: expected one of {', '.join(ALGORITHMS)}, got {a.name!r}")
    if r.engine not in ("hf", "vllm"):
        raise ValueError(f"rollout.engine: expected 'hf' or 'vllm', got {r.engine!r}")
    if m.dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"model.dtype: expected float32, bfloat16 or float16, got {m.dtype!r}")
    if d.source not in ("arithmetic", "gsm8k", "math", "champ"):
        raise ValueError(f"data.source: expected arithmetic, gsm8k, math or champ, got {d.source!r}")
    if d.source in ("gsm8k", "math") and not d.path:
        raise ValueError(f"data.path: source {d.source!r} needs a local .jsonl or .parquet file")
    for name, v in (("run.steps", cfg.run.steps), ("run.save_every", cfg.run.save_every),
                    ("rollout.prompts_per_step", r.prompts_per_step), ("rollout.max_new_tokens", r.max_new_tokens),
                    ("rollout.max_rounds", r.max_rounds), ("rollout.vllm_kv_cache_mb", r.vllm_kv_cache_mb),
                    ("train.epochs", t.epochs), ("train.grad_accum", t.grad_accum),
                    ("data.n", d.n), ("train.lr", t.lr),
                    ("rollout.temperature", r.temperature), ("train.max_grad_norm", t.max_grad_norm)):
        _positive(name, v)
    for name, v in (("train.weight_decay", t.weight_decay), ("algo.kl_reward_coef", a.kl_reward_coef),
                    ("train.minibatch_size", t.minibatch_size), ("train.value_lr", t.value_lr)):
        _positive(name, v, allow_zero=True)
    if r.group_size < 2:
        raise ValueError(f"rollout.group_size: expected an int >= 2 (group advantages), got {r.group_size}")
    if a.advantage not in ADVANTAGES:
        raise ValueError(f"algo.advantage: expected one of {', '.join(ADVANTAGES)}, got {a.advantage!r}")
    if cfg.advantage == "gae" and a.name != "ppo":
        raise ValueError("algo.advantage: 'gae' needs a value model, which only algo.name 'ppo' trains")
    for name, v in (("algo.gamma", a.gamma), ("algo.lam", a.lam)):
        if not 0 <= v <= 1:
            raise ValueError(f"{name}: expected a number in [0, 1], got {v!r}")
    if a.name in POLICY_ALGORITHMS:
        bad = sorted(set(a.hp) - set(HPARAMS))
        if bad:
            raise ValueError(f"algo.hp.{bad[0]}: unknown hyper-parameter; expected among {', '.join(HPARAMS)}")
        try:
            resolve_hparams(a.name, cfg.loss_hparams())
        except ValueError as e:
            raise ValueError(f"algo.hp.{e}") from None
    elif a.hp:
        raise ValueError("algo.hp: dpo takes algo.dpo_beta, not policy-loss hyper-parameters")
    _positive("algo.dpo_beta", a.dpo_beta)
    _positive("algo.value_clip", a.value_clip)
    if (a.overlong_max_len is None) != (a.overlong_cache_len is None):
        raise ValueError("algo.overlong_cache_len: set both overlong_max_len and overlong_cache_len, or neither")
    if a.overlong_max_len is not None and not 0 < a.overlong_cache_len <= a.overlong_max_len:
        raise ValueError(f"algo.overlong_cache_len: expected 0 < cache_len <= overlong_max_len "
                         f"({a.overlong_max_len}), got {a.overlong_cache_len}")
    for name, v in (("run.threads", cfg.run.threads), ("model.train_top_layers", m.train_top_layers),
                    ("train.logprob_chunk", t.logprob_chunk)):
        if v is not None:
            _positive(name, v)
    if r.tis_cap is not None:
        _positive("rollout.tis_cap", r.tis_cap)
    if cfg.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("run.tensorboard: the tensorboard package is not installed (pip install 'cliplab[test]')")
    if t.minibatch_size and t.minibatch_size % r.group_size:
        raise ValueError(f"train.minibatch_size: expected a multiple of rollout.group_size ({r.group_size}) so "
                         f"minibatches hold whole groups, got {t.minibatch_size}")
    if t.minibatch_size and t.minibatch_size // r.group_size % t.grad_accum:
        raise ValueError(f"train.grad_accum: expected to divide the groups per minibatch "
                         f"({t.minibatch_size // r.group_size}), got {t.grad_accum}")
    if not t.minibatch_size and r.prompts_per_step % t.grad_accum:
        raise ValueError(f"train.grad_accum: expected to divide rollout.prompts_per_step ({r.prompts_per_step}), "
                         f"got {t.grad_accum}")
    from .rewards import get_reward
    try:
        get_reward(cfg.reward)
    except ValueError as e:
        raise ValueError(f"algo.{e}") from None
    return cfg


def apply_set(raw: dict, item: str) -> None:
    """Apply one ``--set section.field=value`` (value parsed as YAML) to the raw mapping."""
    key, sep, value = item.partition("=")
    if not sep or "." not in key:
        raise ValueError(f"--set: expected section.field=value, got {item!r}")
    parts = key.strip().split(".")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set: {key} goes through a non-mapping field")
    node[parts[-1]] = yaml.safe_load(value)


def from_dict(raw: dict) -> Config:
    """A validated Config from a nested mapping."""
    hints = _known(raw, Config, "section")
    return validate(Config(**{k: _section(k, hints[k], raw.get(k)) for k in hints}))


def load_config(path, sets: list[str] | tuple = ()) -> Config:
    """Read a YAML config (yaml.safe_load), apply ``--set`` overrides, validate."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"config: no such file {str(p)!r}")
    raw = yaml.safe_load(p.read_text()) or {}
    for item in sets:
        apply_set(raw, item)
    return from_dict(raw)
