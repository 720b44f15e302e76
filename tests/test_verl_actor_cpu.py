"""The verl plug-in through verl 0.9.1's own actor update on the CPU: the FSDP2 engine's ``forward_backward_batch``
(what ``TrainingWorker.train_batch`` runs through ``engine.train_batch``, before the optimizer step) with verl's
``ppo_loss`` and a cliplab loss mode, in one gloo process (tests/verl_actor_worker.py), the batch of 4 responses in
two micro-batches of 7 and 5 tokens; the accumulated gradient equals autograd through the same model and
gpu.policy_loss on the whole batch.

verl 0.9.1 stops without a GPU here, and the worker gets past each stop as follows:
1. verl/plugin/platform/platform_manager.py:_detect_platform_name falls back to 'nvidia' (verl has no CPU
   platform), so verl/workers/engine/fsdp/utils.py:48 calls init_device_mesh('cuda') and torch's
   torch/cuda/__init__.py:689 raises AttributeError: module 'torch._C' has no attribute '_cuda_setDevice' (a CPU
   build of torch). Worker: a CPU platform (gloo) given to verl's set_platform.
2. verl/workers/engine/base.py:426 raises ValueError: No engine registered for device='cpu', vendor='cpu',
   model_type='language_model', backend='fsdp2' (the FSDP engines register for cuda and npu only). Worker:
   VERL_ENGINE_DEVICE=cuda, verl's override of that look-up.
3. transformers raises ImportError: FlashAttention2 has been toggled on ... (HFModelConfig's default
   attn_implementation, verl/workers/config/model.py:185). Worker: override_config attn_implementation='sdpa'.
4. verl/models/transformers/monkey_patch.py:356 raises ImportError: cannot import name
   'AutoModelForCausalLMWithValueHead' from 'trl' (TRL 1.16 in the same environment has no such class). Worker:
   verl's is_trl_available answers False for that patch.
Past these the engine builds (FSDP2 over one CPU rank), forward_backward_batch runs ppo_loss and the cliplab loss
and calls backward. Not exercised: TrainingWorker itself (a Ray worker: initialize_global_process_group_ray)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl.workers.engine")
pytest.importorskip("trl")

import gpu  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from verl_actor_worker import batch  # noqa: E402


def reference_grads(algorithm, **hp):
    """Autograd through the tiny model (loaded as verl loads it) and gpu.policy_loss on the worker's batch."""
    from transformers import AutoModelForCausalLM

    from harness.conform.targets.trl import _saved_copy
    model = AutoModelForCausalLM.from_pretrained(_saved_copy(0), attn_implementation="sdpa", dtype=torch.float32)
    prompt, responses, mask, old, adv = batch()
    ids = torch.cat([prompt, responses], 1)
    attention = torch.cat([torch.ones_like(prompt), mask], 1)
    logits = model(input_ids=ids, attention_mask=attention,
                   position_ids=(attention.cumsum(1) - 1).clamp(min=0)).logits[:, prompt.shape[1] - 1:-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, responses[..., None])[..., 0]
    loss, _ = gpu.policy_loss(algorithm, logp, old, adv, mask.float(), group_size=2, **hp)
    loss.backward()
    return float(loss.detach()), (logp * mask).detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("loss_mode, clip, algorithm, hp", [
    ("cliplab_dapo_token_mean", (0.2, 0.28), "dapo", {"agg": "token_mean"}),
    ("cliplab_dcpo", (0.16, 0.2), "dcpo", {}),
])
def test_verls_actor_engine_gives_cliplabs_gradient(tmp_path, loss_mode, clip, algorithm, hp):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(REPO / "tests" / "verl_actor_worker.py"), str(tmp_path), loss_mode,
                          *map(str, clip)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    verl = torch.load(tmp_path / f"{loss_mode}.pt")
    loss, logp, want = reference_grads(algorithm, eps_low=clip[0], eps_high=clip[1], **hp)
    assert torch.allclose(torch.cat(verl["logp"]), logp, atol=1e-5)
    assert verl["loss"] == pytest.approx(loss, rel=1e-5)  # the micro-batches' losses add up to the batch's
    got = verl["grads"]
    assert set(got) == set(want)
    a = torch.cat([want[n].flatten() for n in sorted(want)])
    b = torch.cat([got[n].flatten() for n in sorted(want)])
    assert float(a.norm()) > 0 and float((a - b).norm() / a.norm()) < 1e-5, float((a - b).norm() / a.norm())
