"""Rollouts packed into training tensors: a hand-worked layout (right padding, the completion mask shifted by one
for the predicted tokens, the engine's log-probs under the positions that predict them)."""
import torch

from gpu.batch import build_batch
from gpu.rollout import Rollouts


def test_a_hand_worked_batch():
    ro = Rollouts([[5, 6], [4]], [[7, 8, 9], []], [[-1.0, -2.0, -3.0], []], [False, True])
    b = build_batch(ro, pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [4, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert b.completion_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]]
    assert b.mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 0]]  # position t predicts token t + 1
    assert b.engine_logp.tolist() == [[0, -1, -2, -3], [0, 0, 0, 0]]
    assert b.input_ids.dtype == b.attention_mask.dtype == torch.long and b.mask.dtype == b.engine_logp.dtype
    sub = b.rows(torch.tensor([1]))  # trimmed to its longest sequence
    assert sub.input_ids.tolist() == [[4]] and sub.mask.shape == (1, 0)
