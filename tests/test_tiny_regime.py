"""The tiny tier's regime: a task whose prior puts the tokens RL must raise where its recipe says (independent slip
pairs of operand digits, gpu.tiny_char.slip_table), the task's reward-relevant positions, and the two named priors
placing those tokens below pi_old 0.2 (exploration, DAPO Fig. 3a) or above it (sharpening)."""
import os
import random

import pytest
import torch

from gpu import models, tiny_char
from gpu.data import column_addition, encode_prompt, relevant_token_ids
from spec.regime import EXPLORATION_P_OLD, EXPLORE_SETTINGS, TINY_CHAR_PRIORS


def test_a_slipped_column_writes_its_digit_off_by_the_pairs_offset_and_keeps_its_carry():
    # 347 + 285 with the units pair (7, 5) off by 3: 12 -> written 5, carry 1 kept; tens 4+8+1 = 13; hundreds 6
    assert column_addition(347, 285, 3, digit_slip=lambda x, y: 3 if (x, y) == (7, 5) else 0) == "513160\\boxed{635}"
    # 105 + 201 with the hundreds pair (1, 2) off by 9: 3 -> 2 (mod 10), read off into the answer's first digit
    assert column_addition(105, 201, 3, digit_slip=lambda x, y: 9 if (x, y) == (1, 2) else 0) == "600020\\boxed{206}"


def test_the_slip_table_is_seeded_and_within_the_recipe():
    sft = {"seed": 3, "slip_pairs": 40, "slip_right": [0.01, 0.4], "slip_spread": 1}
    table = tiny_char.slip_table(sft)
    assert len(table) == 40 and table == tiny_char.slip_table(dict(sft))
    assert all(0.01 <= p <= 0.4 and len(offsets) == 1 and 1 <= offsets[0] <= 9 for p, offsets in table.values())
    assert tiny_char.slip_table({**sft, "seed": 4}) != table
    spread = tiny_char.slip_table({**sft, "slip_spread": 5})
    assert all(len(set(offsets)) == 5 and set(offsets) <= set(range(1, 10)) for _, offsets in spread.values())


def test_demonstrations_write_a_slip_pairs_right_digit_at_its_rate_and_a_clean_pair_always():
    rng, n = random.Random(0), 4000
    slips = {(7, 5): (0.25, (3,))}
    firsts = [tiny_char.demonstration(347, 285, 3, rng, {}, 0.0, slips)[0] for _ in range(n)]
    right = firsts.count("2") / n  # 7 + 5 = 12: the right digit 2, the slip 5
    assert set(firsts) == {"2", "5"} and abs(right - 0.25) < 5 * (0.25 * 0.75 / n) ** 0.5
    assert {tiny_char.demonstration(111, 222, 3, rng, {}, 0.0, slips) for _ in range(50)} == {"303030\\boxed{333}"}
    spread = [tiny_char.demonstration(347, 285, 3, rng, {}, 0.0, {(7, 5): (0.1, (3, 5))})[0] for _ in range(n)]
    for digit, share in (("2", 0.1), ("5", 0.45), ("7", 0.45)):  # the wrong mass split evenly over 2 + 3, 2 + 5
        assert abs(spread.count(digit) / n - share) < 5 * (share * (1 - share) / n) ** 0.5


def test_the_reward_relevant_tokens_are_the_addition_tasks_digits():
    tok = tiny_char.char_tokenizer()
    ids = relevant_token_ids(tok, "addition")
    assert sorted(tok.convert_ids_to_tokens(ids.tolist())) == list("0123456789")
    assert relevant_token_ids(tok, "gsm8k") is None


def _right_digit_probs(setting: str):
    """The model's probability of the right sum digit in the units column, per operand pair, over 4 prompts each
    (one forward pass), and the recipe's slip table; skipped when the model is not built (but with
    CLIPLAB_REQUIRE_TINY=1)."""
    from transformers import AutoModelForCausalLM
    recipe = models.TINY_CHAR_RECIPES[setting]
    try:
        path = models.tiny_char_path(recipe=recipe)
    except ValueError as e:
        if os.environ.get("CLIPLAB_REQUIRE_TINY"):
            raise
        pytest.skip(str(e))
    model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), models.load_tokenizer(path)
    rng, rows, pairs = random.Random(0), [], []
    for x in range(10):
        for y in range(10):
            for _ in range(4):
                rows.append(encode_prompt(tok, f"{rng.randint(10, 99) * 10 + x}+{rng.randint(10, 99) * 10 + y}"))
                pairs.append((x, y))
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor(rows)).logits[:, -1].float(), -1)
    digit = tok.convert_tokens_to_ids([str(d) for d in range(10)])
    by_pair = {}
    for i, (x, y) in enumerate(pairs):
        by_pair.setdefault((x, y), []).append(float(p[i, digit[(x + y) % 10]]))
    table = tiny_char.slip_table(tiny_char.load_recipe(recipe)["sft"])
    return {k: sum(v) / len(v) for k, v in by_pair.items()}, table


def test_each_named_prior_has_a_recipe_and_an_exploration_setting():
    assert set(models.TINY_CHAR_RECIPES) == set(TINY_CHAR_PRIORS)
    assert sorted(TINY_CHAR_PRIORS.values()) == sorted(EXPLORE_SETTINGS)  # one prior per setting of the axis


@pytest.mark.parametrize("setting, below", [("tiny_char", True), ("tiny_char_sharpening", False)])
def test_each_prior_puts_the_right_digit_of_its_slip_pairs_where_its_setting_says(setting, below):
    probs, table = _right_digit_probs(setting)
    slip = [probs[k] for k in table]
    clean = sorted(probs[k] for k in probs if k not in table)
    assert clean[len(clean) // 10] >= 0.9  # nine in ten clean pairs are right with probability 0.9 or more
    placed = [(p < EXPLORATION_P_OLD) == below for p in slip]
    assert sum(placed) >= 0.8 * len(slip)
