"""The tiny character-level model: its task (column addition with a scratchpad) and reward, its recipe file and
tokenizer, deterministic cached pretraining, the one-line errors, and the properties of the pretrained prior."""
import copy
import os
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gpu import models, tiny_char
from gpu.config import from_dict
from gpu.data import addition, column_addition, load_problems
from gpu.rewards import extract_answer, score
from spec.regime import EXPLORATION_P_OLD

SMALL = {"model": {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64, "max_positions": 64},
         "task": {"format": "addition", "digits": 2},
         "sft": {"seed": 0, "steps": 3, "batch": 8, "lr": 1.0e-3, "warmup": 1, "weight_decay": 0.0, "threads": 1,
                 "malformed": 0.0, "carry_slip": {10: 0.5}, "slip_pairs": 2, "slip_right": [0.1, 0.3], "slip_spread": 2}}


def write_recipe(path, recipe):
    import yaml
    path.write_text(yaml.safe_dump(recipe))
    return path


# -- the task -------------------------------------------------------------------------------------------------------
def test_column_addition_worked_by_hand():
    # 347 + 285: units 7+5 = 12 (digit 2, carry 1); tens 4+8+1 = 13 (3, 1); hundreds 3+2+1 = 6 (6, 0): 632
    assert column_addition(347, 285, 3) == "213160\\boxed{632}"
    # 999 + 999: 18 (8, 1), 19 (9, 1), 19 (9, 1), and the last carry leads the answer: 1998
    assert column_addition(999, 999, 3) == "819191\\boxed{1998}"
    # dropping every carry of a column summing to 12: units 7+5 = 12 (2, dropped); tens 4+8 = 12 (2, dropped);
    # hundreds 3+2 = 5: the answer 522 is read off the written digits
    assert column_addition(347, 285, 3, lambda s: s != 12) == "202050\\boxed{522}"
    # dropping only a column summing to 13: units 12 (2, 1); tens 4+8+1 = 13 (3, dropped); hundreds 5: 532
    assert column_addition(347, 285, 3, lambda s: s != 13) == "213050\\boxed{532}"


@given(st.integers(2, 5), st.data())
def test_the_worked_answer_is_the_sum_and_dropping_every_carry_gives_the_digitwise_sum(digits, data):
    a = data.draw(st.integers(10 ** (digits - 1), 10 ** digits - 1))
    b = data.draw(st.integers(10 ** (digits - 1), 10 ** digits - 1))
    assert extract_answer(column_addition(a, b, digits)) == str(a + b)
    digitwise = sum(((a // 10 ** i + b // 10 ** i) % 10) * 10 ** i for i in range(digits))
    assert extract_answer(column_addition(a, b, digits, lambda s: False)) == str(digitwise)


def test_addition_problems_have_operands_of_the_asked_digits_and_gold_sums():
    probs = load_problems("addition", n=50, digits=3, seed=4)
    assert probs == addition(50, 3, 4) and len({p.id for p in probs}) == 50
    for p in probs:
        a, b = p.question.split("+")
        assert len(a) == len(b) == 3 and int(p.answer) == int(a) + int(b)
    with pytest.raises(ValueError, match="addition: expected n >= 1"):
        addition(0)


def test_answers_count_only_in_boxed_for_the_addition_task():
    # the scratchpad is digits: without \boxed{} the completion gives no answer (DCPO: -1), not its last number
    assert extract_answer("213160") == "213160" and extract_answer("213160", boxed_only=True) is None
    rewards, correct = score(["213160\\boxed{632}", "213160", "213150\\boxed{532}"], ["632"] * 3, "dcpo",
                             boxed_only=True)
    assert rewards.tolist() == [1.0, -1.0, 0.0] and correct.tolist() == [1.0, 0.0, 0.0]


# -- recipe and tokenizer -------------------------------------------------------------------------------------------
def test_the_committed_recipe_loads():
    recipe = tiny_char.load_recipe()
    assert recipe["task"]["format"] in tiny_char.FORMATS and recipe["sft"]["slip_pairs"]


def test_a_recipe_with_an_unknown_task_format_names_the_file(tmp_path):
    bad = copy.deepcopy(SMALL)
    bad["task"]["format"] = "countdown"
    path = write_recipe(tmp_path / "r.yaml", bad)
    with pytest.raises(ValueError, match=r"r\.yaml: task\.format: unknown task format 'countdown'; expected one of "
                                         r"addition") as e:
        tiny_char.load_recipe(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("section, field, value, match", [
    ("sft", "lr", -1, "sft.lr: expected"), ("model", "heads", 3, "model.heads"),
    ("sft", "carry_slip", {9: 0.5}, "sft.carry_slip: expected column sums 10..19"),
    ("sft", "carry_slip", {10: 1.5}, r"sft.carry_slip.10: expected a finite number in \[0, 1\]"),
    ("task", "extra", 1, "task: expected the fields"),
    ("sft", "slip_right", [0.3, 0.1], r"sft.slip_right: expected \[low, high\] with 0 < low <= high <= 1"),
    ("sft", "slip_pairs", 101, "sft.slip_pairs: expected")])
def test_bad_recipe_fields_are_one_line_errors_naming_file_and_field(tmp_path, section, field, value, match):
    bad = copy.deepcopy(SMALL)
    bad[section][field] = value
    with pytest.raises(ValueError, match=match) as e:
        tiny_char.load_recipe(write_recipe(tmp_path / "bad.yaml", bad))
    assert str(e.value).startswith(str(tmp_path / "bad.yaml")) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="missing.yaml: cannot read it"):
        tiny_char.load_recipe(tmp_path / "missing.yaml")


def test_the_char_tokenizer_has_one_token_per_character_and_survives_a_save(tmp_path):
    tok = tiny_char.char_tokenizer()
    text = "347+285\n213160\\boxed{632}"
    assert len(tok(text).input_ids) == len(text) and tok.decode(tok(text).input_ids) == text
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # AutoTokenizer reads the model type
    again = models.load_tokenizer(tmp_path)
    assert again(text).input_ids == tok(text).input_ids and again.eos_token_id == tok.eos_token_id


# -- pretraining: deterministic, cached, named when missing ---------------------------------------------------------
def test_pretraining_is_deterministic_and_the_seed_matters(tmp_path):
    recipe = tiny_char.check_recipe(copy.deepcopy(SMALL))
    tiny_char.pretrain(tmp_path / "a", recipe)
    tiny_char.pretrain(tmp_path / "b", recipe)
    other = copy.deepcopy(recipe)
    other["sft"]["seed"] = 1
    tiny_char.pretrain(tmp_path / "c", other)
    weights = [(tmp_path / k / "model.safetensors").read_bytes() for k in "abc"]
    assert weights[0] == weights[1] != weights[2]
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_the_checkpoint_is_cached_under_the_recipe_hash_and_a_missing_one_names_the_command_to_build_it(tmp_path):
    recipe = write_recipe(tmp_path / "small.yaml", SMALL)
    with pytest.raises(ValueError, match=r"model.name: 'tiny_char' is not pretrained yet .*`python -c .*build=True\)'`") \
            as e:
        models.tiny_char_path(tmp_path / "cache", recipe)
    assert "\n" not in str(e.value)
    built = models.tiny_char_path(tmp_path / "cache", recipe, build=True)
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert models.tiny_char_path(tmp_path / "cache", recipe) == built  # found, not rebuilt
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp
    changed = copy.deepcopy(SMALL)
    changed["sft"]["steps"] = 4
    assert tiny_char.recipe_key(tiny_char.check_recipe(changed)) not in built.name


def test_a_config_asking_for_tiny_char_without_its_checkpoint_names_the_make_target(tmp_path):
    raw = {"run": {"out_dir": str(tmp_path / "run")}, "model": {"name": "tiny_char", "cache_dir": str(tmp_path)},
           "data": {"source": "addition", "digits": 3}}
    with pytest.raises(ValueError, match="make tiny-model"):
        from_dict(raw)


def test_the_trainer_runs_the_addition_task_on_a_char_model(tmp_path):
    from gpu.train import Trainer
    recipe = tiny_char.check_recipe(copy.deepcopy(SMALL))
    tiny_char.pretrain(tmp_path / "model", recipe)
    raw = {"run": {"out_dir": str(tmp_path / "run"), "steps": 1, "progress": False, "threads": 1},
           "model": {"name": str(tmp_path / "model")}, "data": {"source": "addition", "digits": 2, "n": 8},
           "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16}, "algo": {"name": "dcpo"}}
    m = Trainer(from_dict(raw)).train_step()
    assert m["step"] == 1 and m["trained"] == 4 and -1.0 <= m["reward"] <= 1.0
    assert 0 <= m["malformed"] <= 1 and m["entropy_relevant"] >= 0  # the digits of the addition task


# -- the prior's properties, on the cached checkpoint ----------------------------------------------------------------
@pytest.fixture(scope="module")
def prior():
    """The properties of the pretrained tiny_char model (configs/tiny/model.yaml, the exploration prior) on 200
    prompts; skipped when it is not built, except under CLIPLAB_REQUIRE_TINY=1."""
    from transformers import AutoModelForCausalLM

    from gpu.prior import prior_properties
    try:
        path = models.tiny_char_path()
    except ValueError as e:
        if os.environ.get("CLIPLAB_REQUIRE_TINY"):
            raise
        pytest.skip(str(e))
    torch.manual_seed(0)
    random.seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    return prior_properties(model, models.load_tokenizer(path), tiny_char.load_recipe()["task"]["digits"],
                            prompts=200, group=4)


def test_the_prior_is_well_formatted(prior):
    assert prior["malformed"] <= 0.01


def test_the_prior_starts_with_headroom_and_spreads_accuracy_across_prompts(prior):
    assert 0.2 <= prior["accuracy_exact"] <= 0.5
    assert prior["share_hard"] >= 0.1 and prior["share_easy"] >= 0.1
    # the exact per-prompt accuracy and the sampled one measure the same thing
    assert abs(prior["accuracy_exact"] - prior["accuracy_sampled"]) < 0.08


def test_hard_prompts_go_wrong_at_a_few_high_entropy_decision_tokens_with_the_right_one_an_exploration_token(prior):
    assert prior["hard_prompts"] >= 3
    assert 1 <= prior["decision_tokens_mean"] <= 3
    # the exploration prior spreads a slip pair's wrong mass over 5 digits: the likeliest of them holds about a fifth
    assert 0.1 <= prior["decision_chosen_prob_mean"] <= 0.35
    assert 0.005 <= prior["decision_right_prob_median"] < EXPLORATION_P_OLD


def test_most_of_the_prior_entropy_is_in_reasoning_and_answer_tokens(prior):
    assert prior["entropy_share_reasoning"] + prior["entropy_share_answer"] >= 0.8
