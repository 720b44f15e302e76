"""A contextual bandit: prompts x arms, one verifiable correct arm per prompt, a softmax policy per prompt."""
from __future__ import annotations

import numpy as np

from .tabular import CORRECT, WRONG, Automaton, log_softmax
from .toy_lm import _check


def build(n_prompts=64, n_arms=8, difficulty_low=-4.0, difficulty_high=3.0, env_seed=0):
    """Each prompt is one state whose every arm ends the response (length 1); arm ``answers[p]`` is correct."""
    _check(n_prompts=n_prompts, n_arms=n_arms)
    if n_arms < 2:
        raise ValueError(f"n_arms: expected at least 2 arms, got {n_arms}")
    rng = np.random.default_rng(env_seed)
    answers = rng.integers(n_arms, size=n_prompts)
    outcome = np.full((n_prompts, n_arms), WRONG, dtype=np.int64)
    outcome[np.arange(n_prompts), answers] = CORRECT
    logits = 0.5 * rng.standard_normal((n_prompts, n_arms))
    correct_logit = rng.permutation(np.linspace(difficulty_low, difficulty_high, n_prompts))
    logits[np.arange(n_prompts), answers] = correct_logit
    aut = Automaton(np.full((n_prompts, n_arms), -1, dtype=np.int64), outcome, np.arange(n_prompts), 1,
                    np.arange(n_prompts))
    return aut, logits, {"answers": answers, "correct_logit": correct_logit}


def entropy(logits: np.ndarray) -> np.ndarray:
    """H(pi_s) = -sum_a pi log pi per prompt."""
    logp = log_softmax(logits)
    return -(np.exp(logp) * logp).sum(-1)


def npg_entropy_check(logits: np.ndarray, rewards: np.ndarray, eta: float):
    """Cui et al. 2505.22617 Sec. 3, natural PG on a softmax: H' - H ~= -eta Cov_{a~pi}(log pi(a), A(a)).

    Natural policy gradient on a tabular softmax moves the logits by eta * A(a), A = r - E_pi[r]; returns the exact
    entropy change per prompt and the first-order prediction.
    """
    logp = log_softmax(logits)
    pi = np.exp(logp)
    adv = rewards - (pi * rewards).sum(-1, keepdims=True)
    exact_change = entropy(logits + eta * adv) - entropy(logits)
    centred = logp - (pi * logp).sum(-1, keepdims=True)
    predicted = -eta * (pi * centred * adv).sum(-1)
    return exact_change, predicted
