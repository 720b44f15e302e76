"""Rollouts to padded training tensors, and the per-token forward pass used by every algorithm."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .logprobs import sequence_logprobs
from .rollout import Rollouts


@dataclass
class Batch:
    """Right-padded prompt+completion ids [B, L]; token tensors are [B, L-1] (position t predicts token t+1)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor  # [B, L]: 1 on completion tokens
    mask: torch.Tensor  # [B, L-1] float: 1 where a completion token is predicted
    engine_logp: torch.Tensor  # [B, L-1]: the sampling engine's log-probs, 0 elsewhere

    def rows(self, idx) -> "Batch":
        """The sub-batch of the given rows, trimmed to its longest sequence."""
        L = int(self.attention_mask[idx].sum(1).max())
        return Batch(self.input_ids[idx, :L], self.attention_mask[idx, :L], self.completion_mask[idx, :L],
                     self.mask[idx, :L - 1], self.engine_logp[idx, :L - 1])


def build_batch(ro: Rollouts, pad_id: int, device="cpu") -> Batch:
    """Pack rollouts into tensors (prompt then completion, padded on the right), each built in one call."""
    n = torch.tensor([len(p) for p in ro.prompt_ids])
    end = n + torch.tensor([len(c) for c in ro.completion_ids])
    L = int(end.max())
    ids = torch.tensor([p + c + [pad_id] * (L - len(p) - len(c)) for p, c in zip(ro.prompt_ids, ro.completion_ids)])
    elp = torch.tensor([[0.0] * (len(p) - 1) + list(lp) + [0.0] * (L - len(p) - len(lp))
                        for p, lp in zip(ro.prompt_ids, ro.logprobs)], dtype=torch.float32)
    pos = torch.arange(L)
    att = (pos < end[:, None]).long()
    comp = att * (pos >= n[:, None])
    mask = comp[:, 1:].float()
    return Batch(ids.to(device), att.to(device), comp.to(device), mask.to(device), elp.to(device))


def token_logprobs(model, b: Batch, chunk: int, temperature: float = 1.0):
    """(logp, entropy) [B, L-1] of the batch's completion tokens under ``model`` at the sampling temperature."""
    return sequence_logprobs(model, b.input_ids, b.attention_mask, b.completion_mask, chunk=chunk,
                             temperature=temperature)


def completion_values(value_model, b: Batch) -> torch.Tensor:
    """Critic values [B, L-1] aligned with the token tensors (the state before each predicted token)."""
    return value_model(b.input_ids, b.attention_mask)[:, :-1] * b.mask


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A sequence reward placed on each row's last completion token ([B] -> [B, T])."""
    out = torch.zeros_like(mask)
    pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, pos, torch.full_like(pos, -1)).amax(1)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = rewards[rows].to(out.dtype)
    return out
