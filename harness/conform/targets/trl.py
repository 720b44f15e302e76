"""TRL's GRPOTrainer loss, for each loss_type and importance_sampling_level, called through the trainer's own
``_compute_loss`` on a tiny random Qwen2 model built offline (float64). The batch's log-ratios, advantages and
reference offsets are laid on the model's own log-probs; the gradient is d loss / d per-token log-prob."""
from __future__ import annotations

import functools
import tempfile

import numpy as np
import torch

from harness.conform.cases import Batch, Check, batch_of, lay_log_ratio, tolerance_of
from harness.conform.targets import reference as ref
from harness.conform.targets.reference import t64

INSTALL = "pip install trl==1.16.0"
VOCAB, PROMPT = 64, (1, 2, 3)
MAX_COMPLETION = 8  # TRL's max_completion_length: Dr.GRPO's constant L


def _import_trl():
    """Import TRL without its optional vLLM client (conformance never generates; a vLLM build that is installed
    for other reasons costs seconds to import)."""
    from harness.conform.targets import require
    import_utils = require("trl.import_utils", INSTALL)
    import_utils.is_vllm_available = lambda *a, **k: False
    return require("trl", INSTALL)


def trl_versions() -> dict:
    """TRL's, transformers' and torch's versions (importing TRL as ``_import_trl`` does)."""
    trl = _import_trl()
    import transformers
    return {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """A word-level tokenizer over t0..t59 plus pad/eos/unk, trained offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(VOCAB - 4)}
    vocab.update({"<pad>": VOCAB - 4, "<eos>": VOCAB - 3, "<unk>": VOCAB - 2})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(dtype=torch.float64, seed: int = 0):
    """A 1-layer Qwen2 causal LM (hidden 32) with fixed random weights, also saved to a temp folder."""
    model = _build(seed).to(dtype)
    model.config._name_or_path = _saved_copy(seed)  # where GRPOTrainer loads its reference model from (beta > 0)
    return model


def _build(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      pad_token_id=VOCAB - 4, eos_token_id=VOCAB - 3, bos_token_id=VOCAB - 3)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


@functools.lru_cache(maxsize=4)
def _saved_copy(seed: int) -> str:
    folder = tempfile.mkdtemp(prefix="cliplab-tiny-qwen2-")
    model = _build(seed)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def tiny_dataset(n: int = 4):
    from datasets import Dataset
    return Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in PROMPT)] * n})


def grpo_args(trl, config_cls=None, **kw):
    """A GRPOConfig (or ``config_cls``, e.g. RLOOConfig) for CPU, no logging or saving, 2 responses per prompt,
    completions of at most 8 tokens."""
    base = dict(output_dir=tempfile.mkdtemp(prefix="cliplab-trl-"), per_device_train_batch_size=2,
                num_generations=2, max_completion_length=MAX_COMPLETION, report_to=[], use_cpu=True, bf16=False,
                save_strategy="no", logging_strategy="no")
    return (config_cls or trl.GRPOConfig)(**{**base, **kw})


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def make_trainer(trainer_cls=None, trainer_kwargs=None, reward=zero_reward, freeze=True, config_cls=None,
                 **config):
    """A GRPOTrainer (or subclass, or RLOOTrainer with its config class) on the tiny model; frozen, it is ready for
    ``_compute_loss`` outside ``train()`` (the loss then depends on the per-token log-probs only, which is all
    conformance needs)."""
    trl = _import_trl()
    cls = trainer_cls or trl.GRPOTrainer
    trainer = cls(model=tiny_model(), reward_funcs=reward, args=grpo_args(trl, config_cls, **config),
                  train_dataset=tiny_dataset(), processing_class=tiny_tokenizer(), **(trainer_kwargs or {}))
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by train()
    if freeze:
        for p in trainer.model.parameters():
            p.requires_grad_(False)
    return trainer


def trainer_inputs(trainer, batch: Batch, cache: dict | None = None):
    """The inputs ``_compute_loss`` reads, with old and reference log-probs laid on the model's log-probs."""
    ids = torch.as_tensor(batch.extra["ids"], dtype=torch.long)
    n = len(ids)
    prompt = torch.tensor([PROMPT] * n, dtype=torch.long)
    mask = torch.as_tensor(batch.mask, dtype=torch.long)
    key = (ids.numpy().tobytes(), mask.numpy().tobytes(), tuple(ids.shape))
    logps = None if cache is None else cache.get(key)
    if logps is None:
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, torch.cat([prompt, ids], 1), torch.cat([torch.ones_like(prompt), mask], 1),
                ids.shape[1])
        logps = logps.to(torch.float64)
        if cache is not None and len(cache) < 4096:
            cache[key] = logps
    return {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": ids,
            "completion_mask": mask, "advantages": t64(batch.adv[:, 0] if batch.adv.size else np.zeros(n)),
            "old_per_token_logps": t64(lay_log_ratio(logps.numpy(), batch.logp - batch.old_logp)),
            "ref_per_token_logps": logps + t64(batch.ref_logp - batch.logp),
            "num_items_in_batch": mask.sum()}


def loss_and_grad(trainer, inputs):
    """The trainer's loss on ``inputs`` and its gradient w.r.t. the per-token log-probs the trainer computed."""
    original = trainer._get_per_token_logps_and_entropies
    seen = {}

    def capture(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        seen["logps"] = logps.detach().requires_grad_(True)
        return seen["logps"], entropies, aux
    trainer._get_per_token_logps_and_entropies = capture
    try:
        trainer.model.train()
        loss = trainer._compute_loss(trainer.model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies
    loss.backward()
    grad = seen["logps"].grad
    return loss.detach(), seen["logps"].detach(), torch.zeros_like(seen["logps"]) if grad is None else grad


def trl_run(trainer):
    cache: dict = {}

    def run(b: Batch):
        inputs = trainer_inputs(trainer, b, cache)
        loss, logps, grad = loss_and_grad(trainer, inputs)
        used = Batch(logps.numpy(), inputs["old_per_token_logps"].numpy(), b.adv, b.mask,
                     inputs["ref_per_token_logps"].numpy(), b.group_size, b.extra)
        return float(loss), grad.numpy() * b.mask, used
    return run


def trl_batch(seed: int, family: str) -> Batch:
    """A generated batch with one advantage per response (as GRPOTrainer makes) and random completion ids."""
    b = batch_of(seed, family, seq_adv=True)
    rng = np.random.default_rng(10_000 + seed)
    b.extra["ids"] = rng.integers(0, VOCAB - 4, size=b.mask.shape)
    return b


DPO_READS = ("rows 2k (chosen) and 2k + 1 (rejected) of pair k: logp as the policy's per-token log-probs of the "
             "completion, ref_logp summed over each row's mask as the precomputed reference log-probs")


def make_dpo_trainer():
    """A DPOTrainer on the tiny model at DPOConfig's defaults, CPU, no logging or saving; the reference log-probs
    are read from the inputs (``precompute_ref_logps``), as a run with precompute_ref_log_probs=True passes them."""
    trl = _import_trl()
    from datasets import Dataset
    prompt = " ".join(f"t{i}" for i in PROMPT)
    data = Dataset.from_dict({"prompt": [prompt] * 2, "chosen": [" t4 t5"] * 2, "rejected": [" t6"] * 2})
    args = trl.DPOConfig(output_dir=tempfile.mkdtemp(prefix="cliplab-trl-"), per_device_train_batch_size=2,
                         report_to=[], use_cpu=True, bf16=False, save_strategy="no", logging_strategy="no")
    trainer = trl.DPOTrainer(model=tiny_model(), args=args, train_dataset=data, processing_class=tiny_tokenizer())
    trainer.precompute_ref_logps = True
    return trainer


def dpo_run(trainer):
    """The trainer's loss on a batch of pairs as its collator lays them out (every chosen completion, then every
    rejected one, each after the prompt), the model's per-token log-probs replaced by the batch's logp on the
    completion tokens (0 elsewhere, as the fused LM head gives at labels -100); the gradient is d loss / d logp."""
    def run(b: Batch):
        order = np.r_[np.arange(0, len(b.mask), 2), np.arange(1, len(b.mask), 2)]
        mask = torch.as_tensor(b.mask[order], dtype=torch.long)
        n, width = mask.shape
        prompt = torch.tensor([PROMPT] * n, dtype=torch.long)
        ref_seq = t64((b.ref_logp * b.mask)[order].sum(1))
        inputs = {"input_ids": torch.cat([prompt, torch.as_tensor(b.extra["ids"][order])], 1),
                  "attention_mask": torch.cat([torch.ones_like(prompt), mask], 1),
                  "completion_mask": torch.cat([torch.zeros_like(prompt), mask], 1),
                  "ref_chosen_logps": ref_seq[: n // 2], "ref_rejected_logps": ref_seq[n // 2:]}
        leaf = t64(b.logp[order], grad=True)

        def model(**kw):
            out = trainer.model(**kw)
            laid = torch.where(mask > 0, leaf, torch.zeros((), dtype=leaf.dtype))
            out.log_probs = torch.cat([torch.zeros((n, out.log_probs.shape[1] - width), dtype=leaf.dtype), laid], 1)
            return out
        trainer.model.train()
        loss = trainer._compute_loss(model, inputs, return_outputs=False)
        loss.backward()
        grad = np.zeros(b.mask.shape)
        grad[order] = leaf.grad.numpy()
        return float(loss.detach()), grad, b
    return run


def dpo_batch(seed: int, family: str) -> Batch:
    """A generated batch cut to an even number of rows, read as (chosen, rejected) pairs, with completion ids."""
    from harness.conform.targets.openrlhf import pair_batch
    b = pair_batch(seed, family)
    b.extra["ids"] = np.random.default_rng(10_000 + seed).integers(0, VOCAB - 4, size=b.mask.shape)
    return b


class Target:
    name = "trl"
    tolerance = tolerance_of("float32")  # TRL computes log-probs in float32 (trl/kernels/chunked_logprob.py)

    def __init__(self):
        self.versions = trl_versions()
        self.how = ("Each loss is GRPOTrainer._compute_loss on a 1-layer random Qwen2 model in float64, in train "
                    "mode, gradient_accumulation_steps 1, as `train()` calls it; old and reference log-probs are "
                    "the batch's log-ratios laid on the model's log-probs, and the gradient is taken w.r.t. the "
                    "per-token log-probs the trainer computes. TRL computes log-probs in float32 whatever the model's "
                    "dtype, hence the float32 tolerance. "
                    "Not driven: vllm_importance_sampling_mode (token/sequence truncate/mask), whose ratio TRL "
                    "computes inline while generating with vLLM (`_generate_and_score_completions`, use_vllm=True), "
                    "not in the loss; the unsloth target checks the same modes.")

    def _check(self, name, knob, config, ref_hp, grid, names=None, note=""):
        trainer = make_trainer(**config)
        call = "GRPOTrainer._compute_loss(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"
        conv = ref.policy(name, **ref_hp)
        cands = ref.policy_grid(names or [name], {"max_len": MAX_COMPLETION, **ref_hp}, grid, rows_counted=True,
                                exclude=(name, {"max_len": MAX_COMPLETION, **ref_hp}))
        return Check(name, call, knob, trl_run(trainer), conv, cands, trl_batch,
                     exact=ref.exact_policy(name, **ref_hp), note=note, tolerance=self.tolerance)

    def checks(self) -> list[Check]:
        aggs = ["token_mean", "group_token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                "seq_mean_token_sum_norm", "group_seq_sum_token_mean"]
        gspo = {"eps_low": 3e-4, "eps_high": 4e-4}
        tg = {"epsilon": 3e-4, "epsilon_high": 4e-4, "importance_sampling_level": "sequence"}
        kls = ["k3", "k3_unbiased"]
        return [
            self._check("grpo", "loss_type='grpo', TRL defaults (beta 0, epsilon 0.2)", {"loss_type": "grpo"}, {},
                        {"agg": aggs, "beta": [0.04, 0.0]}),
            self._check("grpo", "loss_type='grpo', beta=0.04 (the paper's)", {"loss_type": "grpo", "beta": 0.04}, {},
                        {"agg": aggs, "kl": kls}, note="TRL's use_bias_correction_kl (default True) multiplies the "
                        "k3 term by the importance ratio (DeepSeek-V3.2): its gradient differs from k3's even "
                        "on-policy."),
            self._check("grpo", "loss_type='grpo', beta=0.04, use_bias_correction_kl=True",
                        {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": True}, {"kl": "k3_unbiased"},
                        {"agg": aggs, "kl": kls}),
            self._check("grpo", "loss_type='grpo', beta=0.04, use_bias_correction_kl=False",
                        {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False}, {}, {"agg": aggs}),
            self._check("grpo", "loss_type='grpo', delta=1.5 (two-sided clip), beta 0",
                        {"loss_type": "grpo", "delta": 1.5}, {"delta": 1.5, "beta": 0.0},
                        {"agg": aggs, "delta": [1.5, None]}),
            self._check("cispo", "loss_type='cispo', epsilon_high=4.0", {"loss_type": "cispo", "epsilon_high": 4.0},
                        {}, {"agg": aggs, "cap_mode": ["relative", "absolute"]},
                        note="CISPO's epsilon_high is an absolute cap in TRL, Liger and Unsloth (the weight is at "
                        "most epsilon_high) and a relative one (1 + eps) in MiniMax-M1's Eq. 5, verl and SkyRL."),
            self._check("dr_grpo", f"loss_type='dr_grpo', max_completion_length={MAX_COMPLETION}",
                        {"loss_type": "dr_grpo"}, {"max_len": MAX_COMPLETION}, {"agg": aggs}),
            self._check("dapo", "TRL defaults (loss_type 'dapo', epsilon 0.2, epsilon_high unset)", {}, {},
                        {"agg": aggs, "eps_high": [0.28, 0.2]}),
            self._check("dapo", "loss_type='dapo', epsilon_high=0.28", {"loss_type": "dapo", "epsilon_high": 0.28},
                        {}, {"agg": aggs}),
            self._check("grpo", "loss_type='bnpo' (read as grpo with token_mean)", {"loss_type": "bnpo"},
                        {"beta": 0.0, "agg": "token_mean"}, {"agg": aggs}),
            self._check("sapo", "loss_type='sapo' (temperatures 1.0 / 1.05)", {"loss_type": "sapo"}, {},
                        {"agg": aggs}),
            self._check("gspo", "loss_type='grpo', importance_sampling_level='sequence', epsilon 3e-4/4e-4",
                        {"loss_type": "grpo", **tg}, gspo, {"agg": aggs}, names=["gspo", "gspo_token"]),
            self._check("gspo", "loss_type='dapo', importance_sampling_level='sequence', epsilon 3e-4/4e-4",
                        {"loss_type": "dapo", **tg}, gspo, {"agg": aggs}, names=["gspo", "gspo_token"]),
            self._check("gspo", "loss_type='dr_grpo', importance_sampling_level='sequence', epsilon 3e-4/4e-4",
                        {"loss_type": "dr_grpo", **tg}, gspo, {"agg": aggs}, names=["gspo", "gspo_token"]),
            self._check("luspo", "loss_type='luspo', importance_sampling_level='sequence', epsilon 2e-3/2.5e-3",
                        {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 2e-3,
                         "epsilon_high": 2.5e-3}, {}, {"agg": aggs}, names=["luspo", "gspo"]),
            self._check("vespo", "loss_type='vespo' (k 2 / 3, lambda 3 / 2, token-level weights summed per row)",
                        {"loss_type": "vespo"}, {}, {"agg": aggs},
                        note="TRL's get_gamma_weights clamps each token's log-ratio to [-20, 20] and the row's summed "
                             "log-weight to [log 1e-8, 20] before phi."),
            self._check("grpo", "loss_type='bnpo', off_policy_mask_threshold=0.5 (DeepSeek-V3.2's OPSM)",
                        {"loss_type": "bnpo", "off_policy_mask_threshold": 0.5},
                        {"beta": 0.0, "agg": "token_mean", "opsm_delta": 0.5},
                        {"agg": aggs, "opsm_delta": [0.5, None]}),
            self.gmpo_check(),
            self.dpo_check(),
        ]

    def dpo_check(self) -> Check:
        """DPOTrainer._compute_loss at DPOConfig's defaults (loss_type ['sigmoid'], beta 0.1)."""
        trainer = make_dpo_trainer()
        return Check("dpo", "DPOTrainer._compute_loss(loss_type=['sigmoid'])", "DPOConfig defaults (sigmoid, beta "
                     "0.1)", dpo_run(trainer), ref.dpo(0.1), [ref.dpo(0.1, 0.1), ref.ipo(0.1)], dpo_batch,
                     exact=ref.exact_dpo(0.1), reads=DPO_READS)

    def gmpo_check(self) -> Check:
        """trl.experimental.gmpo's GMPOTrainer._compute_loss at its defaults (epsilon 0.4 in log space, beta 0)."""
        from trl.experimental.gmpo import GMPOConfig, GMPOTrainer
        trainer = make_trainer(trainer_cls=GMPOTrainer, config_cls=GMPOConfig)
        cands = ref.policy_grid(["gmpo"], {}, {"agg": ["seq_mean"]}, rows_counted=True, exclude=("gmpo", {}))
        return Check("gmpo", "experimental.gmpo.GMPOTrainer._compute_loss()", "GMPOConfig defaults (epsilon 0.4 "
                     "in log space, beta 0)", trl_run(trainer), ref.policy("gmpo"), cands, trl_batch,
                     exact=ref.exact_policy("gmpo"), tolerance=self.tolerance,
                     note="TRL averages -coef * A over every completion; an empty one's geometric mean is exp(0 / "
                     "max(0, 1)) = 1, so it adds -A to the loss (no gradient).")
