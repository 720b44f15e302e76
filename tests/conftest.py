import contextlib
import os
import sys

from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# HYPOTHESIS_PROFILE picks the profile. "cliplab" (make test): fixed examples, the same on every run. "fuzz"
# (make fuzz): random examples, shrunk to a minimal failing one; tests/test_fuzz.py runs FUZZ_EXAMPLES per test.
FUZZ_EXAMPLES = 250
settings.register_profile("cliplab", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True, print_blob=True)
settings.register_profile("fuzz", max_examples=FUZZ_EXAMPLES, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "cliplab"))


def target_worker(name: str, timeout_s: float = 120.0):
    """A worker of conformance target ``name`` (its own venv). Skipped when the environment is not built, except
    under `make test` (CLIPLAB_REQUIRE_TARGETS=1), which builds every target environment first."""
    import pytest

    from harness.conform.targets.remote import Worker
    try:
        return Worker(name, timeout_s=timeout_s)
    except ValueError as exc:
        if os.environ.get("CLIPLAB_REQUIRE_TARGETS"):
            raise
        pytest.skip(str(exc))


def exact_policy(name, logp, log_ratio, adv, mask, ref_offset=None, **hp):
    """The exact (sympy) reference loss and gradient of a small hand-made batch, groups of one: every token's
    log-prob ``logp``, old = logp - log_ratio, reference = logp + ref_offset, one advantage per row."""
    import numpy as np

    import spec
    mask = np.array(mask, float)
    policy = np.full(mask.shape, logp)
    ref = policy + (0.0 if ref_offset is None else np.array(ref_offset, float))
    adv = np.repeat(np.array(adv, float)[:, None], mask.shape[1], 1)
    loss, grad = spec.policy_loss(name, policy, policy - np.array(log_ratio, float), adv, mask, group_size=1,
                                  ref_logp=ref, **hp)
    return float(loss), grad.astype(float)


@contextlib.contextmanager
def importable_module(folder, name: str, source: str):
    """Module ``name`` with ``source``, written to ``folder`` and importable for the block (as a user's code)."""
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


def conform_report(fn, adapter: str, seeds: int) -> dict:
    """The settled conformance report of a user callable ``fn`` checked as ``adapter`` says; its worker closed."""
    from harness.conform.engine import conform, settle
    from harness.conform.targets.callable import CallableTarget
    target = CallableTarget(fn, adapter)
    try:
        return settle(target, conform(target, seeds=seeds))
    finally:
        target.close()


def failing(report) -> dict:
    """(knob, family) -> the row, for each row of a conformance report that differs or raises."""
    return {(r["knob"], r["family"]): r for r in report["rows"] if r["outcome"] in ("differs", "raises")}


def engine_row(target_cls, pick, seeds: int) -> dict:
    """The conformance engine's row for the first check of a remote target that ``pick(check)`` selects; the
    target's worker is closed afterwards."""
    from harness.conform.engine import run_check
    target = target_cls()
    try:
        return run_check(next(c for c in target.checks() if pick(c)), seeds=seeds)[0]
    finally:
        target.worker.close()
