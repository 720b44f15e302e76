"""verl 0.9.1's FSDP2 actor engine on the CPU, one process (gloo): ``forward_backward_batch`` with verl's
``ppo_loss`` and a cliplab loss mode on a fixed batch in two micro-batches, the gradient saved to OUT/NAME.pt. What verl needs to get this
far without a GPU is set up here and listed in tests/test_verl_actor_cpu.py.

Usage: python tests/verl_actor_worker.py OUT LOSS_MODE CLIP_LOW CLIP_HIGH"""
import contextlib
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

B, MICRO, W, LENGTHS, PROMPT = 4, 2, 6, (6, 1, 2, 3), (1, 2, 3)  # two micro-batches of one group: 7 and 5 tokens


def batch():
    """Responses of 6, 1, 2 and 3 tokens; one advantage per response; old log-probs near the tiny model's."""
    rng = np.random.default_rng(0)
    responses = torch.as_tensor(rng.integers(4, 60, (B, W)))
    mask = torch.as_tensor([[1] * n + [0] * (W - n) for n in LENGTHS])
    old = torch.as_tensor(rng.normal(-4.1, 0.3, (B, W)), dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])[:, None] * mask
    return torch.tensor([PROMPT] * B), responses, mask, old, adv


def cpu_platform():
    """verl has no CPU platform (it falls back to 'nvidia'): one for its platform registry, gloo collectives."""
    from verl.plugin.platform.platform_base import PlatformBase

    def nothing(*args, **kwargs):
        return None

    class CPU(PlatformBase):
        device_name, vendor_name, device_module = "cpu", "cpu", torch.cpu
        set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = nothing
        cudart = nothing

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CPU_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False
    return CPU()


def main(out: str, loss_mode: str, low: str, high: str):
    os.environ.update(VERL_ENGINE_DEVICE="cuda", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(29700 + os.getpid() % 200), HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    from verl.plugin.platform.platform_manager import set_platform
    set_platform(cpu_platform())
    import verl.models.transformers.monkey_patch as patches
    patches.is_trl_available = lambda: False  # its TRL value-head patch imports a class TRL 1.16 no longer has
    torch.distributed.init_process_group("gloo")

    from verl import DataProto
    from verl.trainer.config.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.config.actor import ActorConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    import gpu.integrations.verl_plugin  # noqa: F401 (registers the cliplab loss modes)
    from harness.conform.targets.trl import _saved_copy

    engine = EngineRegistry.new(
        model_type="language_model", backend="fsdp2",
        model_config=HFModelConfig(path=_saved_copy(0), use_remove_padding=True,
                                   override_config={"attn_implementation": "sdpa"}),
        engine_config=FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", dtype="float32", use_torch_compile=False,
                                       mixed_precision=dict.fromkeys(("param_dtype", "reduce_dtype", "buffer_dtype"),
                                                                     "fp32"),  # verl's default computes in bf16
                                       use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO),
        optimizer_config=FSDPOptimizerConfig(lr=1.0, optimizer="SGD"), checkpoint_config=CheckpointConfig())
    engine.initialize()

    prompt, responses, mask, old, adv = batch()
    attention = torch.cat([torch.ones_like(prompt), mask], 1)
    data = DataProto.from_dict(
        tensors={"prompts": prompt, "responses": responses, "input_ids": torch.cat([prompt, responses], 1),
                 "attention_mask": attention, "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
                 "response_mask": mask, "old_log_probs": old, "advantages": adv},
        meta_info={"temperature": 1.0})
    td = left_right_2_no_padding(data.to_tensordict())  # as RayPPOTrainer._update_actor converts the batch
    tu.assign_non_tensor(td, calculate_entropy=False, global_batch_size=B, use_remove_padding=True,
                         use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO, max_token_len_per_gpu=None,
                         use_fused_kernels=False)  # what TrainingWorker.train_batch injects
    config = ActorConfig(strategy="fsdp2", rollout_n=2, ppo_mini_batch_size=B, ppo_micro_batch_size_per_gpu=MICRO,
                         clip_ratio_low=float(low), clip_ratio_high=float(high), entropy_coeff=0.0,
                         use_kl_loss=False, policy_loss={"loss_mode": loss_mode})
    seen = {}

    def loss_fn(model_output, data, dp_group=None):  # verl's ppo_loss, keeping the log-probs and loss it saw
        seen.setdefault("logp", []).append(no_padding_2_padding(model_output["log_probs"], data).detach().clone())
        loss, metrics = ppo_loss(config, model_output, data, dp_group)
        seen["loss"] = seen.get("loss", 0.0) + float(loss.detach())  # each micro-batch's loss is scaled to the batch
        return loss, metrics
    with engine.train_mode():  # the gradients are zeroed when the context exits
        engine.optimizer_zero_grad()
        engine.forward_backward_batch(td, loss_fn, forward_only=False)
        grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                 for name, p in engine.module.named_parameters()}
    torch.save({"grads": grads, **seen}, os.path.join(out, f"{loss_mode}.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:])
