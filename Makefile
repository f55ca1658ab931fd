# grpo-katas. Every target is a thin wrapper over Python; `make test` sets up .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
STAMP   := $(VENV)/.installed
export PYTHONWARNINGS := ignore:Failed to initialize NumPy
TARGET  ?= solutions/grpo.py
SEED    ?= 0

CLI     := $(PYTHON) -m grpo_katas.cli

.PHONY: help setup bubblewrap test check verify katas kata run watch hint solution reset list mock mock-notes mock-end bundle grade train bench gpu-check

help:
	@echo "make setup                  create .venv with the pinned dependencies"
	@echo "make test                   the repository's tests, the checks on the reference, and make verify"
	@echo "make kata N=3               show kata 3's brief and start (or resume) your working copy in work/"
	@echo "make run N=3 [SET='beta=0.5'] train your copy briefly with a live display"
	@echo "make check N=3              run the hidden checks on your copy (or TARGET=path for any file)"
	@echo "make watch N=3              rerun the checks whenever your copy is saved"
	@echo "make hint N=3               the next hint"
	@echo "make solution N=3 [FORCE=1] the diff to the reference and why each bug matters"
	@echo "make reset N=3 [YES=1]      back up your copy and restore the pristine kata"
	@echo "make list                   every kata and your progress"
	@echo "make mock [N=] [TIER=] [MINUTES=]  a timed mock interview round; make mock-end writes the scorecard"
	@echo "make mock-notes N=7         the interviewer's sheet: planted bugs, hints, rubric"
	@echo "make grade N=7 SUBMISSION=f OUT=dir  grade a submitted fix: results.json, junit.xml, summary.md"
	@echo "make bundle N=7 OUT=dir     the candidate's bundle for a live round (no checks, no solutions)"
	@echo "make train [TASK=sum] [STEPS=200] [DEVICE=auto] [SET='beta=0.1 lr=3e-3'] [OUT=runs/x] [RESUME=1]"
	@echo "make bench                  the reference trainer's speed on this machine, as a table"
	@echo "make gpu-check              on a CUDA machine: the reference on the GPU, then a bf16 8x512 run"
	@echo "make verify                 prove every bug is caught and every kata fails exactly its FAIL_TO_PASS"
	@echo "make katas                  rebuild katas/*/grpo.py from the reference after editing it"

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	@command -v bwrap >/dev/null || $(MAKE) --no-print-directory bubblewrap
	touch $(STAMP)

# The checks run the code under test in a bubblewrap sandbox. Without it they still run, in a plain process
# that can see the repository (README: "Grading submitted fixes"); as root on Debian or Ubuntu we install it.
bubblewrap:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing bubblewrap (the checks' sandbox)"; \
		apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
		echo "could not install bubblewrap: the checks will run in a plain process"; \
	else \
		echo "bubblewrap (bwrap) is not installed: the checks will run in a plain process, not a sandbox;" \
		     "install it with your package manager (Debian/Ubuntu: sudo apt-get install bubblewrap)"; \
	fi

setup: $(STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest -q tests
	$(PYTHON) -m pytest -q checks
	$(PYTHON) -m grpo_katas.verify

check: $(STAMP)
ifdef N
	@$(CLI) check "$(N)"
else
	$(PYTHON) -m pytest -q checks --target "$(TARGET)" --seed $(SEED)
endif

kata watch hint: $(STAMP)
	@$(CLI) $@ "$(N)"

run: $(STAMP)
	@$(CLI) run "$(N)" $(if $(SET),--set $(SET))

solution: $(STAMP)
	@$(CLI) solution "$(N)" $(if $(FORCE),--force)

reset: $(STAMP)
	@$(CLI) reset "$(N)" $(if $(YES),--yes)

list: $(STAMP)
	@$(CLI) list

verify: $(STAMP)
	$(PYTHON) -m grpo_katas.verify

katas: $(STAMP)
	$(PYTHON) -m grpo_katas.catalogue build

mock: $(STAMP)
	@$(CLI) mock "$(N)" $(if $(TIER),--tier $(TIER)) $(if $(MINUTES),--minutes $(MINUTES))

mock-notes: $(STAMP)
	@$(CLI) mock-notes "$(N)"

mock-end: $(STAMP)
	@$(CLI) mock-end

bundle: $(STAMP)
	@$(CLI) bundle "$(N)" "$(OUT)"

grade: $(STAMP)
	@$(PYTHON) -m grpo_katas.grade "$(N)" "$(SUBMISSION)" "$(OUT)"

train: $(STAMP)
	@$(PYTHON) -m grpo_katas.trainer $(if $(TASK),--task $(TASK)) $(if $(STEPS),--steps $(STEPS)) \
		$(if $(DEVICE),--device $(DEVICE)) $(if $(SET),--set $(SET)) $(if $(OUT),--out $(OUT)) \
		$(if $(RESUME),--resume) $(if $(COMPILE),--compile)

bench: $(STAMP)
	@$(PYTHON) -m grpo_katas.bench $(if $(DEVICE),--device $(DEVICE))

gpu-check: $(STAMP)
	@$(PYTHON) -m grpo_katas.gpu_check
