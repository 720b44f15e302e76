"""The starting policy's properties before RL, on the addition task (gpu.data.addition): how often it is malformed,
how its accuracy spreads across prompts, where it goes wrong on hard prompts, and where its entropy sits. The
exact accuracy of a prompt is the probability of its worked solution (``column_addition``): every slip of a carry
or a digit gives a wrong answer, so the policy is right only along that path, up to slips that cancel."""
from __future__ import annotations

import numpy as np
import torch

from .data import addition, column_addition, encode_prompt
from .rewards import score
from .rollout import HFEngine

BOXED = "\\boxed{"


def token_kinds(completion: str) -> list[str]:
    """The kind of each character of a completion, and of the <eos> after it: 'reasoning' (the scratchpad before
    \\boxed{), 'answer' (what is inside the braces) or 'format' (\\boxed{, the closing brace, <eos>)."""
    head, sep, tail = completion.partition(BOXED)
    answer = tail[:-1] if tail.endswith("}") else tail
    return (["reasoning"] * len(head) + ["format"] * len(sep) + ["answer"] * len(answer)
            + ["format"] * (len(tail) - len(answer)) + ["format"])


def completion_logprobs(model, tok, prompts: list[list[int]], completions: list[str]) -> list[torch.Tensor]:
    """Per row, the log-distributions [len(completion) + 1, V] that predict each completion character and the
    <eos> after it, teacher-forced, in one padded forward pass."""
    rows = [(p, tok(c).input_ids + [tok.eos_token_id]) for p, c in zip(prompts, completions)]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    att = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        att[i, :len(p) + len(c)] = 1
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits.float(), -1)
    return [logp[i, len(p) - 1:len(p) + len(c) - 1] for i, (p, c) in enumerate(rows)]


def _gold_ids(tok, completion: str) -> torch.Tensor:
    return torch.tensor(tok(completion).input_ids + [tok.eos_token_id])


def prior_properties(model, tok, digits: int = 3, prompts: int = 64, group: int = 16, seed: int = 12345,
                     hard: float = 0.1, easy: float = 0.9) -> dict:
    """The four properties of the starting policy, on ``prompts`` held-out problems (``seed``) with ``group``
    samples each at temperature 1:
    - malformed: the share of samples with no \\boxed{} answer (what DCPO's reward scores -1);
    - accuracy: the sampled accuracy, and per prompt the exact one, p(worked solution), with the shares of prompts
      below ``hard`` and above ``easy``, and its quartiles;
    - decision tokens of hard prompts (exact accuracy below ``hard``), along their worked solution: positions
      where the policy's most likely character is not the solution's; their count per prompt, the probability of
      the policy's choice there, and that of the right character;
    - entropy: the share of the sampled completions' entropy in reasoning, answer and format tokens."""
    problems = addition(prompts, digits, seed)
    enc = [encode_prompt(tok, p.question) for p in problems]
    was_training = model.training
    model.eval()
    try:
        ro = HFEngine(model, tok).generate(enc, group, max_new_tokens=4 * digits + 12, temperature=1.0, seed=seed)
        texts = tok.batch_decode(ro.completion_ids, skip_special_tokens=True)
        rewards, correct = score(texts, [p.answer for p in problems for _ in range(group)], "dcpo",
                                 boxed_only=True)
        golds = [column_addition(*map(int, p.question.split("+")), digits) for p in problems]
        gold_lp = completion_logprobs(model, tok, enc, golds)
        sampled_lp = completion_logprobs(model, tok, [p for p in enc for _ in range(group)], texts)
    finally:
        model.train(was_training)
    exact = np.array([float(lp.gather(1, _gold_ids(tok, g)[:, None]).sum().exp()) for lp, g in zip(gold_lp, golds)])
    return {"prompts": prompts, "group": group,
            "malformed": float((rewards == -1).float().mean()),
            "accuracy_sampled": float(correct.mean()), "accuracy_exact": float(exact.mean()),
            "prompt_accuracy_quartiles": [float(q) for q in np.quantile(exact, [0.25, 0.5, 0.75])],
            "share_hard": float((exact < hard).mean()), "share_easy": float((exact > easy).mean()),
            "share_between": float(((exact >= hard) & (exact <= easy)).mean()),
            **_decisions(tok, [(lp, g) for lp, g, a in zip(gold_lp, golds, exact) if a < hard]),
            **_entropy_shares(sampled_lp, texts)}


def _decisions(tok, hard_rows) -> dict:
    """Where hard prompts go wrong along their worked solution (see ``prior_properties``)."""
    counts, chosen, right = [], [], []
    for lp, gold in hard_rows:
        ids = _gold_ids(tok, gold)
        p = lp.exp()
        wrong = torch.nonzero(p.argmax(1) != ids).squeeze(1)
        counts.append(len(wrong))
        chosen += p[wrong].max(1).values.tolist()
        right += p[wrong, ids[wrong]].tolist()
    if not hard_rows:
        return {"hard_prompts": 0}
    return {"hard_prompts": len(hard_rows), "decision_tokens_mean": float(np.mean(counts)),
            "decision_tokens_max": int(max(counts)), "decision_chosen_prob_mean": float(np.mean(chosen or [0])),
            "decision_right_prob_median": float(np.median(right or [0])),
            "decision_right_prob_min": float(min(right or [0]))}


def _entropy_shares(logps, texts) -> dict:
    """The share of the total entropy (summed over sampled tokens) in each token kind."""
    totals = {"reasoning": 0.0, "answer": 0.0, "format": 0.0}
    for lp, text in zip(logps, texts):
        ent = -(lp.exp() * lp).sum(1)
        for kind, h in zip(token_kinds(text), ent.tolist()):
            totals[kind] += h
    whole = sum(totals.values()) or 1.0
    return {f"entropy_share_{k}": v / whole for k, v in totals.items()}
