"""DAPO dynamic sampling in the real-model loop keeps a group iff 0 < #correct < G (Eq. 11), whatever the overlong
shaping does to the rewards; each completion is verified once, and an answer cut at the limit is counted."""
import json

from gpu.config import from_dict
from gpu.rewards import Verifier
from gpu.rollout import Rollouts
from gpu.train import Trainer
from gpu_helpers import tiny_config, tiny_path  # noqa: F401  (fixture)

SHORT, LONG = r"\boxed{7}", "one two three four five six seven eight " + r"\boxed{7}"
HOSTILE = r"\boxed{9^{9^{9^9}}}"
GROUPS = [[SHORT, SHORT, LONG, SHORT],  # all four correct, one in the overlong buffer: Eq. 11 drops the group
          [SHORT, SHORT, HOSTILE, SHORT]]  # three correct: kept


class Scripted:
    """A rollout engine that answers the k-th prompt of a call with the texts GROUPS[k]."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text):
        return self.tok(text).input_ids + [self.tok.eos_token_id]

    def update(self, model):
        pass

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, seed=None) -> Rollouts:
        ro = Rollouts([], [], [], [])
        for prompt, texts in zip(prompts, GROUPS):
            for text in texts:
                ids = self.encode(text)
                ro.extend(Rollouts([list(prompt)], [ids], [[0.0] * len(ids)], [False]))
        return ro


class Counting(Verifier):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def __call__(self, pred, gold):
        self.calls.append((pred, gold))
        return super().__call__(pred, gold)


def test_groups_are_kept_on_correctness_not_on_shaped_rewards(tmp_path, tiny_path):
    data = tmp_path / "sevens.jsonl"
    data.write_text("".join(json.dumps({"question": f"Seven? ({i})", "answer": "#### 7"}) + "\n" for i in range(4)))
    from gpu.models import load_tokenizer
    engine = Scripted(load_tokenizer(tiny_path))
    short, long = len(engine.encode(SHORT)), len(engine.encode(LONG))
    assert long > short
    raw = tiny_config(tmp_path / "run", "dapo", steps=1, data={"source": "gsm8k", "path": str(data)},
                      rollout={"max_rounds": 1, "gen_batch_factor": 1, "max_new_tokens": 64},
                      algo={"reward": "dapo", "dynamic_sampling": True,
                            "overlong_max_len": long + 1, "overlong_cache_len": long + 1 - short})
    tr = Trainer(from_dict(raw), engine=engine)
    tr.verifier = Counting(timeout=0.5)
    try:
        probs = tr.stream.next(2)
        rewards, correct, malformed = tr._score(engine.generate([[1], [1]], 4, 64), probs)
        assert correct[:4].tolist() == [1.0] * 4 and 0 < rewards[2] < 1 == rewards[0]  # [1, 1, 0.5-ish, 1]
        tr.verifier.calls.clear()
        m = tr.train_step()
    finally:
        tr.verifier.close()
    assert m["generated"] == 8 and m["trained"] == 4  # only the second group, with 0 < #correct < G
    assert m["verify_timeouts"] == 1  # the power tower, cut at the limit, once
    assert sorted(tr.verifier.calls) == [("7", "7"), ("9^{9^{9^9}}", "7")]  # each distinct answer verified once


class EveryKth(Scripted):
    """Answers the n-th prompt it is asked (counting across calls) with a mixed group when n % every == 0, else
    with an all-correct one."""

    def __init__(self, tok, every):
        super().__init__(tok)
        self.every, self.asked = every, 0

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, seed=None) -> Rollouts:
        ro = Rollouts([], [], [], [])
        for prompt in prompts:
            texts = [SHORT, r"\boxed{8}", SHORT, SHORT] if self.asked % self.every == 0 else [SHORT] * 4
            self.asked += 1
            for text in texts[:n]:
                ids = self.encode(text)
                ro.extend(Rollouts([list(prompt)], [ids], [[0.0] * len(ids)], [False]))
        return ro


def test_each_round_samples_three_batches_and_the_step_trains_a_full_one(tmp_path, tiny_path):
    """verl's DAPO recipe: rounds of gen_batch_factor (3) x the step's prompts, at most max_rounds (10), the kept
    groups filling the batch and the surplus dropped; the rounds used and the rows trained are logged."""
    data = tmp_path / "sevens.jsonl"
    data.write_text("".join(json.dumps({"question": f"Seven? ({i})", "answer": "#### 7"}) + "\n" for i in range(64)))
    from gpu.models import load_tokenizer
    tok = load_tokenizer(tiny_path)
    for every, max_rounds, rounds, trained in ((6, 10, 2, 8), (6, 1, 1, 4), (1, 10, 1, 8)):
        raw = tiny_config(tmp_path / f"run{every}{max_rounds}", "dapo", steps=1,
                          data={"source": "gsm8k", "path": str(data)}, rollout={"max_rounds": max_rounds},
                          algo={"reward": "dapo", "dynamic_sampling": True}, train={"minibatch_size": 4},
                          run={"threads": 1})
        cfg = from_dict(raw)
        assert cfg.rollout.gen_batch_factor == 3 and from_dict(tiny_config(tmp_path, "dapo")).rollout.max_rounds == 10
        m = Trainer(cfg, engine=EveryKth(tok, every)).train_step()
        assert (m["rounds"], m["trained"], m["generated"]) == (rounds, trained, rounds * 6 * 4), every
