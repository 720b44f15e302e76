"""Hypothesis strategies for policy-loss batches, to fuzz your own loss with what breaks losses: rows of every
length (empty, one token, full), holes in masks, groups of one or several responses, log-ratios of +-20 nats,
sampling probabilities down to e^-30, and advantages that tie (a whole group equal) or vary per token.

    from hypothesis import given
    from cliplab.strategies import batches

    @given(batches())
    def test_my_loss_matches_the_reference(b):   # b.logp, b.old_logp, b.adv, b.mask, b.ref_logp: [B, T] float64
        ...                                      # b.group_size: G contiguous rows per prompt

Every strategy shrinks towards small, plain batches (one row, one token, zeros)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from harness.conform.cases import Batch

EXTREME = 20.0  # nats: exp(20) ~ 5e8, far outside every clip


def _floats(low: float, high: float):
    return st.floats(low, high, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def masks(draw, rows: int, width: int, holes: bool = True) -> np.ndarray:
    """[rows, width] 0/1 response masks: a prefix of each row (any length from 0 to width), with holes inside a
    row (as multi-turn masks have) when ``holes``."""
    lengths = np.array(draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows)))
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(float)
    if holes and draw(st.booleans()):
        mask *= draw(arrays(bool, (rows, width), elements=st.booleans()))
    return mask


def log_ratios(shape, extreme: bool = True):
    """log(pi / pi_old) per token: small (within +-1), or +-20 nats on some tokens when ``extreme``."""
    elements = (_floats(-1.0, 1.0) | st.sampled_from([-EXTREME, EXTREME])) if extreme else _floats(-1.0, 1.0)
    return arrays(np.float64, shape, elements=elements)


def sampling_logps(shape):
    """log pi_old per token, from 0 (certain) down to -30 (probability e^-30)."""
    return arrays(np.float64, shape, elements=_floats(-30.0, 0.0))


@st.composite
def advantages(draw, prompts: int, group_size: int, width: int, per_token: bool | None = None,
               ties: bool = True) -> np.ndarray:
    """[prompts * group_size, width] advantages: one per response broadcast over its tokens (per_token False), or
    one per token (True); None draws either. With ``ties``, values come from {-1, 0, 1} and whole groups may be
    equal (all zero, as a group whose rewards all tie gets)."""
    rows = prompts * group_size
    per_token = draw(st.booleans()) if per_token is None else per_token
    values = (st.sampled_from([-1.0, 0.0, 1.0]) | _floats(-3.0, 3.0)) if ties else _floats(-3.0, 3.0)
    adv = draw(arrays(np.float64, (rows, width if per_token else 1), elements=values))
    if ties and draw(st.booleans()):
        tied = draw(st.integers(0, prompts - 1))
        adv[tied * group_size:(tied + 1) * group_size] = 0.0
    return np.broadcast_to(adv, (rows, width)).copy()


@st.composite
def batches(draw, max_prompts: int = 3, max_group: int = 4, max_len: int = 6, extreme: bool = True,
            per_token_adv: bool | None = None) -> Batch:
    """A batch of P prompts x G responses (P <= max_prompts, G <= max_group, G contiguous rows per prompt) of up to
    ``max_len`` tokens: masks(), sampling_logps(), log_ratios(), advantages(), and reference log-probs within 1 nat
    of the policy's."""
    prompts, group_size = draw(st.integers(1, max_prompts)), draw(st.integers(1, max_group))
    width, rows = draw(st.integers(1, max_len)), prompts * group_size
    old_logp = draw(sampling_logps((rows, width)))
    logp = old_logp + draw(log_ratios((rows, width), extreme))
    adv = draw(advantages(prompts, group_size, width, per_token_adv))
    ref_logp = logp + draw(arrays(np.float64, (rows, width), elements=_floats(-1.0, 1.0)))
    return Batch(logp, old_logp, adv, draw(masks(rows, width)), ref_logp, group_size)
