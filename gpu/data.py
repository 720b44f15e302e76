"""Prompt sources: a synthetic arithmetic task (offline, tunable difficulty), column addition with a scratchpad (the
tiny character-level model's task), local GSM8K/MATH files, champ-dataset; and a resumable prompt stream."""
from __future__ import annotations

import collections
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

from spec.records import read_text
from spec.schema import show

from .rewards import last_boxed

INSTRUCTION = "Put the final answer in \\boxed{}."
#: The characters of a source's completions that decide its reward (the regime card's entropy_relevant): the
#: addition task's digits, in its scratchpad and its answer, and not its format (\\boxed{, }, <eos>).
RELEVANT_CHARS = {"addition": "0123456789"}
SOURCES = ("arithmetic", "addition", "gsm8k", "math", "champ")
BOXED_ONLY = ("addition",)  # sources whose answer counts only in \\boxed{} (a scratchpad's numbers are no answer)


@dataclass(frozen=True)
class Problem:
    """One prompt with its gold answer; ``id`` keys per-prompt history (DCPO's SAS)."""

    id: str
    question: str
    answer: str


def arithmetic(n: int = 256, digits: int = 1, terms: int = 2, ops: str = "+", seed: int = 0) -> list[Problem]:
    """``n`` problems like 'What is 7 + 5?' with ``terms`` operands of up to ``digits`` digits, operators from ``ops``
    (left to right, no precedence surprises: '*' only when it is the only operator)."""
    if n < 1 or digits < 1 or terms < 2:
        raise ValueError(f"arithmetic: expected n >= 1, digits >= 1, terms >= 2; got {n}, {digits}, {terms}")
    check_ops(ops)
    rng = random.Random(seed)
    out = []
    for k in range(n):
        nums = [rng.randint(0, 10 ** digits - 1) for _ in range(terms)]
        chosen = [rng.choice(ops) for _ in range(terms - 1)]
        value, text = nums[0], str(nums[0])
        for op, x in zip(chosen, nums[1:]):
            value = value + x if op == "+" else value - x if op == "-" else value * x
            text += f" {op} {x}"
        out.append(Problem(f"arith-{seed}-{k}", f"What is {text}? {INSTRUCTION}", str(value)))
    return out


def column_addition(a: int, b: int, digits: int, writes_carry=None, digit_slip=None) -> str:
    """The worked completion of ``a + b`` (``digits``-digit operands): a scratchpad of the columns from the units
    up, each as its sum digit and the carry it passes on ('347+285': '21', '31', '60'), then the answer read off
    the written columns, in \\boxed{}: '213160\\boxed{632}'. ``writes_carry(s)`` says whether a column whose sum s
    (carry in included) is 10 or more writes its carry (default: always, the correct working); a dropped carry is
    missing from the next column and so from the answer, as in the schoolbook slip. ``digit_slip(x, y)`` is what a
    column of operand digits x and y adds to its written sum digit (mod 10; default 0, the correct digit): a slip
    of that column's digit alone, its carry unchanged."""
    scratch, carry = "", 0
    for i in range(digits):
        x, y = (a // 10 ** i) % 10, (b // 10 ** i) % 10
        s = x + y + carry
        carry = int(s >= 10 and (writes_carry is None or writes_carry(s)))
        written = (s + (digit_slip(x, y) if digit_slip else 0)) % 10
        scratch += f"{written}{carry}"
    answer = ("1" if carry else "") + scratch[-2::-2]
    return f"{scratch}\\boxed{{{answer.lstrip('0') or '0'}}}"


def addition(n: int = 256, digits: int = 3, seed: int = 0) -> list[Problem]:
    """``n`` problems 'a+b' of two ``digits``-digit operands (no leading zeros): the tiny character-level model's
    task, whose gold working is ``column_addition``; the answer counts only in \\boxed{} (``BOXED_ONLY``)."""
    if n < 1 or digits < 1:
        raise ValueError(f"addition: expected n >= 1, digits >= 1; got {n}, {digits}")
    rng = random.Random(seed)
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    pairs = [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]
    return [Problem(f"add-{seed}-{k}", f"{a}+{b}", str(a + b)) for k, (a, b) in enumerate(pairs)]


def check_ops(ops, name: str = "ops") -> None:
    """Arithmetic operators: a non-empty mix of '+' and '-', or '*' alone."""
    if not isinstance(ops, str) or not ops or set(ops) - set("+-*") or ("*" in ops and len(set(ops)) > 1):
        raise ValueError(f"{name}: expected a non-empty mix of '+' and '-', or '*' alone; got {show(ops)}")


def check_data_path(path) -> Path:
    """A local GSM8K/MATH file: it exists and is .jsonl, .json or .parquet."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data.path: no such file {str(path)!r}")
    if path.suffix not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"data.path: expected a .jsonl or .parquet file, got {str(path)!r}")
    return path


def _gsm8k_answer(solution: str) -> str:
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


def _rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pandas as pd
        try:
            return pd.read_parquet(path).to_dict("records")
        except Exception as e:  # pyarrow raises several kinds for a damaged file
            raise ValueError(f"data.path: cannot read {str(path)!r} as parquet: {str(e).splitlines()[0]}") from None
    try:
        text = read_text(path)  # a byte that is not UTF-8 is named by its line and column
    except ValueError as e:
        raise ValueError(f"data.path: {e}") from None
    rows = []
    for i, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
                if not isinstance(rows[-1], dict):
                    raise ValueError(f"expected a JSON object, got {type(rows[-1]).__name__}")
            except ValueError as e:
                raise ValueError(f"data.path: {str(path)!r} line {i}: {e}") from None
    return rows


def load_local(path, layout: str = "auto", limit: int | None = None) -> list[Problem]:
    """GSM8K layout (question, answer ending '#### N') or MATH layout (problem, solution with \\boxed{} or answer)."""
    path = check_data_path(path)
    out = []
    for i, row in enumerate(_rows(path)[:limit]):
        kind = layout if layout != "auto" else "gsm8k" if "question" in row else "math" if "problem" in row else None
        if kind == "gsm8k":
            q, a = row.get("question"), row.get("answer")
            a = None if a is None else _gsm8k_answer(str(a))
        elif kind == "math":
            q, a = row.get("problem"), row.get("answer") or last_boxed(str(row.get("solution", "")))
        else:
            raise ValueError(f"data.layout: row {i} of {path.name} has neither 'question' (GSM8K) nor 'problem' "
                             f"(MATH) fields: {sorted(row)}")
        if q is None or a is None:
            raise ValueError(f"data.path: row {i} of {path.name} has no {'question' if q is None else 'answer'}")
        out.append(Problem(f"{path.stem}-{i}", f"{q} {INSTRUCTION}", str(a)))
    return out


def champ(limit: int | None = None) -> list[Problem]:
    """The 270 CHAMP competition problems (the champ-dataset package), read from its JSON without importing it."""
    spec = importlib.util.find_spec("champ_dataset")
    if spec is None:
        raise ValueError("data.source: 'champ' needs the champ-dataset package (pip install champ-dataset)")
    root = Path(list(spec.submodule_search_locations)[0])
    problems = json.loads((root / "dataset_files" / "v0.json").read_text())["problems"]
    return [Problem(k, f"{p['_text']} {INSTRUCTION}", p["_answer"]) for k, p in list(problems.items())[:limit]]


def load_problems(source: str = "arithmetic", **kw) -> list[Problem]:
    """Problems from 'arithmetic' (kw: n, digits, terms, ops, seed), 'addition' (kw: n, digits,
    seed), 'gsm8k'/'math' (kw: path, limit) or 'champ'."""
    if source == "arithmetic":
        return arithmetic(**kw)
    if source == "addition":
        return addition(**kw)
    if source in ("gsm8k", "math"):
        return load_local(kw.pop("path"), layout=source, **kw)
    if source == "champ":
        return champ(**kw)
    raise ValueError(f"data.source: expected one of {', '.join(SOURCES)}, got {show(source)}")


def encode_prompt(tokenizer, question: str, system: str | None = None) -> list[int]:
    """Token ids of the question in the tokenizer's chat template (plain text when it has none)."""
    if getattr(tokenizer, "chat_template", None):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(question + "\n").input_ids


def check_alphabet(tokenizer, problems: list[Problem], source: str) -> None:
    """Refuse prompts with characters outside the tokenizer's alphabet: those it reads as its unknown token (a
    character-level tokenizer's <unk>; a byte-level one has none), which the model would see as one blank. A
    ValueError naming ``data.source``, the share of unknown characters and the commonest of them."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return
    questions = [p.question for p in problems]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    unknown = collections.Counter()
    for q, ids, offsets in zip(questions, enc["input_ids"], enc["offset_mapping"]):
        unknown.update(c for t, (a, b) in zip(ids, offsets) if t == unk for c in q[a:b])
    if unknown:
        n, total = sum(unknown.values()), sum(map(len, questions))
        common = "".join(c for c, _ in unknown.most_common(10))
        raise ValueError(f"data.source: {show(source)} has {n} of its {total} prompt characters ({n / total:.0%}) "
                         f"outside the model's tokenizer's alphabet (read as {tokenizer.unk_token}), such as "
                         f"{show(common)}; expected prompts the tokenizer can spell (tiny_char: data.source addition)")


def relevant_token_ids(tokenizer, source: str):
    """The token ids [K] of ``source``'s reward-relevant characters (RELEVANT_CHARS) that the tokenizer spells as one
    token each, or None for a source without them."""
    import torch
    chars = RELEVANT_CHARS.get(source)
    if chars is None:
        return None
    ids = [tokenizer.convert_tokens_to_ids(ch) for ch in chars]
    return torch.tensor([i for i in ids if i is not None and i != tokenizer.unk_token_id])


def prompt_ids(tokenizer, problem: Problem, system: str | None, max_tokens: int) -> list[int]:
    """The problem's prompt tokens (:func:`encode_prompt`), refused when there are more than ``max_tokens``
    (before any sampling or forward pass allocates for them)."""
    ids = encode_prompt(tokenizer, problem.question, system)
    if len(ids) > max_tokens:
        raise ValueError(f"data.max_prompt_tokens: problem {problem.id!r} is {len(ids)} tokens long as a prompt; "
                         f"expected at most {max_tokens} (remove it from the data, or shorten data.system)")
    return ids


class PromptStream:
    """Shuffled epochs over the problems; ``state_dict`` holds the position so resume continues exactly."""

    def __init__(self, problems: list[Problem], seed: int = 0):
        if not problems:
            raise ValueError("problems: the data set is empty")
        self.problems, self.seed, self.epoch, self.pos = problems, seed, 0, 0
        self._order = self._shuffle()

    def _shuffle(self):
        order = list(range(len(self.problems)))
        random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def next(self, k: int) -> list[Problem]:
        """The next ``k`` problems, starting a new shuffled epoch when one runs out."""
        out = []
        while len(out) < k:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.problems[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict, where="state") -> None:
        """Continue from ``state_dict()``; a position past the problems is refused, naming ``where``."""
        if not 0 <= state["pos"] <= len(self.problems):
            raise ValueError(f"{where}: stream.pos: expected 0 to {len(self.problems)} (the problems), got "
                             f"{state['pos']}")
        self.seed, self.epoch, self.pos = state["seed"], state["epoch"], state["pos"]
        self._order = self._shuffle()
