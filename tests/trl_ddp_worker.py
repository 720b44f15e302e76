"""One optimiser step's backward of CliplabGRPOTrainer on a fixed global batch, run alone or under ``accelerate
launch``: each process takes its contiguous slice of the batch (as TRL slices the generation batch by process
index), splits it into micro-batches of whole groups (as TRL splits its buffer), weighs them as the trainer's
``_prepare_inputs`` does (``weigh_windows``), and runs one backward per micro-batch through the trainer's
accelerator (DDP over gloo); rank 0 saves the accumulated, averaged gradients to OUT/NAME.pt.

Usage: python tests/trl_ddp_worker.py OUT NAME:MICRO_BATCHES[,NAME:MICRO_BATCHES...] ALGORITHM[:AGG] ..."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.conform.targets.trl import PROMPT, _import_trl, make_trainer  # noqa: E402

ROWS, WIDTH, GROUP = 8, 6, 2
#: unequal tokens per micro-batch and per process, an empty completion, and an empty group (the last)
LENGTHS = (6, 1, 0, 3, 2, 5, 0, 0)


def global_batch():
    rng = np.random.default_rng(7)
    ids = torch.as_tensor(rng.integers(0, 60, (ROWS, WIDTH)))
    mask = torch.as_tensor([[1] * n + [0] * (WIDTH - n) for n in LENGTHS])
    adv = torch.as_tensor([1.0, -0.5, 2.0, -1.0, 0.5, -1.5, 1.0, 0.3])
    return ids, mask, torch.as_tensor(rng.normal(0, 0.3, (ROWS, WIDTH))), adv


def gradients(algorithm: str, agg: str | None, micro_batches: int) -> dict:
    from gpu.integrations.trl_plugin import CliplabGRPOTrainer
    hparams = {} if agg is None else {"agg": agg}
    trainer = make_trainer(CliplabGRPOTrainer, {"algorithm": algorithm, "hparams": hparams}, freeze=False,
                           gradient_accumulation_steps=micro_batches)
    acc = trainer.accelerator
    ids, mask, log_ratio, adv = global_batch()
    prompt = torch.tensor([PROMPT] * ROWS)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt, ids], 1), torch.cat([torch.ones_like(prompt), mask], 1), WIDTH)
    per = ROWS // acc.num_processes
    size = per // micro_batches
    starts = range(acc.process_index * per, (acc.process_index + 1) * per, size)
    batches = [{"prompt_ids": prompt[s:s + size], "prompt_mask": torch.ones_like(prompt[s:s + size]),
                "completion_ids": ids[s:s + size], "completion_mask": mask[s:s + size],
                "advantages": adv[s:s + size].to(logps.dtype),
                "old_per_token_logps": (logps - log_ratio.to(logps.dtype))[s:s + size]} for s in starts]
    trainer.weigh_windows(batches)
    model = acc.prepare_model(trainer.model)
    model.train()
    trainer.model.zero_grad()
    for batch in batches:
        acc.backward(trainer._compute_loss(model, batch))
    return {n: p.grad.detach().clone() for n, p in acc.unwrap_model(model).named_parameters()}


def main(out: str, names: str, *runs: str):
    _import_trl()
    torch.set_num_threads(1)
    for spec in names.split(","):
        name, micro = spec.split(":")
        result = {run: gradients(*(run.split(":") + [None])[:2], int(micro)) for run in runs}
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(result, os.path.join(out, f"{name}.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:])
