# The two commands a newcomer runs: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[demo,test]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/bisect-npu demo

lint: venv
	$(VENV)/bin/ruff check .

test: venv lint
	$(PY) -m pytest -q
