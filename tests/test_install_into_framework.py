"""cliplab installs into a framework's own environment without moving its pins: a fresh venv built from SkyRL's
lock (harness/conform/targets/envs/skyrl.lock; torch read from the target environments' torch base, as `make targets`
builds them), then cliplab with its `testing` extra under that environment's pins as constraints, the way a
framework's CI adds it. There the pytest plugin (loaded through its pytest11 entry point) fails a loss with the
padding bug and passes a correct one, and `cliplab conform module:function` exits 0 and 1."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.conform.targets.remote import envs_dir

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "harness" / "conform" / "targets" / "envs" / "skyrl.lock"
WHEELS = ROOT / ".cache" / "wheels" / "skyrl"  # the lock's wheels, fetched once: pip keeps no HTTP cache here
SOURCES = ("pyproject.toml", "README.md", "cliplab", "spec", "sim", "gpu", "harness")

LOSSES = textwrap.dedent('''
    import torch


    def surrogate(logp, old_logp, advantages, mask):
        r = torch.exp(logp - old_logp)
        return -torch.min(r * advantages, torch.clamp(r, 0.8, 1.2) * advantages) * mask


    def padded(logp, old_logp, advantages, mask):
        return surrogate(logp, old_logp, advantages, mask).mean()


    def paper(logp, old_logp, advantages, mask):
        lens = mask.sum(1)
        rows = surrogate(logp, old_logp, advantages, mask).sum(1)
        return (rows[lens > 0] / lens[lens > 0]).mean() if (lens > 0).any() else rows.sum() * 0
''')
USER_TESTS = textwrap.dedent('''
    from framework_losses import padded, paper


    def test_paper(assert_conforms):
        assert_conforms(paper, "grpo", beta=0)


    def test_padded(assert_conforms):
        assert_conforms(padded, "grpo", beta=0)
''')


def run(*args, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST"))}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env={**clean, "HF_HUB_OFFLINE": "1", **(env or {})},
                          capture_output=True, text=True, timeout=900)
    assert not check or done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def pip(python, *args, check=True):
    return run(sys.executable, "-m", "pip", "--python", python, *args, env={"PIP_NO_COMPILE": "1"}, check=check)


def lock_wheels(python, lock=LOCK, wheels=WHEELS):
    """Install the pins of ``lock`` from the wheel cache ``wheels``, filling it from the index first if it lacks
    any."""
    args = ("install", "-q", "--no-deps", "--ignore-requires-python", "--no-index", "--find-links", wheels, "-r", lock)
    if pip(python, *args, check=False).returncode == 0:
        return
    run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--ignore-requires-python", "-d", wheels,
        "-r", lock)
    for sdist in wheels.glob("*.tar.gz"):  # built once, so that the install needs no index
        run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, sdist)
        sdist.unlink()
    pip(python, *args)


def source_copy(dest: Path) -> Path:
    """The checkout's package sources copied to ``dest``: building in the checkout would leave build/ and egg-info
    there."""
    dest.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, dest / name)
    return dest


@pytest.mark.slow
def test_cliplab_installs_into_skyrls_environment_and_its_plugin_and_conform_work_there(tmp_path):
    torch_base = envs_dir() / "torch"
    if not (torch_base / ".installed").exists():
        if os.environ.get("CLIPLAB_REQUIRE_TARGETS"):
            raise AssertionError(f"{torch_base} is missing; `make targets` builds it")
        pytest.skip(f"{torch_base} is missing (`make targets` builds it)")
    env = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env)
    python = env / "bin" / "python"
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(purelib, "_cliplab_torch_base.pth").write_text(f"{torch_base}\n")
    lock_wheels(python)
    pins = pip(python, "freeze").stdout
    (tmp_path / "pins.txt").write_text(pins)

    source = source_copy(tmp_path / "cliplab")
    pip(python, "install", "-q", "-c", tmp_path / "pins.txt", f"{source}[testing]")
    after = set(pip(python, "freeze").stdout.splitlines())
    assert set(pins.splitlines()) <= after, "a pin of the framework's environment changed"
    unmet = [line for line in pip(python, "check", check=False).stdout.splitlines() if line.startswith("cliplab ")]
    assert not unmet

    project = tmp_path / "project"
    project.mkdir()
    (project / "framework_losses.py").write_text(LOSSES)
    (project / "test_losses.py").write_text(USER_TESTS)
    tests = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--cliplab-seeds", "2", "test_losses.py",
                cwd=project, check=False)
    assert tests.returncode == 1 and "1 failed, 1 passed" in tests.stdout, tests.stdout[-3000:] + tests.stderr
    assert "framework_losses:padded does not conform to grpo" in tests.stdout and "minimal input" in tests.stdout
    cliplab = env / "bin" / "cliplab"
    good = run(cliplab, "conform", "framework_losses:paper", "--adapter", "algorithm=grpo,beta=0", "--seeds", "2",
               cwd=project, check=False)
    # one check per case family (typical, extreme log-ratios, exact ties), every one agreeing
    assert good.returncode == 0 and "3 checks: 3 agrees" in good.stdout, good.stdout + good.stderr
    bad = run(cliplab, "conform", "framework_losses:padded", "--adapter", "algorithm=grpo,beta=0", "--seeds", "2",
              cwd=project, check=False)
    assert bad.returncode == 1 and "closest known convention" in bad.stdout, bad.stdout + bad.stderr
