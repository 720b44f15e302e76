"""The transformers engine: tokens, EOS handling and sampling log-probs equal to the trainer's; the gap metric and
rollout corrections that act on the engine's log-probs."""
import json

import pytest

import torch

from gpu.batch import build_batch, token_logprobs
from gpu.config import from_dict
from gpu.models import load_policy, load_tokenizer
from gpu.rollout import HFEngine, left_pad, logprob_gap, sample
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


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_rollout_correction_acts_on_the_engine_gap(tmp_path, tiny_path, kind):
    """The engine's own log-probs reach the loss: on-policy generate() matches the trainer to about 1e-5, so TIS
    weights are about 1 and IcePop keeps every token."""
    tr = Trainer(from_dict(tiny_config(tmp_path / kind, "grpo", steps=1,
                                       algo={"hp": {"beta": 0.0, "rollout_correction": kind}})))
    tr.fit()
    m = json.loads((tr.out / "metrics.jsonl").read_text())
    assert m["gap_mean_abs"] < 1e-3 and m["loss"] == m["loss"]
    assert m["rc_weight_mean"] == pytest.approx(1.0, abs=1e-2) and m["rc_cut_frac"] == 0.0


def test_without_an_eos_the_sampler_runs_every_row_to_the_length(tiny_path):
    """eos None (the GPU script's generation rate): a token that would end a row is sampled on past; with it as
    the eos, the same first draw ends that row, and the rest of the row is padding."""
    model, tok = load_policy(tiny_path), load_tokenizer(tiny_path)
    ids, att = left_pad([[1, 20, 21], [1, 40]], tok.pad_token_id)
    torch.manual_seed(5)
    free, lp = sample(model, ids, att, 3, 7, 1.0, tok.pad_token_id, eos=None)
    assert free.shape == lp.shape == (6, 7) and bool(torch.isfinite(lp).all())
    first = int(free[0, 0])
    torch.manual_seed(5)
    stopped, _ = sample(model, ids, att, 3, 7, 1.0, tok.pad_token_id, eos=first)
    assert int(stopped[0, 0]) == first and bool((stopped[0, 1:] == tok.pad_token_id).all())
    assert not bool((free[0, 1:] == tok.pad_token_id).all())


def test_the_sampler_draws_what_transformers_generate_draws(tiny_path):
    """The engine runs each prompt once, repeats its KV cache for its n samples and samples token by token; with the
    same seed it draws the tokens transformers ``generate`` draws with its own expansion (num_return_sequences),
    with the same log-probs."""
    from harness.runs.bench import transformers_generate
    model, tok = load_policy(tiny_path), load_tokenizer(tiny_path)
    prompts = [[1, 20, 21], [1, 30, 31, 32, 33], [1, 40]]
    for temperature, seed in ((0.8, 0), (1.0, 3)):
        ro = HFEngine(model, tok).generate(prompts, n=3, max_new_tokens=12, temperature=temperature, seed=seed)
        seq, lp = transformers_generate(model, tok, prompts, 3, 12, temperature, seed)
        for i, (c, l) in enumerate(zip(ro.completion_ids, ro.logprobs)):
            assert c == seq[i, :len(c)].tolist()
            torch.testing.assert_close(torch.tensor(l), lp[i, :len(c)], rtol=1e-5, atol=1e-5)
