# grpo-katas. Every target is a thin wrapper over Python; `make test` sets up .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
STAMP   := $(VENV)/.installed
export PYTHONWARNINGS := ignore:Failed to initialize NumPy
TARGET  ?= solutions/grpo.py
SEED    ?= 0

.PHONY: help setup test check verify katas

help:
	@echo "make setup                  create .venv with the pinned dependencies"
	@echo "make test                   the repository's tests, the checks on the reference, and make verify"
	@echo "make check TARGET=path      run the hidden checks against any file implementing the contract"
	@echo "make verify                 prove every bug is caught and every kata fails exactly its FAIL_TO_PASS"
	@echo "make katas                  rebuild katas/*/grpo.py from the reference after editing it"

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest -q tests
	$(PYTHON) -m pytest -q checks
	$(PYTHON) -m grpo_katas.verify

check: $(STAMP)
	$(PYTHON) -m pytest -q checks --target "$(TARGET)" --seed $(SEED)

verify: $(STAMP)
	$(PYTHON) -m grpo_katas.verify

katas: $(STAMP)
	$(PYTHON) -m grpo_katas.catalogue build
