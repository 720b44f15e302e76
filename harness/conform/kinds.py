"""User callables of the kinds past the policy loss, for ``cliplab conform module:function --adapter kind=...``:
``kind=advantage`` (a group advantage estimator: rewards and groups in, one advantage per response or per token
out), ``kind=kl`` (a per-token KL estimator used as a loss term: log-probs in, per-token values out, and their
gradient) and ``kind=rollout_correction`` (a rollout correction's weights, ``kinds_rollout``). This module holds
what each kind reads from the adapter, how its callable is called (in the worker, ``evaluate``), its generated
cases and its reference conventions; ``targets.callable`` runs it like a policy loss.

Conventions the reference follows, stated once:

- Groups are the responses sharing a group id (``group_index``), of any sizes, or contiguous blocks of
  ``group_size`` rows. A lone response (a group of one) has R - mean = 0 under GRPO, Dr.GRPO and GPG; RLOO's
  leave-one-out baseline of a lone response is the mean of no others, taken as 0, so its advantage is R (verl's
  ``compute_rloo_outcome_advantage``).
- A reward that is NaN or infinite is a missing reward: it takes no part in its group's mean, std or count, and
  its response's advantage is 0. A callable that lets it through gives NaN to the whole group.
- A KL term is checked as a loss term: its value is the named estimator's (Schulman's k1, k2, k3; k3_unbiased =
  r * k3), its gradient in logp an estimate of KL(pi || ref)'s gradient. For k2, k3 and k3_unbiased that is their
  own (pathwise) gradient. For k1 it is not: d(logp - ref_logp)/d logp = 1, i.e. the score function, whose
  expectation under pi is 0; the reference takes k2's gradient (logp - ref_logp) there, as verl's straight-through
  ``k1+`` does (value of k1, gradient of k2)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

import gpu
from spec.registry import ADVANTAGES, KL_KINDS, PARTS
from spec.schema import did_you_mean

from harness.conform import kinds_rollout
from harness.conform.cases import Batch, Check, Convention, batch_of, bind_params

KINDS = ("policy", "advantage", "kl", "rollout_correction")
#: The estimators a callable of kind advantage can be checked against (ADVANTAGES less the ones that need more
#: than one call's inputs: SAS keeps a per-prompt history over steps, GAE needs values, REINFORCE++ with a group
#: baseline is reinforce_pp after a Dr.GRPO centring).
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gpg", "reinforce_pp")
UNCHECKED = {"sas": "keeps a per-prompt history across steps (one call cannot show it)",
             "gae": "needs a value model's values (check it through a framework target)",
             "reinforce_pp_baseline": "is reinforce_pp after a group centring (check the two apart)"}
DTYPES = ("float64", "float32", "bfloat16")
ALIASES = {
    "advantage": {"rewards": ("rewards", "reward", "scores", "token_level_rewards"),
                  "group_index": ("group_index", "index", "uid", "group_ids", "prompt_index"),
                  "group_size": ("group_size", "num_generations", "n_samples_per_prompt"),
                  "mask": ("mask", "response_mask", "action_mask", "completion_mask", "eos_mask")},
    "kl": {"logp": ("logp", "log_prob", "log_probs", "logprob", "logprobs", "per_token_logps"),
           "ref_logp": ("ref_logp", "ref_log_prob", "ref_log_probs", "ref_logprob", "ref_per_token_logps"),
           "old_logp": ("old_logp", "old_log_prob", "old_log_probs", "old_per_token_logps"),
           "mask": ("mask", "response_mask", "action_mask", "completion_mask")},
    "rollout_correction": kinds_rollout.ALIASES}
#: Adapter keys of each kind beside the parameter names (kind, returns and timeout_s are common to all).
OPTIONS = {
    "advantage": {"estimator": f"what the callable implements: {', '.join(ESTIMATORS)}",
                  "reward_shape": "seq: rewards [B] (default); token: [B, T], each row's reward at its last "
                                  "unmasked token (verl's token_level_rewards)",
                  "group_index_as": "tensor: group ids as a torch int64 tensor (default); numpy: a NumPy array "
                                    "(verl passes its uid array so)",
                  "eps": f"GRPO's std stabiliser (default {PARTS['grpo_advantage']['eps']:g})",
                  "unbiased": f"GRPO's std with Bessel's correction (default {PARTS['grpo_advantage']['unbiased']})",
                  "gamma": f"REINFORCE++'s discount (default {PARTS['reinforce_pp']['gamma']:g})"},
    "kl": {"kl": f"the estimator: {', '.join(KL_KINDS)}"},
    "rollout_correction": kinds_rollout.OPTIONS}
REQUIRED = {"advantage": ("rewards",), "kl": ("logp", "ref_logp"), "rollout_correction": kinds_rollout.REQUIRED}
EXPECTED = {
    "advantage": "a callable f(rewards, group_index or group_size[, mask]) -> advantages ([B], or [B, T] over the "
                 "response mask; or a tuple whose item `returns` is one)",
    "kl": "a callable f(logp, ref_logp[, old_logp][, mask]) -> per-token KL values [B, T] (differentiable in logp)",
    "rollout_correction": kinds_rollout.EXPECTED}
#: The tensors a callable of each kind is given beside the mask, and the one its result is differentiated in.
INPUTS = {"kl": ("logp", "ref_logp", "old_logp"), "rollout_correction": ("old_logp", "rollout_logp")}
DIFFERENTIATED = {"kl": "logp", "rollout_correction": "old_logp"}


def parse(kind: str, items: list, common: dict) -> dict:
    """The adapter of a callable of ``kind`` (advantage, kl or rollout_correction) from its (key, text) items;
    ``common``: the keys every kind takes (returns, timeout_s), already read. A ValueError names a key or value that
    is wrong."""
    out = {"kind": kind, **common}
    known = ("kind", *common, *OPTIONS[kind], *ALIASES[kind])
    claim = {"advantage": "estimator", "kl": "kl", "rollout_correction": "correction"}[kind]
    for key, value in items:
        if key in ("kind", *common):
            continue
        if key == "algorithm":  # assert_conforms(fn, "rloo", kind="advantage") names the claim as its algorithm
            if value != dict(items).get(claim, value):
                raise ValueError(f"adapter: algorithm={value!r} and {claim}={dict(items)[claim]!r} disagree; for "
                                 f"kind={kind} give {claim}=NAME")
            key = claim
        if key not in known:
            raise ValueError(f"adapter: unknown key {key!r} for kind={kind}{did_you_mean(key, known)}; expected "
                             f"{', '.join(OPTIONS[kind])}, or one of {', '.join(ALIASES[kind])} (= the callable's "
                             "parameter name)")
        out[key] = value
    if kind == "advantage":
        est = out.get("estimator")
        if est in UNCHECKED:
            raise ValueError(f"adapter: estimator={est} {UNCHECKED[est]}; a callable is checked as one of "
                             f"{', '.join(ESTIMATORS)}")
        if est not in ESTIMATORS:
            raise ValueError(f"adapter: kind=advantage needs estimator=NAME"
                             + (f", got {est!r}{did_you_mean(est, ADVANTAGES)}" if est else "")
                             + f"; expected one of {', '.join(ESTIMATORS)}")
        if out.get("group_index_as", "tensor") not in ("tensor", "numpy"):
            raise ValueError(f"adapter: group_index_as={out['group_index_as']!r}; expected tensor or numpy")
        if out.get("reward_shape", "seq") not in ("seq", "token"):
            raise ValueError(f"adapter: reward_shape={out['reward_shape']!r}; expected seq ([B]) or token ([B, T])")
        for key, cast in (("eps", float), ("gamma", float)):
            if key in out:
                try:
                    out[key] = cast(out[key])
                except (TypeError, ValueError):
                    raise ValueError(f"adapter: {key}={out[key]!r}; expected a number") from None
        if "unbiased" in out:
            flag = str(out["unbiased"]).lower()
            if flag not in ("true", "false", "1", "0"):
                raise ValueError(f"adapter: unbiased={out['unbiased']!r}; expected true or false")
            out["unbiased"] = flag in ("true", "1")
    elif kind == "rollout_correction":
        kinds_rollout.parse(out)
    elif out.get("kl") not in KL_KINDS:
        got = out.get("kl")
        raise ValueError(f"adapter: kind=kl needs kl=NAME" + (f", got {got!r}{did_you_mean(str(got), KL_KINDS)}"
                                                               if got else "")
                         + f"; expected one of {', '.join(KL_KINDS)}")
    return out


def bind(kind: str, signature: dict, adapter: dict) -> dict:
    """Our argument name -> the callable's parameter name, as ``targets.callable.bind`` for a policy loss."""
    binding = bind_params(signature, adapter, ALIASES[kind])
    missing = [ours for ours in REQUIRED[kind] if ours not in binding]
    if kind == "advantage" and not {"group_index", "group_size"} & set(binding):
        missing.append("group_index or group_size")
    if kind == "advantage" and "mask" not in binding and (adapter.get("estimator") == "reinforce_pp"
                                                          or adapter.get("reward_shape") == "token"):
        missing.append("mask")
    if kind == "kl" and adapter.get("kl") == "k3_unbiased" and "old_logp" not in binding:
        missing.append("old_logp (k3_unbiased = r * k3 reads the sampling log-probs)")
    unmapped = [n for n, required in signature["params"] if required and n not in binding.values()]
    unmapped += signature["positional_only"]
    if missing or unmapped:
        raise ValueError(f"target: wrong signature {signature['text']} for kind={kind}: "
                         + "; ".join(filter(None, [f"no parameter for {', '.join(missing)}" if missing else "",
                                                   f"cannot map its parameters {', '.join(unmapped)}" if unmapped
                                                   else ""]))
                         + f"; map them with the adapter keys {', '.join(ALIASES[kind])}; expected {EXPECTED[kind]}")
    return binding


# ---- the worker side: one call of the user's function ----------------------------------------------------------

def evaluate(fn, how: dict, arrays: dict) -> dict:
    """Call ``fn`` (kind ``how["kind"]``) on ``arrays`` in ``how["dtype"]``: {"value": [B, T] float64 values on the
    mask (0 off it), "grad": d sum(values) / d logp for kind kl} or {"bad": what is wrong with the result}; what the
    callable raises (or an input it changed in place) is raised. Runs in the worker."""
    dtype = getattr(torch, how["dtype"])
    mask = torch.tensor(np.asarray(arrays["mask"], dtype=np.float64))
    on = mask > 0
    given, wrt = {}, None
    if how["kind"] == "advantage":
        rewards = torch.tensor(np.asarray(arrays["rewards"], dtype=np.float64))
        if how.get("reward_shape") == "token":
            last = on & (on.flip(1).cumsum(1).flip(1) == 1)
            rewards = torch.where(last, rewards[:, None].expand_as(mask), torch.zeros_like(mask))
        given = {"rewards": rewards.to(dtype), "mask": mask.to(dtype), "group_size": how["group_size"],
                 "group_index": np.asarray(arrays["group"], dtype=np.int64)}
        if how.get("group_index_as", "tensor") == "tensor":
            given["group_index"] = torch.from_numpy(given["group_index"])
    else:
        given = {k: torch.tensor(np.asarray(arrays[k], dtype=np.float64)).to(dtype) for k in INPUTS[how["kind"]]}
        wrt = given[DIFFERENTIATED[how["kind"]]].requires_grad_(True)
        given["mask"] = mask.to(dtype)
    before = {k: v.clone() for k, v in given.items() if isinstance(v, torch.Tensor)}
    with torch.enable_grad():
        out = fn(**{param: given[ours] for ours, param in how["binding"].items()})
    changed = [how["binding"].get(k, k) for k, t in before.items() if not unchanged(given[k].detach(), t)]
    if changed:
        raise RuntimeError(f"the callable changed its input {', '.join(changed)} in place")
    shapes = _shapes(how["kind"], tuple(mask.shape))
    values = _result(out, how.get("returns", 0), shapes)
    kept = None if how.get("kept") is None else _result(out, how["kept"], shapes, "kept")
    for bad in (values, kept):
        if isinstance(bad, str):
            return {"bad": bad}
    if kept is not None:
        values = values * kept.to(values.dtype)
    if values.dim() == 1:
        values = values[:, None].expand_as(mask)
    grad = None
    if wrt is not None:
        if values.requires_grad:
            with torch.enable_grad():
                torch.where(on, values, torch.zeros_like(values)).sum().backward()
        grad = (wrt.grad if wrt.grad is not None else torch.zeros_like(wrt)).double().numpy()
    value = torch.where(on, values.detach().double(), torch.zeros((), dtype=torch.float64))
    return {"value": value.numpy(), "grad": grad, "dtype": str(values.dtype).removeprefix("torch.")}


def unchanged(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a callable's input ``a`` still equals its copy ``b`` taken before the call: element by element, NaN
    equal to NaN (a reward, or a padding value, may be NaN)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _shapes(kind: str, shape: tuple) -> tuple:
    """The result shapes a callable of ``kind`` may return for a [B, T] batch."""
    return (shape[:1], shape) if kind in ("advantage", "rollout_correction") else (shape,)


def _result(out, returns: int, shapes: tuple, key: str = "returns"):
    """The returned tensor of one of ``shapes`` (item ``returns`` of a tuple), or a string saying what was returned
    instead; ``key``: the adapter key that names the item."""
    if isinstance(out, (tuple, list)):
        if returns >= len(out):
            return f"returned a {type(out).__name__} of {len(out)} items ({key}={returns} is out of range)"
        out = out[returns]
    elif key != "returns":
        return f"returned {type(out).__name__}, not a tuple with a kept-token mask ({key}={returns})"
    if not isinstance(out, torch.Tensor) or out.is_meta or out.is_complex():
        return f"returned {type(out).__name__ if not isinstance(out, torch.Tensor) else out.dtype}, not a real tensor"
    if tuple(out.shape) not in shapes:
        return (f"returned a tensor of shape {list(out.shape)}, expected "
                + " or ".join(str(list(s)) for s in shapes))
    return out


# ---- generated cases --------------------------------------------------------------------------------------------

#: The case families of each kind (cases.FAMILY_TEXT says what each holds).
ADV_FAMILIES = ("groups", "ragged", "lone", "nonfinite", "one_token")
#: Reward values of constant groups that no binary float represents exactly: over 8 responses (3 for 0.9) their
#: float32 mean is an ulp off, and a std of 1e-8 against GRPO's eps = 1e-6 turns it into advantages of 0.03 to 0.06.
CONSTANT_REWARDS = (0.3, 0.6, 0.7, 0.9)
#: Responses per prompt, by seed: the first seed has G = 8, as training runs do.
GROUP_SIZES = (8, 3, 5, 2)


def advantage_batch(seed: int, family: str, fixed_stride: bool = False) -> Batch:
    """Rewards (adv, constant over each row), group ids (extra["group"], constant over each row) and ragged
    response masks (every row has a token). ``groups``: G = GROUP_SIZES[seed] responses per prompt, 0/1 and
    continuous rewards, one constant group of a non-representable value; ``ragged``: groups of different sizes
    (partial groups, a lone response), B divisible by the number of groups; ``lone``: a lone response among groups
    (all lone with ``fixed_stride``); ``nonfinite``: as ``groups``, one or two rewards NaN, +inf or -inf;
    ``one_token``: as ``groups``, with one unmasked token in the whole batch (REINFORCE++ whitens over it)."""
    rng = np.random.default_rng(90_000 + seed)
    n, g = int(rng.integers(2, 5)), GROUP_SIZES[seed % len(GROUP_SIZES)]
    sizes = [g] * n
    if family == "ragged" and not fixed_stride:
        g = max(g, 3)
        sizes = [g] * n
        give, take = rng.choice(n, 2, replace=False)
        moved = int(rng.integers(1, g))  # a partial group, down to a lone response
        sizes[give] -= moved
        sizes[take] += moved
    elif family == "lone":
        if fixed_stride:
            sizes, g = [1] * (n * 2), 1
        else:
            sizes[int(rng.integers(n))] = 1
    rows = sum(sizes)
    group = np.repeat(np.arange(len(sizes)), sizes)
    rewards = np.where(rng.random(rows) < 0.5, rng.integers(0, 2, rows).astype(float),
                       np.round(rng.normal(0.0, 1.0, rows), 2))
    constant = int(rng.integers(len(sizes)))
    rewards[group == constant] = rng.choice(CONSTANT_REWARDS)
    if family == "nonfinite":
        bad = rng.choice(rows, int(rng.integers(1, 3)), replace=False)
        rewards[bad] = rng.choice([np.nan, np.nan, np.inf, -np.inf], len(bad))
    width = 5
    lens = rng.integers(1, width + 1, rows)
    mask = (np.arange(width)[None, :] < lens[:, None]).astype(float)
    if family == "one_token":
        mask = np.zeros(mask.shape)
        mask[int(rng.integers(rows)), 0] = 1.0
    zeros = np.zeros(mask.shape)
    return Batch(zeros, zeros.copy(), np.repeat(rewards[:, None], width, 1), mask, zeros.copy(),
                 g if fixed_stride else 1, {"group": np.repeat(group[:, None].astype(float), width, 1)})


def rewards_of(b: Batch) -> np.ndarray:
    return b.adv[:, 0] if b.adv.size else np.zeros(len(b.mask))


def groups_of(b: Batch) -> np.ndarray:
    return b.extra["group"][:, 0].astype(int) if len(b.mask) else np.zeros(0, int)


# ---- reference conventions --------------------------------------------------------------------------------------

def _t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def advantage_values(estimator: str, b: Batch, *, eps: float, unbiased: bool, gamma: float,
                     missing: str = "masked", lone: str | None = None, stride: bool = False) -> np.ndarray:
    """Per-token advantages of ``estimator`` on ``b`` (see the module's conventions), by the gpu layer's
    ``group_advantages`` on each group and ``reinforce_pp_advantages``. Variants: ``missing="propagated"`` gives a
    group with a non-finite reward NaN throughout; ``lone="zero"`` zeroes RLOO's lone responses (verl's
    rloo_vectorized), ``lone="reward"`` gives GRPO's, Dr.GRPO's and GPG's R / (1 + eps) or R (verl's group mean 0
    and std 1 of a lone response); ``stride`` takes groups as contiguous blocks of B / (number of groups) rows."""
    r, on = rewards_of(b), b.mask > 0
    ok = np.isfinite(r)
    if estimator == "reinforce_pp":
        if missing == "propagated" and not ok.all():
            return np.where(on, np.nan, 0.0)
        mask = b.mask * ok[:, None]
        adv = gpu.reinforce_pp_advantages(_t(np.where(ok, r, 0.0)), _t(mask), gamma=gamma).numpy()
        return np.where(on, adv, 0.0)
    ids = groups_of(b)
    if stride:
        count = len(np.unique(ids))
        ids = np.arange(len(r)) // max(len(r) // count, 1) if len(r) % count == 0 else ids
    adv = np.zeros(len(r))
    for gid in np.unique(ids):
        rows = np.nonzero(ids == gid)[0]
        if missing == "propagated" and not ok[rows].all():
            adv[rows] = np.nan
            continue
        live = rows[ok[rows]]
        if len(live) == 1:
            keep = lone == "reward" or (lone is None and estimator == "rloo")
            adv[live] = (r[live] / (1 + eps) if estimator == "grpo" else r[live]) if keep else 0.0
        elif len(live) > 1:
            kind = "dr_grpo" if estimator == "gpg" else estimator
            adv[live] = gpu.group_advantages(_t(r[live]), len(live), kind=kind, eps=eps, unbiased=unbiased).numpy()
    if estimator == "gpg":  # GPG (2504.02546 Sec. 2): R - mean scaled by B / M, M the responses of varied groups
        varied = [rows for gid in np.unique(ids) if len(set(r[rows := np.nonzero((ids == gid) & ok)[0]])) > 1]
        adv *= ok.sum() / max(sum(len(v) for v in varied), 1)
    return np.where(on, adv[:, None], 0.0)


def advantage(estimator: str, adapter: dict, label: str | None = None, named: bool = True, **variant) -> Convention:
    hp = {"eps": adapter.get("eps", PARTS["grpo_advantage"]["eps"]),
          "unbiased": adapter.get("unbiased", PARTS["grpo_advantage"]["unbiased"]),
          "gamma": adapter.get("gamma", PARTS["reinforce_pp"]["gamma"])}
    if estimator != "grpo":
        text = f"{estimator}_advantage"
    else:
        text = f"grpo_advantage[unbiased={hp['unbiased']}]"
    return Convention(label or text, lambda b: (advantage_values(estimator, b, **hp, **variant), None), named)


def advantage_candidates(estimator: str, adapter: dict) -> list[Convention]:
    """What a callable claiming ``estimator`` may compute instead, each named."""
    out = []
    if estimator == "grpo":
        out.append(advantage("dr_grpo", adapter, "grpo_advantage with std not applied (Dr.GRPO's R - mean)"))
        flip = not adapter.get("unbiased", PARTS["grpo_advantage"]["unbiased"])
        out.append(advantage("grpo", {**adapter, "unbiased": flip},
                             f"grpo_advantage[unbiased={flip}] (the other std)"))
    out += [advantage(e, adapter) for e in ESTIMATORS if e not in (estimator, "reinforce_pp")]
    if estimator == "rloo":
        out.append(advantage("rloo", adapter, "rloo_advantage with lone responses zeroed (verl's rloo_vectorized)",
                             lone="zero"))
    elif estimator != "reinforce_pp":
        out.append(advantage(estimator, adapter, f"{estimator}_advantage with lone responses keeping their reward "
                             "(group mean 0, std 1: verl's compute_grpo_outcome_advantage)", lone="reward"))
    if estimator != "reinforce_pp":
        out.append(advantage(estimator, adapter, f"{estimator}_advantage on fixed-stride groups (B / number of "
                             "groups contiguous rows each, whatever the group ids say)", stride=True))
    out.append(advantage(estimator, adapter, f"{estimator}_advantage with non-finite rewards propagated (NaN over "
                         "their group's statistics)", missing="propagated"))
    return out


def kl_values(kind: str, b: Batch, gradient: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-token values of estimator ``kind`` on the mask and d sum(values) / d logp, by gpu.kl: ``gradient`` is
    "own" (the estimator's pathwise gradient) or "k2" (straight-through: k2's gradient, logp - ref_logp)."""
    logp = _t(b.logp).requires_grad_(True)
    mask = _t(b.mask)
    old = _t(b.old_logp) if kind == "k3_unbiased" else None
    value = gpu.kl(logp, _t(b.ref_logp), kind, old_logp=old)
    if gradient == "k2":
        k2 = gpu.kl(logp, _t(b.ref_logp), "k2")
        value = value.detach() + k2 - k2.detach()
    (value * mask).sum().backward()
    return (value.detach() * mask).numpy(), logp.grad.numpy()


def kl_convention(kind: str, gradient: str) -> Convention:
    if kind == "k1":
        text = ("k1 (value logp - ref_logp, gradient logp - ref_logp: the straight-through k1+)" if gradient == "k2"
                else "k1 pathwise: zero expected gradient (d(logp - ref_logp)/d logp = 1, the score function)")
    else:
        text = kind if gradient == "own" else f"{kind}+ ({kind} value, k2 gradient: straight-through)"
    return Convention(text, lambda b: kl_values(kind, b, gradient), far_ref=True)


def kl_reference(kind: str) -> Convention:
    """The reference of a KL term: the estimator's own gradient, k2's for k1 (see the module's conventions)."""
    return kl_convention(kind, "k2" if kind == "k1" else "own")


def k3_unbiased_ratio_detached(b: Batch) -> tuple[np.ndarray, np.ndarray]:
    """r * k3 with the ratio r = exp(logp - old_logp) held constant: its gradient is r * (1 - exp(ref - logp))."""
    logp = _t(b.logp).requires_grad_(True)
    mask = _t(b.mask)
    value = torch.exp(logp - _t(b.old_logp)).detach() * gpu.kl(logp, _t(b.ref_logp), "k3")
    (value * mask).sum().backward()
    return (value.detach() * mask).numpy(), logp.grad.numpy()


def kl_candidates(kind: str) -> list[Convention]:
    mine = kl_reference(kind).label
    out = [c for k in KL_KINDS if k != "k3_unbiased" or kind == "k3_unbiased"
           for c in (kl_convention(k, "own"), kl_convention(k, "k2")) if c.label != mine]
    if kind == "k3_unbiased":
        out.append(Convention("k3_unbiased with the ratio detached (gradient r * (1 - exp(ref_logp - logp)))",
                              k3_unbiased_ratio_detached, far_ref=True))
    return out


# ---- the checks ---------------------------------------------------------------------------------------------------

ADV_READS = ("adv[:, 0] as each response's reward, group[:, 0] as its group id (or G contiguous rows per group), "
             "mask")
KL_READS = "logp, ref_logp (and old_logp for k3_unbiased), mask"


def checks(kind: str, name: str, adapter: dict, binding: dict, run) -> list[Check]:
    """One check per dtype (float64, float32, bfloat16) of the callable ``name``; ``run(batch, dtype)`` calls it."""
    if kind == "rollout_correction":
        return kinds_rollout.checks(name, adapter, run, DTYPES)
    out = []
    for dtype in DTYPES:
        call = lambda b, dtype=dtype: run(b, dtype)  # noqa: E731
        if kind == "advantage":
            est = adapter["estimator"]
            stride = "group_index" not in binding
            fams = tuple(f for f in ADV_FAMILIES if not (stride and f == "ragged")
                         and not (est == "reinforce_pp" and f in ("ragged", "lone"))
                         and not (est != "reinforce_pp" and f == "one_token"))
            note = ("Called with group_size (contiguous groups of G rows): ragged and partial groups are not "
                    "checked; a callable that takes group ids is (adapter group_index=PARAM)." if stride else "")
            out.append(Check(f"{est}_advantage", name, dtype, call, advantage(est, adapter),
                             advantage_candidates(est, adapter),
                             lambda seed, family, stride=stride: advantage_batch(seed, family, stride), fams,
                             note=note, reads=ADV_READS, dtype=dtype))
        else:
            out.append(Check("kl", name, f"kl={adapter['kl']}, {dtype}", call, kl_reference(adapter["kl"]),
                             kl_candidates(adapter["kl"]), batch_of, ("typical", "far_ref"), reads=KL_READS,
                             dtype=dtype))
    return out


def rounded(b: Batch, kind: str, dtype: str) -> Batch:
    """``b`` with the inputs the callable reads rounded to ``dtype`` (the reference is computed on what it saw)."""
    if dtype == "float64":
        return b
    cast = lambda x: torch.tensor(x).to(getattr(torch, dtype)).double().numpy()  # noqa: E731
    names = {"advantage": ("adv",), "rollout_correction": ("old_logp",),
             "step": ("logp", "old_logp", "adv", "ref_logp")}.get(kind, ("logp", "ref_logp", "old_logp"))
    extra = dict(b.extra)
    if kind == "rollout_correction":
        extra["rollout_logp"] = cast(extra["rollout_logp"])
    return replace(b, **{n: cast(getattr(b, n)) for n in names}, extra=extra)


def arrays_of(kind: str, b: Batch) -> dict:
    """The arrays a callable of ``kind`` is called with (by ``evaluate``, in the worker) on batch ``b``."""
    if kind == "advantage":
        return {"rewards": rewards_of(b), "group": groups_of(b), "mask": b.mask}
    extra = {"rollout_logp": b.extra["rollout_logp"]} if kind == "rollout_correction" else {}
    return {**{k: getattr(b, k) for k in INPUTS[kind] if k not in extra}, **extra, "mask": b.mask}

