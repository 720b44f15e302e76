"""TRL's RLOOTrainer: its loss through the trainer's own ``_compute_loss`` and its leave-one-out advantage through
``_generate_and_score_completions`` (generation replaced by the batch's completions), on the tiny random Qwen2
model of the ``trl`` target."""
from __future__ import annotations

import functools

import numpy as np
import torch

from harness.conform.cases import Batch, Check, batch_of, tolerance_of
from harness.conform.targets import reference as ref
from harness.conform.targets.reference import t64
from harness.conform.targets.trl import INSTALL, PROMPT, VOCAB, _import_trl, loss_and_grad, make_trainer, trl_versions

ADV_READS = "adv (rounded: one outcome reward per response), group_size, mask (completion lengths)"


def rloo_trainer(reward=None, **config):
    trl = _import_trl()
    extra = {} if reward is None else {"reward": reward}
    return make_trainer(trainer_cls=trl.RLOOTrainer, config_cls=trl.RLOOConfig, **extra, **config)


def loss_inputs(trainer, b: Batch):
    """What ``_compute_loss`` reads: per-sequence old log-probs sum_t (logp - log r) over the completion mask."""
    ids = torch.as_tensor(b.extra["ids"], dtype=torch.long)
    n = len(ids)
    prompt = torch.tensor([PROMPT] * n, dtype=torch.long)
    mask = torch.as_tensor(b.mask, dtype=torch.long)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt, ids], 1), torch.cat([torch.ones_like(prompt), mask], 1), ids.shape[1])
    logps = logps.to(torch.float64)
    old = logps - t64(b.logp - b.old_logp)
    return {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": ids,
            "completion_mask": mask, "old_logps": (old * mask).sum(1),
            "advantages": t64(b.adv[:, 0] if b.adv.size else np.zeros(n))}, old


def loss_run(trainer):
    def run(b: Batch):
        inputs, old = loss_inputs(trainer, b)
        loss, logps, grad = loss_and_grad(trainer, inputs)
        used = Batch(logps.numpy(), old.numpy(), b.adv, b.mask, logps.numpy(), b.group_size, b.extra)
        return float(loss), grad.numpy() * b.mask, used
    return run


class _Rewards:
    """A reward function that returns the rewards set for the next call, in row order."""

    __name__ = "batch_rewards"

    def __init__(self):
        self.values: list = []

    def __call__(self, completions, **kwargs):
        if len(completions) != len(self.values):
            raise ValueError(f"completions: expected {len(self.values)} (one per reward set), got {len(completions)}")
        return list(self.values)


@functools.lru_cache(maxsize=8)
def _adv_trainer(group_size: int):
    rewards = _Rewards()
    trainer = rloo_trainer(reward=rewards, beta=0.0, num_generations=group_size,
                           per_device_train_batch_size=group_size)
    return trainer, rewards


def advantage_run(b: Batch):
    """RLOO advantages of the batch's rewards: TRL generates nothing, it scores the batch's completions."""
    trainer, rewards = _adv_trainer(b.group_size)
    lens = b.mask.sum(1).astype(int)
    ids = [[int(t) for t in row[:k]] for row, k in zip(b.extra["ids"], lens)]
    prompt = " ".join(f"t{i}" for i in PROMPT)
    trainer._generate = lambda prompts: ([list(PROMPT)] * len(prompts), ids, [" ".join(map(str, i)) for i in ids])
    rewards.values = [float(r) for r in b.rewards]
    try:
        trainer.model.train()
        out = trainer._generate_and_score_completions([{"prompt": prompt}] * len(b.mask))
    finally:
        del trainer._generate
    adv = out["advantages"].to(torch.float64).numpy()
    return adv[:, None] * b.mask, None, b


def _with_ids(b: Batch, seed: int) -> Batch:
    rng = np.random.default_rng(10_000 + seed)
    b.extra["ids"] = rng.integers(0, VOCAB - 4, size=b.mask.shape)
    return b


def loss_batch(seed: int, family: str) -> Batch:
    return _with_ids(batch_of(seed, family, seq_adv=True), seed)


def advantage_batch(seed: int, family: str) -> Batch:
    """Groups of G >= 2 (RLOOConfig refuses fewer) whose rows hold at least one completion token (TRL generates
    none shorter)."""
    b = batch_of(seed, family, min_group=2)
    b.mask[:, 0] = 1.0
    return _with_ids(b, seed)


class Target:
    name = "trl_rloo"
    tolerance = tolerance_of("float32")  # TRL's log-probs are float32 (see the trl target)

    def __init__(self):
        self.versions = trl_versions()
        self.how = ("The loss is RLOOTrainer._compute_loss on a 1-layer random Qwen2 model in float64, train mode, "
                    "old per-sequence log-probs sum_t (logp - log r) laid on the model's log-probs, gradient w.r.t. "
                    "the per-token log-probs the trainer computes (float32 inside TRL, hence the tolerance). The "
                    "advantage is RLOOTrainer._generate_and_score_completions with beta 0 (TRL's default 0.05 "
                    "puts a summed k1 KL into the reward), its generation replaced by the batch's completions and "
                    "a reward function returning the batch's rewards. The registry has no RLOO policy loss: the "
                    "loss rows have no reference and say which variant TRL computes. " + f"Install: {INSTALL}.")

    def checks(self) -> list[Check]:
        out = []
        for eh in (0.2, 0.28):
            cfg = {} if eh == 0.2 else {"epsilon_high": eh}
            cands = [ref.sequence_sum_ratio(0.2, e) for e in (0.2, 0.28)]
            cands += ref.policy_grid(["gspo", "grpo"], {"beta": 0.0, "eps_low": 0.2, "eps_high": eh},
                                     {"agg": ["seq_mean_token_sum", "seq_mean_token_mean", "token_mean"]},
                                     rows_counted=True)
            call = "RLOOTrainer._compute_loss(" + ", ".join(f"{k}={v!r}" for k, v in cfg.items()) + ")"
            out.append(Check("rloo", call, f"epsilon 0.2, epsilon_high {eh:g}" + (" (TRL default)" if not cfg else ""),
                             loss_run(rloo_trainer(**cfg)), None, cands, loss_batch, tolerance=self.tolerance,
                             note="RLOO (2402.14740 Sec. 3) is on-policy REINFORCE on the sequence log-prob; TRL "
                                  "clips the sequence ratio exp(sum_t log r_t) for reuse of a batch (num_iterations)."))
        cands = [ref.group_advantage("grpo", unbiased=u) for u in (True, False)] + [ref.group_advantage("dr_grpo")]
        out.append(Check("rloo_advantage", "RLOOTrainer._generate_and_score_completions", "beta=0.0, one reward "
                         "function, normalize_advantages=False (TRL default)", advantage_run,
                         ref.group_advantage("rloo"), cands, advantage_batch, families=("typical",),
                         tolerance=self.tolerance, reads=ADV_READS))
        return out
