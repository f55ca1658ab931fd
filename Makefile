# grpo-katas. Every target is a thin wrapper over Python; `make test` sets up .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
STAMP   := $(VENV)/.installed
export PYTHONWARNINGS := ignore:Failed to initialize NumPy

CLI     := $(PYTHON) -m grpo_katas.cli

.PHONY: help setup bubblewrap drill stats test check verify katas kata run watch hint solution reset list mock mock-notes mock-end bundle grade train bench gpu-check

help:
	@echo "Practice (each wraps python -m grpo_katas.cli; python -m grpo_katas.cli COMMAND --help says more):"
	@echo "  make kata N=3               start here: kata 3's brief, and your working copy in work/ (never overwritten)"
	@echo "  make run N=3 [STEPS=40] [SET='beta=0.5'] [NPROC=2]"
	@echo "                              train your copy for a few seconds: what it prints, a live table, the curves;"
	@echo "                              the run the brief describes unless STEPS, SET or NPROC say otherwise"
	@echo "  make check N=3              the hidden checks on your copy, by component: the verdict on your fix"
	@echo "  make check TARGET=f.py      the same table for any file implementing the contract (SEED=0 by default)"
	@echo "  make watch N=3              rerun the checks on every save, for an edit-save-look loop"
	@echo "  make hint N=3               the next rung of the hint ladder when you are stuck (hints before solving count)"
	@echo "  make solution N=3 [FORCE=1] after solving: the diff to the reference and why each bug matters"
	@echo "  make reset N=3 [YES=1]      start over: your copy goes to backups/, the pristine kata comes back"
	@echo "  make list                   every kata and your progress, to choose what to practise next"
	@echo "  make drill [TIER=] [BUGS=] [CODEBASE=] [SEED=]"
	@echo "                              a fresh kata drawn from the catalogue, proven, started as N=d1, d2, ...;"
	@echo "                              without SEED it leans towards the bug classes you keep missing"
	@echo "  make stats                  your drill record per bug class: attempts, solve rate, time, when due"
	@echo "Mock interviews:"
	@echo "  make mock [N=] [TIER=] [MINUTES=]  a timed round on a kata you have not solved; Ctrl-C stops the clock"
	@echo "  make mock-end               end the round: checks, time on the clock, hints, and a scorecard in work/rounds/"
	@echo "  make mock-notes N=7         the interviewer's sheet (planted bugs, hints, rubric): it gives the answers away"
	@echo "  make bundle N=7 OUT=dir     what a candidate gets for a live round: the loop, its brief, run.py and lab/"
	@echo "  make grade N=7 SUBMISSION=f OUT=dir  grade a submitted fix in isolation: results.json, junit.xml, summary.md"
	@echo "The reference trainer:"
	@echo "  make train [TASK=sum] [STEPS=200] [DEVICE=auto] [SET='beta=0.1 lr=3e-3'] [OUT=runs/x] [RESUME=1] [COMPILE=1]"
	@echo "             [NPROC=2]        NPROC: data-parallel ranks under torchrun (gloo on the CPU, NCCL on GPUs)"
	@echo "                              train the reference with a live display; OUT keeps metrics and checkpoints,"
	@echo "                              RESUME=1 continues one (python -m grpo_katas.trainer --help explains each flag)"
	@echo "  make bench                  how fast the reference trains on this machine, stage by stage"
	@echo "  make gpu-check              on a CUDA machine: the reference on the GPU, then a bf16 run of an 8x512 model"
	@echo "  MODEL=hub/name|folder       train, run, bench and gpu-check on a Hugging Face causal LM (README: Real models)"
	@echo "The repository:"
	@echo "  make setup                  create .venv with the pinned dependencies (make test does it on first use)"
	@echo "  make bubblewrap             install the checks' sandbox (bwrap) when missing; make setup runs it"
	@echo "  make test                   the tests (not the slow ones), the checks on the reference, and the proof's"
	@echo "                              static rules; katas reproduced against their records (.ci/run adds the rest)"
	@echo "  make verify [FRESH=1]       prove every bug is caught in every codebase and every kata fails exactly its"
	@echo "                              FAIL_TO_PASS; reuses the verdicts of unchanged targets, FRESH=1 judges all"
	@echo "  make katas                  rebuild katas/*/grpo.py after editing solutions/grpo.py or katas/bugs.toml"

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -e .
	@# pip byte-compiles one file at a time; compileall on every core does the same work in half the time on two
	@# (a file of torch's tests is Python 3.12 syntax that 3.11 cannot compile: pip skips it quietly, so does this)
	@$(PYTHON) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
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

# make test: the tests but the slow ones (a kata of each codebase reproduced against its recorded run among them), the
# checks on the reference, and the proof's static rules beside them (tests/__main__.py); .ci/run adds the slow tests
# and the whole proof (make verify FRESH=1)
test: $(STAMP)
	$(PYTHON) -m tests

# N given, even empty (`make check N=`), means a kata; else TARGET, a file; with neither the CLI asks which kata.
# Both print the same component table; `pytest checks --target FILE` gives pytest's own report.
check: $(STAMP)
ifneq ($(origin N),undefined)
	@$(CLI) check "$(N)"
else ifneq ($(origin TARGET),undefined)
	@$(CLI) check --target "$(TARGET)" --seed "$(if $(SEED),$(SEED),0)"
else
	@$(CLI) check
endif

kata watch hint: $(STAMP)
	@$(CLI) $@ "$(N)"

# SET is split into KEY=VALUE words on purpose (SET="beta=0.5 lr=3e-3"); every other value is passed whole.
# FORCE, YES, RESUME, COMPILE and CHECKPOINTING go through as given: 1/yes/true/on mean yes, 0/no/false/off mean no.
run: $(STAMP)
	@$(CLI) run "$(N)" $(if $(STEPS),--steps "$(STEPS)") $(if $(SET),--set $(SET)) $(if $(NPROC),--nproc "$(NPROC)") \
		$(if $(MODEL),--hf-model $(MODEL)) $(if $(TASK),--task "$(TASK)")

solution: $(STAMP)
	@$(CLI) solution "$(N)" $(if $(FORCE),--force="$(FORCE)")

reset: $(STAMP)
	@$(CLI) reset "$(N)" $(if $(YES),--yes="$(YES)")

list: $(STAMP)
	@$(CLI) list

drill: $(STAMP)
	@$(CLI) drill $(if $(TIER),--tier "$(TIER)") $(if $(BUGS),--bugs "$(BUGS)") \
		$(if $(CODEBASE),--codebase "$(CODEBASE)") $(if $(SEED),--seed "$(SEED)")

stats: $(STAMP)
	@$(CLI) stats

verify: $(STAMP)
	$(PYTHON) -m grpo_katas.verify $(if $(filter 1 yes true,$(FRESH)),--fresh)

katas: $(STAMP)
	$(PYTHON) -m grpo_katas.catalogue build

mock: $(STAMP)
	@$(CLI) mock "$(N)" $(if $(TIER),--tier "$(TIER)") $(if $(MINUTES),--minutes "$(MINUTES)")

mock-notes: $(STAMP)
	@$(CLI) mock-notes "$(N)"

mock-end: $(STAMP)
	@$(CLI) mock-end

bundle: $(STAMP)
	@$(CLI) bundle "$(N)" "$(OUT)"

grade: $(STAMP)
	@$(PYTHON) -m grpo_katas.grade "$(N)" "$(SUBMISSION)" "$(OUT)"

train: $(STAMP)
	@$(PYTHON) -m grpo_katas.trainer $(if $(TASK),--task "$(TASK)") $(if $(STEPS),--steps "$(STEPS)") \
		$(if $(DEVICE),--device "$(DEVICE)") $(if $(SET),--set $(SET)) $(if $(OUT),--out "$(OUT)") \
		$(if $(RESUME),--resume="$(RESUME)") $(if $(COMPILE),--compile="$(COMPILE)") $(if $(NPROC),--nproc "$(NPROC)") \
		$(if $(MODEL),--hf-model $(MODEL)) $(if $(CHECKPOINTING),--gradient-checkpointing="$(CHECKPOINTING)")

bench: $(STAMP)
	@$(PYTHON) -m grpo_katas.bench $(if $(DEVICE),--device "$(DEVICE)") $(if $(MODEL),--hf-model $(MODEL))

gpu-check: $(STAMP)
	@$(PYTHON) -m grpo_katas.gpu_check $(if $(MODEL),--hf-model $(MODEL))
