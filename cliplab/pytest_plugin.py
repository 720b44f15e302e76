"""cliplab's pytest plugin, registered through the ``pytest11`` entry point: the ``assert_conforms`` fixture and
the ``--cliplab-seeds`` option. Nothing heavy (torch, the reference) is imported until a test uses the fixture.

    def test_my_loss_is_grpo(assert_conforms):
        assert_conforms(my_loss, "grpo", beta=0)   # fails with the minimal input, both values, the closest convention

    def test_my_loss_has_no_new_findings(assert_conforms):   # the baseline written with write_baseline=PATH
        assert_conforms(my_loss, "grpo", beta=0, baseline="tests/cliplab-baseline.json")
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.getgroup("cliplab").addoption(
        "--cliplab-seeds", type=int, default=None, metavar="N",
        help="generated batches per check and case family for assert_conforms (default 30)")


def pytest_configure(config):
    """Refuse a bad option at start-up, before any test runs."""
    seeds = config.getoption("cliplab_seeds")
    if seeds is not None and seeds < 1:
        raise pytest.UsageError(f"--cliplab-seeds: expected a positive integer (generated batches per check and case "
                                f"family), got {seeds}")


@pytest.fixture
def assert_conforms(request):
    """``assert_conforms(fn, algorithm, **adapter)``: cliplab.assert_conforms, with ``--cliplab-seeds`` as the
    default number of generated batches; ``timeout_s`` bounds each call of ``fn`` (default 60 s); ``baseline``:
    a file of known findings, only a new or grown one fails (written by ``write_baseline=PATH``, with the same
    seeds)."""
    from harness.conform.engine import assert_conforms as check
    seeds = request.config.getoption("cliplab_seeds")

    def run(fn, algorithm, **kw):
        __tracebackhide__ = True
        if seeds is not None:
            kw.setdefault("seeds", seeds)
        return check(fn, algorithm, **kw)
    return run
