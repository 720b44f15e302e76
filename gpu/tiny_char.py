"""The tiny character-level model: a Llama decoder built from a recipe file (configs/tiny/model.yaml), a character
tokenizer, and its pretraining by supervised fine-tuning on column addition with a scratchpad
(``gpu.data.column_addition``), with the slips of a schoolbook learner, so that RL starts from a policy that looks like
an instruct model's: well formatted, right on easy prompts, confidently wrong at a few carries of hard ones."""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import random
import time
from pathlib import Path

import torch
import yaml

from spec.records import write_text
from spec.schema import Rule, show

from .data import column_addition, encode_prompt

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "tiny" / "model.yaml"
FORMATS = ("addition",)  # task formats the recipe may name
SPECIALS = ("<pad>", "<eos>", "<unk>")
ALPHABET = "0123456789+\n\\boxed{}"  # every character of a prompt or a completion of the addition task
RULES = {
    "model": {"hidden": Rule(int, ge=16, le=8192), "layers": Rule(int, ge=1, le=128), "heads": Rule(int, ge=1, le=256),
              "kv_heads": Rule(int, ge=1, le=256), "intermediate": Rule(int, ge=1, le=65536),
              "max_positions": Rule(int, ge=16, le=65536)},
    "task": {"format": Rule(str), "digits": Rule(int, ge=1, le=12)},
    "sft": {"seed": Rule(int, ge=0, le=2 ** 32 - 1), "steps": Rule(int, ge=1, le=10 ** 7),
            "batch": Rule(int, ge=1, le=2 ** 20), "lr": Rule(float, gt=0, le=1), "warmup": Rule(int, ge=0, le=10 ** 7),
            "weight_decay": Rule(float, ge=0, le=1), "threads": Rule(int, ge=1, le=4096),
            "malformed": Rule(float, ge=0, lt=1), "carry_slip": Rule(dict), "slip_pairs": Rule(int, ge=0, le=100),
            "slip_right": Rule(list), "slip_spread": Rule(int, ge=1, le=9)},
}


def load_recipe(path=RECIPE) -> dict:
    """The recipe file (``yaml.safe_load``), every field checked; errors are one line naming the file and field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read it as YAML ({' '.join(str(e).split())[:120]})") from None
    try:
        return check_recipe(raw)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def check_recipe(raw) -> dict:
    """A recipe mapping with every section and field of RULES, checked; carry_slip maps a column sum (10..19) to
    the probability that the demonstrations drop that column's carry; slip_pairs operand-digit pairs write their
    sum digit right with a probability in slip_right = [low, high], else one of slip_spread wrong digits
    (``slip_table``)."""
    if not isinstance(raw, dict) or set(raw) != set(RULES):
        got = sorted(raw) if isinstance(raw, dict) else raw
        raise ValueError(f"expected the sections {', '.join(RULES)}, got {show(got)}")
    out = {}
    for sec, rules in RULES.items():
        if not isinstance(raw[sec], dict) or set(raw[sec]) != set(rules):
            got = sorted(raw[sec]) if isinstance(raw[sec], dict) else raw[sec]
            raise ValueError(f"{sec}: expected the fields {', '.join(rules)}, got {show(got)}")
        out[sec] = {k: rule.check(f"{sec}.{k}", raw[sec][k]) for k, rule in rules.items()}
    if out["task"]["format"] not in FORMATS:
        raise ValueError(f"task.format: unknown task format {show(out['task']['format'])}; expected one of "
                         f"{', '.join(FORMATS)}")
    m = out["model"]
    if m["hidden"] % m["heads"] or (m["hidden"] // m["heads"]) % 16 or m["heads"] % m["kv_heads"]:
        raise ValueError(f"model.heads: expected hidden/heads a multiple of 16 and kv_heads dividing heads, got "
                         f"hidden {m['hidden']}, heads {m['heads']}, kv_heads {m['kv_heads']}")
    slip = out["sft"]["carry_slip"]
    if not all(isinstance(s, int) and 10 <= s <= 19 for s in slip):
        raise ValueError(f"sft.carry_slip: expected column sums 10..19 as keys, got {sorted(map(str, slip))}")
    out["sft"]["carry_slip"] = {s: Rule(float, ge=0, le=1).check(f"sft.carry_slip.{s}", p) for s, p in slip.items()}
    right = out["sft"]["slip_right"]
    if len(right) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in right) \
            or not 0 < right[0] <= right[1] <= 1:
        raise ValueError(f"sft.slip_right: expected [low, high] with 0 < low <= high <= 1, got {show(right)}")
    out["sft"]["slip_right"] = [float(x) for x in right]
    return out


def slip_table(sft: dict) -> dict:
    """The slip pairs of a recipe's ``sft`` section: {(x, y): (p_right, offsets)} for ``slip_pairs`` operand-digit
    pairs drawn (seeded by sft.seed) from the 100, each writing its column's sum digit right with a probability
    log-uniform in ``slip_right`` and else, evenly, one of ``slip_spread`` wrong digits (the digits ``offsets``,
    1..9, above it). The pairs are independent of each other, so where the right digit sits is a knob of the
    recipe: below pi_old 0.2 with its position's remaining mass spread over several wrong digits, an exploration
    token of DAPO Fig. 3a at a high-entropy position; or above 0.2 against one wrong digit, a token RL sharpens.
    Prompts differ by which pairs their columns hold."""
    rng = random.Random(sft["seed"] * 7919 + 1)
    pairs = rng.sample([(x, y) for x in range(10) for y in range(10)], sft["slip_pairs"])
    lo, hi = (math.log(p) for p in sft["slip_right"])
    table = {}
    for pair in pairs:
        p_right = math.exp(rng.uniform(lo, hi))
        spread = sft["slip_spread"]
        offsets = (rng.randint(1, 9),) if spread == 1 else tuple(rng.sample(range(1, 10), spread))
        table[pair] = (p_right, offsets)
    return table


def recipe_key(recipe: dict) -> str:
    """The cache key: a hash of the recipe and of the code that turns it into weights (this module and the task's
    worked solutions), so that a change to either builds a new checkpoint."""
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    h.update(inspect.getsource(column_addition).encode())
    return h.hexdigest()[:12]


def char_tokenizer():
    """A character-level tokenizer over ALPHABET (``tokenizers`` WordLevel on single characters, fused on decode),
    with <pad> and <eos>; no chat template, so prompts are the question and a newline (gpu.data.encode_prompt)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(SPECIALS + tuple(ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def build_model(recipe: dict, tok):
    """A randomly initialised Llama causal LM of the recipe's sizes (seeded by sft.seed), tied embeddings. (Llama,
    not Qwen2: transformers' AutoTokenizer swaps a qwen2 checkpoint's tokenizer for Qwen2Tokenizer, whose
    pre-tokenizer would drop the newline that ends a prompt.)"""
    from transformers import AutoModelForCausalLM, LlamaConfig
    m = recipe["model"]
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=m["hidden"], num_hidden_layers=m["layers"],
                      num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
                      intermediate_size=m["intermediate"], max_position_embeddings=m["max_positions"],
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.eos_token_id)
    torch.manual_seed(recipe["sft"]["seed"])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def demonstration(a: int, b: int, digits: int, rng: random.Random, carry_slip: dict, malformed: float,
                  slips: dict | None = None) -> str:
    """One SFT completion of a + b: the worked columns, where a column of sum s drops its carry with probability
    ``carry_slip[s]`` (the learner's systematic slip, so hard prompts are confidently wrong at their carries with
    the right carry a minority) and a column of a slip pair (``slip_table``) writes its digit right with
    probability p_right, else off by one of the pair's offsets, evenly; with probability ``malformed`` it stops
    after the scratchpad, giving no answer."""
    slips = slips or {}

    def digit_slip(x, y):
        p_right, offsets = slips.get((x, y), (1.0, (0,)))
        if rng.random() < p_right:
            return 0
        return offsets[0] if len(offsets) == 1 else rng.choice(offsets)
    text = column_addition(a, b, digits, lambda s: rng.random() >= carry_slip.get(s, 0.0), digit_slip)
    return text[:text.index("\\boxed")] if rng.random() < malformed else text


def sft_batch(recipe: dict, tok, rng: random.Random):
    """(input_ids, attention_mask, labels) of ``sft.batch`` fresh demonstrations on random problems, right-padded;
    labels are -100 on the prompt and the padding, so the loss is on completions (and their <eos>) only."""
    digits, sft = recipe["task"]["digits"], recipe["sft"]
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    rows, slips = [], slip_table(sft)
    for _ in range(sft["batch"]):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        prompt = encode_prompt(tok, f"{a}+{b}")
        completion = tok(demonstration(a, b, digits, rng, sft["carry_slip"], sft["malformed"], slips)).input_ids
        rows.append((prompt, completion + [tok.eos_token_id]))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    att = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        att[i, :len(p) + len(c)] = 1
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
    return ids, att, labels


def pretrain(out, recipe: dict, log_every: int = 0) -> dict:
    """Supervised fine-tuning from random weights, deterministic (seeded; one thread), written to folder ``out``
    (weights, tokenizer, pretrain.json with the recipe and the loss curve); returns pretrain.json's content."""
    from transformers import get_cosine_schedule_with_warmup
    sft, out = recipe["sft"], Path(out)
    threads = torch.get_num_threads()
    torch.set_num_threads(sft["threads"])
    try:
        tok = char_tokenizer()
        model = build_model(recipe, tok).train()
        opt = torch.optim.AdamW(model.parameters(), lr=sft["lr"], weight_decay=sft["weight_decay"],
                                betas=(0.9, 0.98))
        sched = get_cosine_schedule_with_warmup(opt, sft["warmup"], sft["steps"])
        rng, losses, t0, cpu0 = random.Random(sft["seed"]), [], time.perf_counter(), time.process_time()
        for step in range(sft["steps"]):
            ids, att, labels = sft_batch(recipe, tok, rng)
            loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if log_every and (step + 1) % log_every == 0:
                print(f"sft step {step + 1}/{sft['steps']}: loss {sum(losses[-log_every:]) / log_every:.4f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    info = {"recipe": {**recipe, "sft": {**sft, "carry_slip": {str(k): v for k, v in sft["carry_slip"].items()}}},
            "key": recipe_key(recipe), "loss_first": losses[0], "loss_last": sum(losses[-20:]) / len(losses[-20:]),
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}
    write_text(out / "pretrain.json", json.dumps(info, indent=1))
    return info

