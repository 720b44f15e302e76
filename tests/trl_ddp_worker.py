"""One backward of CliplabGRPOTrainer on a fixed global batch, run alone or under ``accelerate launch``: each
process takes its contiguous slice of the batch (as TRL slices the generation batch by process index), the model is
wrapped by the trainer's accelerator (DDP over gloo), and rank 0 saves the averaged gradients to OUT/NAME.pt.

Usage: python tests/trl_ddp_worker.py OUT NAME ALGORITHM[:AGG] ..."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.conform.targets.trl import PROMPT, _import_trl, make_trainer  # noqa: E402

ROWS, WIDTH, GROUP = 4, 6, 2
LENGTHS = (6, 1, 0, 3)  # unequal tokens per process (7 and 3) and an empty completion on rank 1


def global_batch():
    rng = np.random.default_rng(7)
    ids = torch.as_tensor(rng.integers(0, 60, (ROWS, WIDTH)))
    mask = torch.as_tensor([[1] * n + [0] * (WIDTH - n) for n in LENGTHS])
    return ids, mask, torch.as_tensor(rng.normal(0, 0.3, (ROWS, WIDTH))), torch.as_tensor([1.0, -0.5, 2.0, -1.0])


def gradients(algorithm: str, agg: str | None) -> dict:
    from gpu.integrations.trl_plugin import CliplabGRPOTrainer
    hparams = {} if agg is None else {"agg": agg}
    trainer = make_trainer(CliplabGRPOTrainer, {"algorithm": algorithm, "hparams": hparams}, freeze=False)
    acc = trainer.accelerator
    ids, mask, log_ratio, adv = global_batch()
    prompt = torch.tensor([PROMPT] * ROWS)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt, ids], 1), torch.cat([torch.ones_like(prompt), mask], 1), WIDTH)
    per = ROWS // acc.num_processes
    rows = slice(acc.process_index * per, (acc.process_index + 1) * per)
    inputs = {"prompt_ids": prompt[rows], "prompt_mask": torch.ones_like(prompt[rows]), "completion_ids": ids[rows],
              "completion_mask": mask[rows], "advantages": adv[rows].to(logps.dtype),
              "old_per_token_logps": (logps - log_ratio.to(logps.dtype))[rows]}
    model = acc.prepare_model(trainer.model)
    model.train()
    trainer.model.zero_grad()
    acc.backward(trainer._compute_loss(model, inputs))
    return {n: p.grad.detach().clone() for n, p in acc.unwrap_model(model).named_parameters()}


def main(out: str, name: str, *runs: str):
    _import_trl()
    torch.set_num_threads(1)
    result = {run: gradients(*(run.split(":") + [None])[:2]) for run in runs}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(result, os.path.join(out, f"{name}.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:])
