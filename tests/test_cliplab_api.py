"""The public package: `import cliplab` (light, lazy), the pytest plugin on a wrong and a correct loss, and the
hypothesis strategies for users' own fuzzing."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import cliplab
import gpu
import spec
from cliplab.strategies import EXTREME, batches

ROOT = Path(__file__).resolve().parents[1]


def python(code: str, cwd=None, *args, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, *args, *(["-c", code] if code else [])], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_import_cliplab_is_light_and_names_the_public_api():
    done = python("import sys, cliplab, cliplab.pytest_plugin; assert 'torch' not in sys.modules, 'torch'; "
                  "print(cliplab.registry.POLICY_ALGORITHMS[0], 'torch' in sys.modules)")
    assert done.returncode == 0 and done.stdout.split() == ["ppo", "False"], done.stderr
    assert cliplab.exact_policy_loss is spec.policy_loss and cliplab.torch_policy_loss is gpu.policy_loss
    assert cliplab.ALGORITHMS is spec.ALGORITHMS and callable(cliplab.assert_conforms)
    with pytest.raises(AttributeError, match="it exports AGG_MODES, ALGORITHMS"):
        cliplab.no_such_name  # noqa: B018


USER_TESTS = textwrap.dedent('''
    import torch


    def grpo_surrogate(logp, old_logp, advantages, mask):
        r = torch.exp(logp - old_logp)
        return -torch.min(r * advantages, torch.clamp(r, 0.8, 1.2) * advantages) * mask


    def padded(logp, old_logp, advantages, mask):
        return grpo_surrogate(logp, old_logp, advantages, mask).mean()


    def per_sequence(logp, old_logp, advantages, mask):
        lens = mask.sum(1)
        keep = lens > 0
        rows = grpo_surrogate(logp, old_logp, advantages, mask).sum(1)
        return (rows[keep] / lens[keep]).mean() if keep.any() else rows.sum() * 0


    def test_padding_bug(assert_conforms):
        assert_conforms(padded, "grpo", beta=0)


    def test_paper_grpo(assert_conforms):
        assert_conforms(per_sequence, "grpo", beta=0)
''')


def test_the_pytest_plugin_fails_a_wrong_loss_with_its_minimal_input_and_passes_a_correct_one(tmp_path):
    (tmp_path / "test_user_losses.py").write_text(USER_TESTS)
    done = python("", tmp_path, "-m", "pytest", "-p", "cliplab.pytest_plugin", "-p", "no:cacheprovider",
                  "--cliplab-seeds", "3", "test_user_losses.py", env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    out = done.stdout
    assert done.returncode == 1 and "1 failed, 1 passed" in out, out + done.stderr
    assert "test_user_losses:padded does not conform to grpo" in out
    for words in ("DIFFERS  grpo [beta=0] typical", "largest difference over 3 batches", "minimal input (rows: ",
                  "target ", ", reference ", "closest known convention: grpo[agg=seq_mean_token_sum_norm, beta=0]"):
        assert words in out, words


def test_the_pytest_plugin_refuses_a_seed_count_below_1_at_start_up(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = python("", tmp_path, "-m", "pytest", "-p", "cliplab.pytest_plugin", "-p", "no:cacheprovider",
                  "--cliplab-seeds", "0", "test_nothing.py", env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "ERROR: --cliplab-seeds: expected a positive integer (generated batches per check and case family), " \
           "got 0" in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_the_strategies_draw_what_breaks_losses():
    seen = set()

    @settings(max_examples=150, database=None)
    @given(batches())
    def draw(b):
        rows, g = b.mask.sum(1), b.group_size
        features = {"empty row": (rows == 0).any(), "one-token row": (rows == 1).any(),
                    "full row": (rows == b.mask.shape[1]).any(), "hole": (np.diff(b.mask, axis=1) > 0).any(),
                    "groups": g > 1 and len(rows) > g, "lone responses": g == 1,
                    "extreme ratio": (np.abs(b.logp - b.old_logp) == EXTREME).any(),
                    "small q": (b.old_logp < -20).any(),
                    "tied group": g > 1 and (b.adv[:g] == 0).all() and b.adv.any(),
                    "per-token advantages": (b.adv != b.adv[:, :1]).any()}
        seen.update(name for name, present in features.items() if present)
        assert b.adv.shape == b.logp.shape == b.mask.shape and len(b.mask) % g == 0
    draw()
    assert seen == {"empty row", "one-token row", "full row", "hole", "groups", "lone responses", "extreme ratio",
                    "small q", "tied group", "per-token advantages"}


@settings(max_examples=40)
@given(batches())
def test_a_users_fuzz_test_holds_the_sequence_mean_against_the_torch_layer(b):
    """What a user writes with the strategies: their loss (here the per-sequence token mean written by hand)
    against cliplab's torch layer, on hostile batches."""
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    r = torch.exp(t(b.logp - b.old_logp))
    per_token = -torch.min(r * t(b.adv), torch.clamp(r, 0.8, 1.2) * t(b.adv)) * t(b.mask)
    lens = t(b.mask).sum(1)
    mine = (per_token.sum(1)[lens > 0] / lens[lens > 0]).mean() if (lens > 0).any() else torch.tensor(0.0)
    want, _ = gpu.policy_loss("grpo", t(b.logp), t(b.old_logp), t(b.adv), t(b.mask), group_size=b.group_size,
                              beta=0.0)
    assert float(mine) == pytest.approx(float(want), rel=1e-12, abs=1e-12)
