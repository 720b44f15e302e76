"""A toy language model: an autoregressive tabular softmax policy over a small vocabulary with an EOS token.

A response thinks (filler tokens; the prompt's position counter is the prefix state), emits the answer marker
``ANS``, one answer token and ``EOS``. Format rule: anything else (EOS before an answer, tokens after the answer,
running past ``max_len``) is malformed, so DCPO's +1 / 0 / -1 reward separates wrong from malformed answers.
"""
from __future__ import annotations

import numpy as np

from .tabular import CORRECT, MALFORMED, WRONG, Automaton

EOS, ANS = 0, 1


def build(n_prompts=64, max_len=16, n_think=2, n_answers=4, difficulty_low=-6.0, difficulty_high=4.0,
          env_seed=0) -> tuple[Automaton, np.ndarray, dict]:
    """The automaton, the "pretrained" initial logits and a description (answer and difficulty per prompt)."""
    _check(n_prompts=n_prompts, max_len=max_len, n_think=n_think, n_answers=n_answers)
    if max_len < 3:
        raise ValueError(f"max_len: the toy LM needs at least 3 tokens (ANS, answer, EOS), got {max_len}")
    if not difficulty_low <= difficulty_high:
        raise ValueError(f"difficulty_low: expected <= difficulty_high ({difficulty_high}), got {difficulty_low}")
    rng = np.random.default_rng(env_seed)
    vocab = 2 + n_think + n_answers
    first_answer = 2 + n_think
    per = max_len + 2 + n_answers  # THINK_0..THINK_{T-1}, ANSWER, DONE_a for each a, GARBAGE
    think = np.arange(max_len)
    answer_s, done0, garbage = max_len, max_len + 1, max_len + 1 + n_answers

    nxt = np.full((per, vocab), -1, dtype=np.int64)
    out = np.full((per, vocab), MALFORMED, dtype=np.int64)
    nxt[think, 1:] = np.minimum(think + 1, max_len - 1)[:, None]  # filler (and answer tokens) keep thinking
    nxt[think, ANS] = answer_s
    nxt[answer_s, 1:] = garbage
    nxt[answer_s, first_answer:] = done0 + np.arange(n_answers)
    nxt[done0:done0 + n_answers, 1:] = garbage
    nxt[garbage, 1:] = garbage

    answers = rng.integers(n_answers, size=n_prompts)
    correct_logit = rng.permutation(np.linspace(difficulty_low, difficulty_high, n_prompts))
    offsets = np.arange(n_prompts)[:, None, None] * per
    next_state = np.where(nxt[None] >= 0, nxt[None] + offsets, -1).reshape(-1, vocab)
    outcome = np.broadcast_to(out, (n_prompts, per, vocab)).copy()
    outcome[np.arange(n_prompts), done0 + answers, EOS] = CORRECT
    wrong = np.ones((n_prompts, n_answers), dtype=bool)
    wrong[np.arange(n_prompts), answers] = False
    pw, aw = np.nonzero(wrong)
    outcome[pw, done0 + aw, EOS] = WRONG

    logits = np.zeros((n_prompts, per, vocab))
    length_bias = -1.5 + 0.5 * rng.standard_normal(n_prompts)
    logits[:, think, EOS] = -4.0
    logits[:, think, ANS] = length_bias[:, None] + 6.0 * think[None] / max_len
    logits[:, think, first_answer:] = -2.0
    logits[:, answer_s, :first_answer] = -4.0
    logits[:, answer_s, first_answer:] = 0.3 * rng.standard_normal((n_prompts, n_answers))
    logits[np.arange(n_prompts), answer_s, first_answer + answers] = correct_logit
    logits[:, done0:done0 + n_answers, EOS] = 3.0
    logits[:, done0:done0 + n_answers, 1:] = -3.0
    logits = logits + 0.1 * rng.standard_normal(logits.shape)
    aut = Automaton(next_state, outcome.reshape(-1, vocab), np.arange(n_prompts) * per, max_len,
                    np.repeat(np.arange(n_prompts), per))
    return aut, logits.reshape(-1, vocab), {"answers": answers, "correct_logit": correct_logit}


def _check(**sizes):
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
