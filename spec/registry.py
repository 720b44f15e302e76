"""The one registry of algorithm names, defaults, aggregation modes and sources that every layer reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

AGG_MODES: Mapping[str, str] = MappingProxyType({
    "token_mean": "sum_{i,t} l*m / sum_{i,t} m over the whole batch (DAPO as verl, TRL, OpenRLHF implement it)",
    "group_token_mean": "mean over groups of sum_{i in g,t} l*m / sum_{i in g,t} m (DAPO Eq. 8 as written)",
    "seq_mean_token_mean": "mean_i sum_t l*m / |o_i| (GRPO, DeepSeekMath Eq. 3; GSPO-token; SAPO)",
    "seq_mean_token_sum": "mean_i sum_t l*m (DCPO's later readme and paper-time code)",
    "seq_mean_token_sum_norm": "mean_i sum_t l*m / max_len (Dr.GRPO; needs max_len)",
    "group_seq_sum_token_mean": "mean over groups of sum_{i in g} sum_t l*m / |o_i| (DCPO Eq. 8, OTM: no 1/G)",
    "seq_mean": "mean over sequences of a per-sequence loss (GSPO); a per-sequence loss is held broadcast "
                "over its tokens, so this equals seq_mean_token_mean",
})
GROUP_AGG_MODES = frozenset({"group_token_mean", "group_seq_sum_token_mean"})
KL_KINDS = ("k1", "k2", "k3", "k3_unbiased")
#: Rollout corrections for a rollout/trainer mismatch, an option of every policy loss (None = off).
ROLLOUT_CORRECTIONS = ("tis", "mis", "seq_mis", "seq_rs", "geo_rs")
#: The corrections decided per row, by the product of its rho (seq_mis, seq_rs) or their geometric mean (geo_rs).
ROLLOUT_ROW_STATISTIC: Mapping[str, str] = MappingProxyType({
    "seq_mis": "product", "seq_rs": "product", "geo_rs": "geometric_mean"})
#: Rejection sampling (verl's rollout_rs): a row outside [mis_low, mis_high] is masked, the others keep weight 1.
ROLLOUT_REJECTION = frozenset({"seq_rs", "geo_rs"})
#: CISPO's cap on the importance weight: ``1 + eps_high`` (paper, verl, SkyRL) or ``eps_high`` itself with no lower
#: bound (TRL, Liger, Unsloth).
CAP_MODES = ("relative", "absolute")

#: The kinds of clip that read exp(old_logp) as a probability (DCPO's q, DPPO's mu): old_logp must be <= 0.
PROBABILITY_CLIPS = frozenset({"dynamic", "binary_tv", "binary_kl"})
#: DPPO's kinds of clip: a token's trust region measured by a divergence between the current and the old policy
#: restricted to two outcomes, the sampled token or any other (the binary TV or KL).
DIVERGENCE_CLIPS = frozenset({"binary_tv", "binary_kl"})

#: The hyper-parameters each kind of clip reads (Algorithm.clip), each token selection (Algorithm.select), and each
#: rollout correction beyond its name.
CLIP_READS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "fixed": ("eps_low", "eps_high", "dual_clip", "delta"), "dynamic": ("eps_low", "eps_high", "r_max", "dual_clip"),
    "log": ("eps_low", "eps_high"), "soft": ("tau_pos", "tau_neg"), "truncated": ("eps_low", "eps_high", "cap_mode"),
    "binary_tv": ("eps_low", "eps_high"), "binary_kl": ("eps_low", "eps_high"),
    "gamma": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), "off": ()})
SELECT_READS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "clip_cov": ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "cov_seed"), "kl_cov": ("kl_cov_ratio", "kl_cov_coef")})
ROLLOUT_READS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "tis": ("tis_cap",), "mis": ("mis_low", "mis_high"), "seq_mis": ("mis_low", "mis_high"),
    "seq_rs": ("mis_low", "mis_high"), "geo_rs": ("mis_low", "mis_high")})

#: Every hyper-parameter a policy loss accepts, with the meaning users see in errors and --help.
HPARAMS: Mapping[str, str] = MappingProxyType({
    "eps_low": "lower clip width: r >= 1 - eps_low (DCPO: eps in its dynamic lower bound; DPPO: the divergence "
               "threshold for A < 0)",
    "eps_high": "upper clip width: r <= 1 + eps_high (DCPO: eps in its dynamic upper bound; DPPO: the divergence "
                "threshold for A > 0)",
    "beta": "weight of the per-token KL penalty added to the loss (0 = none)",
    "kl": "KL estimator for the penalty: k1, k2, k3 or k3_unbiased (r * k3, DeepSeek-V3.2)",
    "agg": "aggregation mode, one of " + ", ".join(AGG_MODES),
    "max_len": "constant L for seq_mean_token_sum_norm (the generation budget)",
    "tau_pos": "SAPO gate temperature for positive advantages",
    "tau_neg": "SAPO gate temperature for negative advantages",
    "r_max": "DCPO cap on the ratio bound (and its dual clip)",
    "dual_clip": "dual-clip constant c: for A < 0, loss <= -c*A (None = off; DCPO: follows r_max)",
    "delta": "two-sided clip of fixed-clip losses (INTELLECT-2): r capped at delta > 1 + eps_high (None = off)",
    "cap_mode": "CISPO's weight interval: 'relative' [1 - eps_low, 1 + eps_high] or 'absolute' [0, eps_high] "
                "(TRL's: no lower bound, eps_low unused)",
    "clip_cov_ratio": "Clip-Cov: share of the batch's tokens whose gradient is detached",
    "clip_cov_lb": "Clip-Cov: lower bound of the covariance window for candidates",
    "clip_cov_ub": "Clip-Cov: upper bound of the covariance window for candidates",
    "cov_seed": "Clip-Cov: seed of the random choice among candidates (or pass cov_select)",
    "kl_cov_ratio": "KL-Cov: share k of the batch's tokens (largest covariance) that get the |log r| penalty",
    "kl_cov_coef": "KL-Cov: weight of the |log r| penalty",
    "rollout_correction": "rollout/trainer mismatch correction with rollout_logp: tis, mis, seq_mis, seq_rs, geo_rs "
                          "(None = off)",
    "tis_cap": "TIS: truncation C of the token weight exp(old_logp - rollout_logp)",
    "mis_low": "MIS/IcePop: lowest weight kept (seq_rs, geo_rs: lowest sequence ratio, or geometric mean, kept)",
    "mis_high": "MIS/IcePop: highest weight kept (seq_rs, geo_rs: highest sequence ratio, or geometric mean, kept)",
    "opsm_delta": "DeepSeek-V3.2's off-policy sequence mask: a token with A < 0 in a row whose mean log(pi_old / "
                  "pi) exceeds it gets no policy loss (None = off)",
    "vespo_k_pos": "VESPO: power c1 of its kernel W^c1 e^(c2 (1 - W)) for a row with A >= 0",
    "vespo_lambda_pos": "VESPO: decay c2 of its kernel for a row with A >= 0",
    "vespo_k_neg": "VESPO: power c1 of its kernel for a row with A < 0",
    "vespo_lambda_neg": "VESPO: decay c2 of its kernel for a row with A < 0",
})


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: how its ratio is formed, how it is clipped, and its paper defaults."""

    name: str
    # "token", "sequence" (GSPO), "sequence_token" (GSPO-token), "geometric" (GMPO), "sequence_product" (VESPO: the
    # product of the row's token ratios, not normalised by its length) or "none" (GPG)
    ratio: str
    # "fixed", "dynamic" (DCPO), "log" (GMPO: fixed, on log r), "soft" (SAPO), "truncated" (CISPO: the weight, not
    # the gradient), "binary_tv" / "binary_kl" (DPPO: a token masked where the divergence of its Bernoulli leaves the
    # trust region), "gamma" (VESPO: a smooth kernel of the sequence weight), "off" (GPG, KL-Cov), "none" (DPO: not a
    # policy loss)
    clip: str
    defaults: Mapping[str, object] = field(default_factory=dict)
    source: str = ""
    advantage: str = "grpo"  # the estimator the paper trains with (a key of ADVANTAGES)
    select: str | None = None  # token selection by Cov(log pi, A): "clip_cov" or "kl_cov"

    def reads(self, hp: Mapping[str, object] | None = None) -> tuple[str, ...]:
        """The hyper-parameters this algorithm reads under settings ``hp`` (its defaults when None), in HPARAMS'
        order: its clip's, its token selection's, the KL estimator when beta > 0, max_len under the normalised sum,
        and a rollout correction's own bounds when one is on."""
        hp = {**self.defaults, **(hp or {})}
        if self.clip == "none":
            return ("beta",)
        used = {"beta", "agg", "rollout_correction", "opsm_delta"} | set(CLIP_READS[self.clip]) | set(SELECT_READS.get(self.select, ()))
        if hp["beta"]:
            used.add("kl")
        if hp["agg"] == "seq_mean_token_sum_norm":
            used.add("max_len")
        used |= set(ROLLOUT_READS.get(hp["rollout_correction"], ()))
        return tuple(k for k in HPARAMS if k in used)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={self.defaults[k]!r}" for k in self.reads())
        return (f"Algorithm({self.name!r}, ratio={self.ratio!r}, clip={self.clip!r}, advantage={self.advantage!r}, "
                f"{settings}; source: {self.source})")


def _alg(name, ratio, clip, source, advantage="grpo", select=None, **defaults):
    base = {"eps_low": 0.2, "eps_high": 0.2, "beta": 0.0, "kl": "k3", "max_len": None, "dual_clip": None,
            "tau_pos": 1.0, "tau_neg": 1.05, "r_max": 10.0, "delta": None, "cap_mode": "relative",
            "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "cov_seed": 0,
            "kl_cov_ratio": 2e-3, "kl_cov_coef": 1.0,
            "rollout_correction": None, "tis_cap": 2.0, "mis_low": 0.5, "mis_high": 5.0, "opsm_delta": None,
            "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0}
    base.update(defaults)
    return Algorithm(name, ratio, clip, MappingProxyType(base), source, advantage, select)


ALGORITHMS: Mapping[str, Algorithm] = MappingProxyType({a.name: a for a in (
    _alg("ppo", "token", "fixed", "PPO, Schulman et al. 1707.06347, Eq. 7 (KL goes into the reward, k1)",
         advantage="gae", agg="token_mean"),
    _alg("grpo", "token", "fixed", "DeepSeekMath 2402.03300, Eq. 3 (k3 penalty Eq. 4, beta 0.04)",
         agg="seq_mean_token_mean", beta=0.04),
    _alg("dr_grpo", "token", "fixed", "Dr.GRPO, Liu et al. 2503.20783, Eq. 3 (constant normaliser)",
         advantage="dr_grpo", agg="seq_mean_token_sum_norm"),
    _alg("dapo", "token", "fixed", "DAPO 2503.14476, Eq. 8 (clip-higher 0.28, token-level loss)",
         agg="group_token_mean", eps_high=0.28),
    _alg("gspo", "sequence", "fixed", "GSPO 2507.18071, Eq. 5-7 (sequence ratio, clip 3e-4/4e-4)",
         agg="seq_mean", eps_low=3e-4, eps_high=4e-4),
    _alg("gspo_token", "sequence_token", "fixed", "GSPO 2507.18071, Eq. 13-14 (GSPO-token)",
         agg="seq_mean_token_mean", eps_low=3e-4, eps_high=4e-4),
    _alg("dcpo", "token", "dynamic", "DCPO 2509.02333, Eq. 4 (dynamic clip), Eq. 8 (OTM), Eq. 21-28 (bounds)",
         advantage="sas", agg="group_seq_sum_token_mean", eps_low=0.16, eps_high=0.2, r_max=10.0),
    _alg("sapo", "token", "soft", "SAPO 2511.20347, Eq. 5-6 (soft gate, tau_pos 1.0, tau_neg 1.05)",
         agg="seq_mean_token_mean"),
    _alg("cispo", "token", "truncated",
         "MiniMax-M1 2506.13585, Eq. 4-5 (weight cap 1 + 4 as ScaleRL 2510.13786)",
         agg="token_mean", eps_low=1.0, eps_high=4.0),
    _alg("gmpo", "geometric", "log",
         "GMPO 2507.20673, Sec. 3 (geometric mean of token ratios clipped in log space; eps 0.4, Sec. 4)",
         agg="seq_mean", eps_low=0.4, eps_high=0.4),
    _alg("gpg", "none", "off",
         "GPG 2504.02546, Sec. 2 (plain policy gradient, no ratio, no clip; AGE-scaled advantage)",
         advantage="gpg", agg="token_mean"),
    _alg("clip_cov", "token", "fixed",
         "Cui et al. 2505.22617, Sec. 5 (Clip-Cov: detach ratio*N high-Cov tokens)",
         select="clip_cov", agg="token_mean"),
    _alg("kl_cov", "token", "off",
         "Cui et al. 2505.22617, Sec. 5 (KL-Cov: |log r| penalty on the top-k Cov tokens)",
         select="kl_cov", agg="token_mean"),
    _alg("luspo", "sequence", "fixed",
         "LUSPO, Liu et al. 2602.05261: GSPO's sequence loss (2507.18071 Eq. 5-7) scaled by its length |o_i| "
         "(seq_mean_token_sum of the per-sequence loss); eps 2e-3 / 2.5e-3, Sec. 5.1",
         agg="seq_mean_token_sum", eps_low=2e-3, eps_high=2.5e-3),
    _alg("vespo", "sequence_product", "gamma",
         "VESPO 2602.10693, Sec. 3.4: -sg(phi(W)) A log pi, phi(W) = W^c1 e^(c2 (1 - W)) of the sequence weight W = "
         "prod_t r_t; (c1, c2) = (2, 3) for A >= 0 and (3, 2) for A < 0", agg="token_mean"),
    _alg("dppo_tv", "token", "binary_tv",
         "DPPO, Qi et al. 2602.04879, DPPO-Binary-TV (the binary approximation of the TV trust region; delta 0.15 "
         "as the authors' verl recipe)", agg="token_mean", eps_low=0.15, eps_high=0.15),
    _alg("dppo_kl", "token", "binary_kl",
         "DPPO, Qi et al. 2602.04879, DPPO-Binary-KL (the binary approximation of the KL trust region; delta 0.05 "
         "as the authors' verl recipe)", agg="token_mean", eps_low=0.05, eps_high=0.05),
    Algorithm("dpo", "sequence", "none", MappingProxyType({"beta": 0.1}),
              "DPO, Rafailov et al. 2305.18290, Eq. 7", advantage="none"),
)})

#: Algorithms trained with ``policy_loss`` (all but DPO, which has ``dpo_loss``).
POLICY_ALGORITHMS = tuple(n for n, a in ALGORITHMS.items() if a.clip != "none")

#: Defaults of the parts that are not policy losses.
PARTS: Mapping[str, Mapping[str, object]] = MappingProxyType({
    "grpo_advantage": MappingProxyType({"eps": 1e-6, "unbiased": True,
                                        "source": "DeepSeekMath 2402.03300, Sec. 4.1.2 (outcome supervision)"}),
    "dr_grpo_advantage": MappingProxyType({"source": "Dr.GRPO 2503.20783, Eq. 3 (no std division)"}),
    "sas": MappingProxyType({"source": "DCPO 2509.02333, Eq. 9-12 and 29-30 (smooth advantage standardization)"}),
    "gae": MappingProxyType({"gamma": 1.0, "lam": 0.95, "source": "GAE, Schulman et al. 1506.02438, Eq. 16"}),
    "value_loss": MappingProxyType({"clip": 0.2, "agg": "token_mean",
                                    "source": "PPO 1707.06347 with clipped value loss (as in the PPO baselines)"}),
    "overlong": MappingProxyType({"max_len": 20480, "cache_len": 4096, "source": "DAPO 2503.14476, Eq. 13"}),
    "kl": MappingProxyType({"source": "Schulman, 'Approximating KL divergence' (k1, k2, k3); k3_unbiased "
                                      "DeepSeek-V3.2 2512.02556 (r * k3)"}),
    "rloo_advantage": MappingProxyType({"source": "RLOO, Ahmadian et al. 2402.14740, Sec. 3 (leave-one-out mean)"}),
    "gpg_advantage": MappingProxyType({"source": "GPG 2504.02546, Sec. 2 AGE (alpha = B / M, M the responses "
                                                 "with a gradient: those of groups whose rewards are not all equal)"}),
    "reinforce_pp": MappingProxyType({"gamma": 1.0, "eps": 1e-8, "unbiased": True,
                                      "source": "REINFORCE++ 2501.03262, Sec. 3 (k1 in the token reward, batch "
                                                "whitening; _baseline: whitened R - mean_g)"}),
    "gdpo_advantage": MappingProxyType({"eps": 1e-6, "unbiased": True,
                                        "source": "GDPO, Liu et al. 2601.05242 (each reward standardised in its "
                                                  "group, their weighted sum standardised over the batch)"}),
    "opsm": MappingProxyType({"source": "DeepSeek-V3.2 2512.02556 (Off-Policy Sequence Masking: M = 0 where A < 0 "
                                        "and (1/|o|) sum_t log(pi_old / pi) > delta)"}),
    "rollout_correction": MappingProxyType({"source": "Yao et al. 2025 (truncated IS); IcePop (Ring-1T report, 2025, "
                                                      "masked IS); verl rollout_correction"}),
})

def dcpo_released_hparams(clip_ratio_c: float = 10.0) -> dict:
    """lime-RL/DCPO's loss settings for its ``clip_ratio_c``: eps 0.2 / 0.28, upper bound capped at
    max(clip_ratio_c, 10), dual clip c = clip_ratio_c for A < 0, only-token-mean = a token mean over the batch."""
    return {"eps_low": 0.2, "eps_high": 0.28, "r_max": max(float(clip_ratio_c), 10.0),
            "dual_clip": float(clip_ratio_c), "agg": "token_mean"}


#: Algorithms as their authors' released code runs them: a named convention apart from the paper's defaults.
RELEASED: Mapping[str, Mapping[str, object]] = MappingProxyType({
    "dcpo": MappingProxyType({
        "label": "DCPO's released code",
        "hp": MappingProxyType(dcpo_released_hparams(10.0)),
        "source": "lime-RL/DCPO (a verl fork), its DCPO script: clip_type='dynamic', clip_ratio_c 10, "
                  "loss_agg_mode only-token-mean, SAS on with the unbiased per-step std (the reference's SAS, "
                  "gpu.SmoothAdvantage, uses the population std)"}),
})


#: Advantage estimators the training loops offer, by the name algorithms give in ``Algorithm.advantage``.
ADVANTAGES = ("grpo", "dr_grpo", "rloo", "gpg", "sas", "gae", "reinforce_pp", "reinforce_pp_baseline")


def get_algorithm(name: str) -> Algorithm:
    """Return the registry entry for ``name`` or raise a ValueError listing the known names."""
    if name not in ALGORITHMS:
        raise ValueError(f"name: unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
