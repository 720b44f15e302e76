"""The transformers engine: tokens, EOS handling and sampling log-probs equal to the trainer's; the gap metric and
truncated importance sampling."""
import json

import torch

from gpu.batch import build_batch, token_logprobs
from gpu.config import from_dict
from gpu.models import load_policy, load_tokenizer
from gpu.rollout import HFEngine, logprob_gap, tis_weights
from gpu.train import Trainer
from gpu_helpers import tiny_config, tiny_path  # noqa: F401  (fixture)


def test_hf_engine_logprobs_are_the_trainers(tiny_path):
    model, tok = load_policy(tiny_path), load_tokenizer(tiny_path)
    eng = HFEngine(model, tok)
    ro = eng.generate([[1, 20, 21], [1, 30, 31, 32, 33]], n=3, max_new_tokens=12, temperature=0.8, seed=0)
    assert len(ro) == 6 and ro.prompt_ids[0] == [1, 20, 21] and ro.prompt_ids[5] == [1, 30, 31, 32, 33]
    for ids, lp, tr in zip(ro.completion_ids, ro.logprobs, ro.truncated):
        assert len(ids) == len(lp) and (tr == (tok.eos_token_id not in ids))
        assert tok.eos_token_id not in ids[:-1]  # cut at the first end-of-sequence token
    b = build_batch(ro, tok.pad_token_id)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b, chunk=5, temperature=0.8)
    gap = logprob_gap(b.engine_logp, lp, b.mask)
    assert gap["gap_max_abs"] < 1e-3 and abs(gap["gap_kl"]) < 1e-6
    again = eng.generate([[1, 20, 21]], n=2, max_new_tokens=6, temperature=0.8, seed=4)
    assert again.completion_ids == eng.generate([[1, 20, 21]], n=2, max_new_tokens=6, temperature=0.8,
                                                seed=4).completion_ids


def test_truncated_importance_weights():
    train = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    engine = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = tis_weights(train, engine, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))  # ratio 2 capped at 1.5; padding gets 0


def test_tis_correction_runs_in_the_loop(tmp_path, tiny_path):
    tr = Trainer(from_dict(tiny_config(tmp_path / "tis", "grpo", steps=1, rollout={"tis_cap": 2.0},
                                       algo={"hp": {"beta": 0.0}})))
    tr.fit()
    m = json.loads((tr.out / "metrics.jsonl").read_text())
    assert m["gap_mean_abs"] < 1e-3 and m["loss"] == m["loss"]
