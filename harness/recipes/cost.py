"""What a recipe costs on paper: GPU-hours on H100/H200 from its token budget, and memory per GPU under its sharding.

Per RL step with P prompts, G responses each, prompt length Lp and response length Lr (both at their maximum, so
the numbers are upper bounds), N the parameters a token passes through (the active ones for an MoE):

    trained tokens     S = P * G * (Lp + Lr)
    training FLOPs     (6 * epochs + 2 + 2 * ref) * N * S       6N per trained token (Kaplan et al. 2001.08361
                                                                Sec. 2.1), 2N for the old-log-prob forward and 2N
                                                                for the reference forward when a KL term needs it
    prefill FLOPs      2 * N * P * G * Lp
    decode bytes       (P*G / b) * Lr * 2 * N_total  +  P*G * kv * (Lp*Lr + Lr**2 / 2)
                       (weights read once per decode step for b concurrent sequences, bf16; each sequence reads
                       its KV cache, kv bytes per token, at every step)
    GPU-seconds        (training + prefill FLOPs) / (peak * MFU)  +  max(decode bytes / bandwidth,
                                                                         2 * N * P*G*Lr / (peak * MFU))

Memory per GPU when the model states are fully sharded over n GPUs (FSDP / ZeRO-3, mixed precision with fp32
master weights, fp32 gradients and Adam's two moments: 16 bytes per parameter), with gradient checkpointing:
16 * N_total / n + T * hidden * layers * 2 (the checkpointed layer inputs, bf16, T tokens per micro-batch per GPU)
+ T * vocab * 4 (one micro-batch's fp32 logits). The rollout engine, colocated, takes its ``gpu_memory_utilization``
share of the GPU while it generates; verl frees it for training, TRL's colocated vLLM keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Training MFU assumed: Llama 3 (Dubey et al. 2407.21783, Table 4) reports 38-43% BF16 MFU on H100 for dense
#: training with 4D parallelism; 0.40 is its middle. RL training steps of packed, variable-length sequences rarely
#: do better, so treat the hours as a lower bound on the training part.
MFU = 0.40
#: Concurrent sequences per inference engine: vLLM's default ``max_num_seqs`` (256).
DECODE_BATCH = 256


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # dense BF16, FLOP/s
    bandwidth: float   # HBM, bytes/s
    memory: float      # bytes
    source: str


GPUS = {
    "H100": Gpu("H100 SXM", 989e12, 3.35e12, 80e9, "NVIDIA H100 Tensor Core GPU datasheet (SXM: 989 TFLOPS dense "
                "BF16, 3.35 TB/s, 80 GB)"),
    "H200": Gpu("H200 SXM", 989e12, 4.8e12, 141e9, "NVIDIA H200 Tensor Core GPU datasheet (SXM: 989 TFLOPS dense "
                "BF16, 4.8 TB/s, 141 GB)"),
}


@dataclass(frozen=True)
class Model:
    params: float          # all parameters
    active: float          # parameters a token passes through (= params for a dense model)
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    source: str

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


MODELS = {
    "Qwen2.5-Math-7B": Model(7.61e9, 7.61e9, 28, 3584, 4, 128, 152064,
                             "config.json of Qwen/Qwen2.5-Math-7B on the Hugging Face Hub; 7.61B parameters as the "
                             "Qwen2.5-7B model card states"),
    "Qwen2.5-32B": Model(32.5e9, 32.5e9, 64, 5120, 8, 128, 152064,
                         "config.json and model card of Qwen/Qwen2.5-32B on the Hugging Face Hub (32.5B)"),
    "Qwen3-30B-A3B-Base": Model(30.5e9, 3.3e9, 48, 2048, 4, 128, 151936,
                                "config.json and model card of Qwen/Qwen3-30B-A3B-Base on the Hugging Face Hub "
                                "(30.5B total, 3.3B activated)"),
}


@dataclass(frozen=True)
class Budget:
    prompts: int
    group: int
    prompt_len: int
    response_len: int
    steps: int
    epochs: int = 1
    ref: bool = False  # a reference forward per step (KL loss)


def _check(model: str, gpu: str, budget: Budget) -> tuple[Model, Gpu]:
    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    if gpu not in GPUS:
        raise ValueError(f"gpu: expected one of {', '.join(GPUS)}, got {gpu!r}")
    for field in ("prompts", "group", "prompt_len", "response_len", "steps", "epochs"):
        if getattr(budget, field) < 1:
            raise ValueError(f"budget.{field}: expected a positive integer, got {getattr(budget, field)!r}")
    return MODELS[model], GPUS[gpu]


def gpu_hours(model: str, gpu: str, budget: Budget, mfu: float = MFU, decode_batch: int = DECODE_BATCH) -> dict:
    """GPU-hours of the whole run (training, prefill, decode), by the formula of the module docstring."""
    m, g = _check(model, gpu, budget)
    responses = budget.prompts * budget.group
    tokens = responses * (budget.prompt_len + budget.response_len)
    train = (6 * budget.epochs + 2 + 2 * int(budget.ref)) * m.active * tokens
    prefill = 2 * m.active * responses * budget.prompt_len
    lr, lp = budget.response_len, budget.prompt_len
    decode_bytes = responses / decode_batch * lr * 2 * m.params + responses * m.kv_bytes_per_token * (
        lp * lr + lr ** 2 / 2)
    decode_s = max(decode_bytes / g.bandwidth, 2 * m.active * responses * lr / (g.peak_flops * mfu))
    train_s, prefill_s = train / (g.peak_flops * mfu), prefill / (g.peak_flops * mfu)
    per_step = train_s + prefill_s + decode_s
    return {"tokens_per_step": tokens, "train_flops_per_step": train, "decode_bytes_per_step": decode_bytes,
            "train_h": train_s * budget.steps / 3600, "generate_h": (prefill_s + decode_s) * budget.steps / 3600,
            "gpu_hours": per_step * budget.steps / 3600}


def memory_per_gpu(model: str, gpu: str, n_gpus: int, tokens_per_gpu: int, rollout_share: float,
                   engine_resident: bool = False) -> dict:
    """Bytes per GPU while training (sharded states + activations + logits) and while generating (engine share);
    it fits when training fits, beside the engine's share if the engine stays resident (TRL's colocated vLLM)."""
    m, g = _check(model, gpu, Budget(1, 1, 1, 1, 1))
    if n_gpus < 1 or tokens_per_gpu < 1 or not 0 < rollout_share <= 1:
        raise ValueError(f"sharding: expected n_gpus >= 1, tokens_per_gpu >= 1 and 0 < rollout_share <= 1, got "
                         f"{n_gpus}, {tokens_per_gpu}, {rollout_share}")
    states = 16 * m.params / n_gpus
    activations = tokens_per_gpu * m.hidden * m.layers * 2 + tokens_per_gpu * m.vocab * 4
    train = states + activations
    return {"states": states, "activations": activations, "train": train, "rollout": rollout_share * g.memory,
            "fits": train + (rollout_share * g.memory if engine_resident else 0.0) <= g.memory}
