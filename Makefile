# Two entry points for a fresh machine: `make run` (the app) and `make test` (every test).
# Each creates or reuses .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test

$(VENV)/.runtime: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

run: $(VENV)/.runtime
	$(PY) app.py

test: $(VENV)/.dev
	bash scripts/ensure-chromium.sh
	$(PY) -m pytest
