"""Config validation names the field; --set overrides; data sources and the prompt stream."""
import json
from pathlib import Path

import pytest

from gpu.config import apply_set, from_dict, load_config
from gpu.data import PromptStream, arithmetic, load_local, load_problems

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.run.steps > 0 and cfg.algo.name in path.name


@pytest.mark.parametrize("raw, field", [
    ({"algo": {"name": "trpo"}}, "algo.name"),
    ({"rollout": {"group_size": 1}}, "rollout.group_size"),
    ({"rollout": {"engine": "sglang"}}, "rollout.engine"),
    ({"rollout": {"temperature": 0}}, "rollout.temperature"),
    ({"train": {"lr": "fast"}}, "train.lr"),
    ({"train": {"epochs": 1.5}}, "train.epochs"),
    ({"train": {"minibatch_size": 6}}, "train.minibatch_size"),
    ({"train": {"bogus": 1}}, "train.bogus"),
    ({"bogus": {}}, "bogus"),
    ({"algo": {"name": "grpo", "hp": {"eps_low": -1}}}, "algo.hp.eps_low"),
    ({"algo": {"name": "grpo", "hp": {"epsilon": 0.2}}}, "algo.hp.epsilon"),
    ({"algo": {"name": "grpo", "advantage": "gae"}}, "algo.advantage"),
    ({"algo": {"name": "dpo", "hp": {"eps_low": 0.1}}}, "algo.hp"),
    ({"algo": {"overlong_max_len": 10}}, "algo.overlong_cache_len"),
    ({"algo": {"reward": "nope"}}, "algo.reward"),
    ({"algo": {"gamma": 2}}, "algo.gamma"),
    ({"data": {"source": "gsm8k"}}, "data.path"),
    ({"model": {"dtype": "int8"}}, "model.dtype"),
    ({"run": {"steps": 0}}, "run.steps"),
    ({"run": {"resume": "yes"}}, "run.resume"),
])
def test_bad_fields_raise_naming_the_field(raw, field):
    with pytest.raises(ValueError) as e:
        from_dict(raw)
    assert str(e.value).startswith(field), str(e.value)


def test_defaults_follow_the_registry_and_set_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo: {name: dr_grpo}\nrollout: {max_new_tokens: 33}\n")
    cfg = load_config(p, ["algo.hp.eps_high=0.3", "train.lr=1e-4", "run.out_dir=x"])
    assert cfg.advantage == "dr_grpo" and cfg.reward == "accuracy"
    assert cfg.loss_hparams() == {"eps_high": 0.3, "max_len": 33}  # Dr.GRPO's L defaults to the budget
    assert cfg.train.lr == 1e-4 and cfg.run.out_dir == "x"
    assert from_dict({"algo": {"name": "dcpo"}}).advantage == "sas"
    assert from_dict({"algo": {"name": "ppo"}}).advantage == "gae"
    with pytest.raises(ValueError, match="--set"):
        apply_set({}, "noequals")
    with pytest.raises(ValueError, match="config: no such file"):
        load_config(tmp_path / "missing.yaml")


def test_arithmetic_difficulty_and_answers():
    easy, hard = arithmetic(50, digits=1), arithmetic(50, digits=3, terms=3, ops="+-", seed=1)
    for p in easy:
        a, b = p.question.split("What is ")[1].split("?")[0].split(" + ")
        assert int(a) + int(b) == int(p.answer) and int(a) < 10
    assert max(abs(int(p.answer)) for p in hard) > 100
    assert arithmetic(5, seed=3) == arithmetic(5, seed=3)
    with pytest.raises(ValueError, match="ops"):
        arithmetic(5, ops="/")


def test_local_gsm8k_and_math_layouts(tmp_path):
    g = tmp_path / "g.jsonl"
    g.write_text(json.dumps({"question": "Two plus two?", "answer": "2+2=4\n#### 4"}) + "\n")
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"problem": "Half?", "solution": r"It is $\boxed{\frac{1}{2}}$."}) + "\n")
    assert load_local(g)[0].answer == "4"
    assert load_problems("math", path=str(m))[0].answer == r"\frac{1}{2}"
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match="data.layout"):
        load_local(bad)


def test_prompt_stream_resumes_exactly():
    probs = arithmetic(7)
    a = PromptStream(probs, seed=1)
    a.next(5)
    b = PromptStream(probs, seed=1)
    b.load_state_dict(a.state_dict())
    assert [p.id for p in a.next(9)] == [p.id for p in b.next(9)]
    assert len({p.id for p in PromptStream(probs).next(7)}) == 7  # an epoch visits every problem once


def test_champ_problems_when_installed():
    import importlib.util
    if importlib.util.find_spec("champ_dataset") is None:
        pytest.skip("champ-dataset is not installed")
    probs = load_problems("champ", limit=5)
    assert len(probs) == 5 and all(p.answer and "\\boxed{}" in p.question for p in probs)


def test_damaged_data_files_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"^data.path: .*bad.jsonl' line 2: "):
        load_local(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"^data.path: .*line 1: expected a JSON object"):
        load_local(bad)
    bad.write_text(json.dumps({"question": "no answer"}) + "\n")
    with pytest.raises(ValueError, match=r"^data.path: row 0 of bad.jsonl has no answer"):
        load_local(bad)
    with pytest.raises(ValueError, match=r"^data.path: no such file"):  # at load time, before any model is loaded
        from_dict({"data": {"source": "gsm8k", "path": str(tmp_path / "missing.jsonl")}})


def test_minibatch_larger_than_the_step_names_the_field():
    with pytest.raises(ValueError, match=r"^train.minibatch_size: expected at most .* = 8, got 16$"):
        from_dict({"rollout": {"prompts_per_step": 2, "group_size": 4}, "train": {"minibatch_size": 16}})


def test_engine_not_installed_names_the_field(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=r"^rollout.engine: 'vllm' is not installed"):
        from_dict({"rollout": {"engine": "vllm"}})


def test_data_file_that_does_not_parse_fails_at_load_naming_it(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"^data.path: .*bad.jsonl' line 1: "):
        from_dict({"data": {"source": "gsm8k", "path": str(bad)}})
