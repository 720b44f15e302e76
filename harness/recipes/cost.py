"""What a recipe costs on paper: estimated GPU-hours on H100/H200 from its token budget, and memory per GPU under its
sharding.

Per RL step with P prompts, G responses each, prompt length Lp and response length Lr (both at their maximum: the
budget's worst case, not a bound on a real run, whose responses are shorter but whose MFU may be lower), T = Lp + Lr
the trained sequence length, N the parameters a token's matrix products use (the active ones for an MoE, less the
input embedding table, a look-up; the untied output head stays in: Kaplan et al. 2001.08361 Table 1 count the
non-embedding parameters and the de-embedding apart), L layers and d the attention width (heads x head_dim):

    causal token pairs   pairs(n) = n (n + 1) / 2 for a sequence of n tokens
    training FLOPs       P*G * [(6 * epochs + 2 + 2 * ref) * N * T  +  (12 * epochs + 4 + 4 * ref) * L * d * pairs(T)]
                         6N per trained token and 12 L d per causal token pair for a forward and backward pass
                         (PaLM, Chowdhery et al. 2204.02311 App. B: 6N + 12 L H Q T per token over T keys, H Q = d;
                         QK^T and AV are 2d each per pair and layer forward, the backward twice that), and a forward
                         (2N, 4 L d) for the old log-probs and one for the reference when a KL term needs it
    prefill FLOPs        P * (2 * N * Lp + 4 * L * d * pairs(Lp))          per prompt: the G samples share its cache
    decode FLOPs         P*G * (2 * N * Lr + 4 * L * d * (Lp * Lr + pairs(Lr)))
    decode bytes         (P*G / b) * Lr * 2 * N_total  +  P*G * kv * (Lp*Lr + Lr**2 / 2)
                         (weights read once per decode step for b concurrent sequences, bf16; each sequence reads
                         its KV cache, kv bytes per token, at every step)
    GPU-seconds          (training + F * prefill FLOPs) / (peak * MFU)  +  F * max(decode bytes / bandwidth,
                                                                                 decode FLOPs / (peak * MFU))

F is the number of responses generated per trained one: 1, except under DAPO's dynamic sampling (2503.14476
Sec. 3.2), which refills the groups whose rewards are all equal and so generates about 1/(1 - their share).

Memory per GPU when the model states are fully sharded over n GPUs (FSDP / ZeRO-3, mixed precision with fp32
master weights, fp32 gradients and Adam's two moments: 16 bytes per parameter), with gradient checkpointing:
16 * N_total / n + T * hidden * layers * 2 (the checkpointed layer inputs, bf16, T tokens per micro-batch per GPU)
+ T * vocab * 4 (one micro-batch's fp32 logits). The rollout engine, colocated, takes its ``gpu_memory_utilization``
share of the GPU while it generates; verl frees it for training, TRL's colocated vLLM keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Training MFU assumed: Llama 3 (Dubey et al. 2407.21783, Table 4) reports 38-43% BF16 MFU on H100 for dense
#: pre-training with 4D parallelism; 0.40 is its middle. RL steps of variable-length sequences may do worse, so the
#: hours are estimates at that MFU, not bounds.
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
    params: float          # all parameters (memory)
    active: float          # parameters a token passes through, embeddings included (= params for a dense model)
    layers: int
    hidden: int
    heads: int             # attention (query) heads
    kv_heads: int
    head_dim: int
    vocab: int
    source: str

    @property
    def matmul_params(self) -> float:
        """N: the active parameters less the input embedding table (every model here has an untied output head)."""
        return self.active - self.vocab * self.hidden

    @property
    def attention_width(self) -> int:
        """d of the attention FLOPs: query heads x head_dim (Qwen2.5's hidden size, twice it for Qwen3-30B-A3B)."""
        return self.heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


MODELS = {
    "Qwen2.5-Math-7B": Model(7.61e9, 7.61e9, 28, 3584, 28, 4, 128, 152064,
                             "config.json of Qwen/Qwen2.5-Math-7B on the Hugging Face Hub (28 layers, hidden 3584, "
                             "28 heads, 4 KV heads, head_dim 3584/28, vocab 152064, untied head); 7.61B parameters "
                             "as the Qwen2.5-7B model card states"),
    "Qwen2.5-32B": Model(32.5e9, 32.5e9, 64, 5120, 40, 8, 128, 152064,
                         "config.json and model card of Qwen/Qwen2.5-32B on the Hugging Face Hub (32.5B; 64 layers, "
                         "hidden 5120, 40 heads, 8 KV heads, head_dim 5120/40, untied head)"),
    "Qwen3-30B-A3B-Base": Model(30.5e9, 3.3e9, 48, 2048, 32, 4, 128, 151936,
                                "config.json and model card of Qwen/Qwen3-30B-A3B-Base on the Hugging Face Hub "
                                "(30.5B total, 3.3B activated: 8 of 128 experts; 48 layers, hidden 2048, 32 heads, "
                                "4 KV heads, head_dim 128, untied head)"),
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


def _check(model: str, gpu: str, budget: Budget, mfu: float = MFU, gen_factor: float = 1.0) -> tuple[Model, Gpu]:
    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    if gpu not in GPUS:
        raise ValueError(f"gpu: expected one of {', '.join(GPUS)}, got {gpu!r}")
    for field in ("prompts", "group", "prompt_len", "response_len", "steps", "epochs"):
        if getattr(budget, field) < 1:
            raise ValueError(f"budget.{field}: expected a positive integer, got {getattr(budget, field)!r}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu: expected a fraction of the peak in (0, 1], got {mfu!r}")
    if not 1 <= gen_factor < float("inf"):
        raise ValueError(f"gen_factor: expected the responses generated per trained one, at least 1, got "
                         f"{gen_factor!r}")
    return MODELS[model], GPUS[gpu]


def _pairs(n: float) -> float:
    """Causal token pairs (query, key) of a sequence of n tokens, each token attending to itself and those before."""
    return n * (n + 1) / 2


def gpu_hours(model: str, gpu: str, budget: Budget, mfu: float = MFU, decode_batch: int = DECODE_BATCH,
              gen_factor: float = 1.0) -> dict:
    """Estimated GPU-hours of the whole run (training, prefill, decode), by the formula of the module docstring;
    ``gen_factor`` responses generated per trained one (F)."""
    m, g = _check(model, gpu, budget, mfu, gen_factor)
    n, ld = m.matmul_params, m.layers * m.attention_width
    responses = budget.prompts * budget.group
    lp, lr = budget.prompt_len, budget.response_len
    tokens = responses * (lp + lr)
    passes = budget.epochs + (1 + int(budget.ref)) / 3  # a forward is a third of a forward and backward
    train_attention = passes * 12 * ld * responses * _pairs(lp + lr)
    train = passes * 6 * n * tokens + train_attention
    prefill = budget.prompts * (2 * n * lp + 4 * ld * _pairs(lp))
    decode = responses * (2 * n * lr + 4 * ld * (lp * lr + _pairs(lr)))
    decode_bytes = responses / decode_batch * lr * 2 * m.params + responses * m.kv_bytes_per_token * (
        lp * lr + lr ** 2 / 2)
    speed = g.peak_flops * mfu
    decode_s = max(decode_bytes / g.bandwidth, decode / speed)
    train_s, prefill_s, decode_s = train / speed, gen_factor * prefill / speed, gen_factor * decode_s
    per_step = train_s + prefill_s + decode_s
    return {"tokens_per_step": tokens, "train_flops_per_step": train, "train_attention_flops_per_step": train_attention,
            "decode_bytes_per_step": decode_bytes, "train_h": train_s * budget.steps / 3600,
            "generate_h": (prefill_s + decode_s) * budget.steps / 3600, "gpu_hours": per_step * budget.steps / 3600}


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
