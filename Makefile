# grpo-katas. Every target is a thin wrapper over Python; `make test` sets up .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
STAMP   := $(VENV)/.installed
export PYTHONWARNINGS := ignore:Failed to initialize NumPy

VIA     := GRPO_KATAS_MAKE=1   # usage errors in the words of make's settings (STEPS=, not --steps)
CLI     := $(VIA) $(PYTHON) -m grpo_katas.practice.cli

# --- how a target ends ------------------------------------------------------------------------------------
# A command's own last line says how it went (a check's verdict, "nothing changed", "interrupted"); make adds
# nothing to it. GNU make prints "make: *** [Makefile:86: check] Error 1" for every recipe that fails, which
# reads as a crash, and "Interrupt" after Ctrl-C. So each target T runs its command in .do-T, as a line that
# make never sees fail (prefix -, silent under .SILENT) and that records the command's exit status; T itself
# then reads it back. Make's one quiet way to end with a status other than 0 is question mode (-q): a target
# whose recipe still has a line to run makes it exit 1 and print nothing. The command lines are marked + so
# that they run under -q all the same; T's line is `false` when the status was not 0, and nothing otherwise.
# Through make: 0 when the command succeeded, 1 when it did not (its own last line says why; the CLI itself
# keeps 2 for bad input), 130 after Ctrl-C (make ends as SIGINT ends it, which a shell does not report).
# `make -n` still prints the commands without running them (no -q, no +).
DRY := $(findstring n,$(filter-out --%,$(firstword -$(MAKEFLAGS))))
ifeq ($(DRY),)
MAKEFLAGS += -q
RUN := +-
endif
MAKEFLAGS += -r --no-print-directory
unexport MAKEFLAGS MFLAGS  # a command that runs make itself (the tests do) starts from its own flags
.SUFFIXES:
.SILENT:
# The statuses go in a folder of this make's own (mktemp -d: mode 0700, a name nobody can guess), never under a
# shared name another user could put a FIFO or a link at; it is gone with the last status read (the last goal's, or
# the first that failed, after which make stops).
# (made under make -n too: the line that reads a status is expanded there as well, and must name this folder)
STATUS := $(shell mktemp -d "$${TMPDIR:-/tmp}/grpo-katas-make.XXXXXXXXXX")
LAST_GOAL := $(lastword $(or $(MAKECMDGOALS),help))
# the status the command of target $(1) recorded, the file gone, and the folder with it after the last one
status_of = $(shell s=$$(cat $(STATUS)/$(1) 2>/dev/null); rm -f $(STATUS)/$(1); \
              if [ "$$s" != 0 ] || [ $(1) = $(LAST_GOAL) ]; then rmdir $(STATUS) 2>/dev/null; fi; echo "$$s")
# $(call do,T): the recipe line of .do-T, which runs DO_T (a variable: a command holds commas, which would split
# the call's arguments)
do = $(RUN)$(if $(call refused,$(1)),$(call refusal,$(1)),$(if $(MULTILINE),$(LINE_BREAK),$(DO_$(1)))); \
     echo $$? > $(STATUS)/$(1)

# --- the settings each target takes -----------------------------------------------------------------------
# A setting given on the command line that a target does not take is refused in one line, never ignored.
# (PY, the Python that makes .venv, goes with every target.)
VARIABLES := N TARGET SEED STEPS SET NPROC MODEL TASK DEVICE BUDGET FORCE YES TIER BUGS CODEBASE MINUTES OUT \
             SUBMISSION RESUME COMPILE CHECKPOINTING EVAL_EVERY SAMPLES FRESH ALL COMPONENT FORMAT
TAKES_kata        := N
TAKES_next        := TIER CODEBASE
TAKES_run         := N STEPS SET NPROC MODEL TASK SEED DEVICE BUDGET
TAKES_check       := N TARGET SEED ALL COMPONENT FORMAT
TAKES_watch       := N SEED ALL COMPONENT
TAKES_hint        := N
TAKES_solution    := N FORCE
TAKES_reset       := N YES
TAKES_list        := TIER CODEBASE
TAKES_drill       := TIER BUGS CODEBASE SEED
TAKES_mock        := N TIER MINUTES
TAKES_mock-notes  := N
TAKES_bundle      := N OUT
TAKES_grade       := N SUBMISSION OUT SEED
TAKES_train       := TASK STEPS DEVICE SET OUT RESUME COMPILE NPROC MODEL CHECKPOINTING SEED EVAL_EVERY SAMPLES
TAKES_bench       := DEVICE MODEL
TAKES_gpu-check   := MODEL
TAKES_verify      := FRESH
# why a target does not take a setting, where a user would expect it to
WHY_check_MODEL   := the checks judge your functions on the lab model, whatever MODEL says; \
                     make run N=.. MODEL=.. runs your loop on a real model
WHY_watch_MODEL   := $(WHY_check_MODEL)
WHY_check_STEPS   := the checks have their own inputs; make run N=.. STEPS=.. trains your copy longer
WHY_check_SET     := the checks set every GRPOConfig field themselves; make run N=.. SET=.. runs with yours
WHY_check_DEVICE  := the checks run on the CPU; make run N=.. DEVICE=cuda trains your copy on a GPU
WHY_check_NPROC   := the checks run two ranks themselves (update and training); make run N=.. NPROC=2 runs yours
WHY_kata_MODEL    := a kata is the same loop on any model; make run N=.. MODEL=.. runs it on one
# Any other variable given on the command line (STEP=2, seed=5, FOO=1) is refused too, naming a setting the target
# takes that it is a near miss of: the same letters in another case, or one the start of the other.
refused  = $(firstword $(UNKNOWN) $(filter-out $(TAKES_$(1)),$(GIVEN)))
refusal  = printf 'error: make %s does not take %s=: %s\n' $(1) '$(subst ','\'',$(call refused,$(1)))' "$(or \
           $(WHY_$(1)_$(call refused,$(1))),$(if $(call near,$(1)),did you mean $(call near,$(1))=? )$(if \
           $(TAKES_$(1)),it takes $(TAKES_$(1)),it takes no setting) (make help lists what each target takes))" >&2; \
           (exit 2)
near     = $(shell w=$$(printf '%s' '$(subst ','\'',$(call refused,$(1)))' | tr a-z A-Z); for t in $(TAKES_$(1)); do \
           case "$$t" in ("$$w"|"$$w"?*) echo $$t; exit;; esac; case "$$w" in ("$$t"?*) echo $$t; exit;; esac; done)
# a switch as the CLI takes it (1/yes/true/on or 0/no/false/off; anything else is refused there)
switch   = $(if $($(1)),$(2)=$(call q,$(1)))

# --- a value reaches the CLI as typed ---------------------------------------------------------------------
# Neither make nor the shell may expand what a user typed: GNU make expands a command-line variable's value wherever
# it is read, and again when it exports it to a recipe's environment (even one that never reads it), so
# `SUBMISSION='$$(shell id)'` ran `id`, and a shell runs backquotes and $$(...) inside double quotes. So the settings
# given (GIVEN, taken first: this changes their origin) are each kept as the text typed (override, simply expanded:
# a $$(value ...) is never expanded again), none is exported, and each reaches the shell in single quotes: q.
GIVEN := $(foreach v,$(VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
UNKNOWN := $(filter-out $(VARIABLES) PY,$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v))))
$(foreach v,$(GIVEN),$(eval override $(v) := $$(value $(v))))
unexport $(GIVEN)
q        = '$(subst ','\'',$($(1)))'
# SET, split into KEY=VALUE words on purpose (SET="beta=0.5 lr=3e-3"), each word quoted
qwords   = $(foreach w,$($(1)),'$(subst ','\'',$(w))')
# a value with a line break in it would end the recipe's command line: the first such setting is refused by name
define LF


endef
MULTILINE  := $(firstword $(foreach v,$(GIVEN),$(if $(findstring $(LF),$($(v))),$(v))))
LINE_BREAK  = echo "error: $(MULTILINE)= holds a line break: a setting is one line" >&2; (exit 2)

TARGETS := help setup bubblewrap test check verify katas kata next run watch hint solution reset list drill \
           stats mock mock-notes mock-end bundle grade train bench gpu-check
.PHONY: $(TARGETS) $(addprefix .do-,$(TARGETS)) .do-venv .no-such-target

$(TARGETS): %: .do-%
	$(if $(filter 0,$(call status_of,$*)),,false)

.do-help:
	$(call do,help)
DO_help = printf '%s\n' $(HELP)

# 80 columns at most, one quoted line each
HELP := \
 "Practice (each wraps grpo_katas.practice.cli; COMMAND --help says more):" \
 "  make kata N=3        start here: the brief, and your copy in work/ (kept)" \
 "  make next            start the next kata you have not solved [TIER= CODEBASE=]" \
 "  make run N=3         train your copy: its output, a live table, the curves" \
 "       [STEPS=40] [SET='beta=0.5'] [SEED=0] [NPROC=2] [DEVICE=cuda|mps] [MODEL=]" \
 "       [BUDGET=60]     CPU-s a step may take before it is stopped as hung" \
 "  make check N=3       the hidden checks on your copy: the verdict on your fix" \
 "       [SEED=0] [ALL=1] every failing check, [COMPONENT=loss] one component," \
 "       [FORMAT=json]   the verdict as JSON for scripts" \
 "  make check TARGET=f.py  the same for any file implementing the contract" \
 "  make watch N=3       rerun the checks on every save; moves on once solved" \
 "  make hint N=3        the next rung of the hint ladder (hints before solving" \
 "                       count)" \
 "  make solution N=3    after solving: the diff and why each bug matters" \
 "       [FORCE=1]       before solving: reveal it anyway (recorded)" \
 "  make reset N=3       your copy to backups/, the pristine kata back [YES=1]" \
 "  make list            katas, drills and your progress [TIER= CODEBASE=]" \
 "  make drill           a fresh kata drawn from the catalogue, proven, as d1..." \
 "       [TIER=] [BUGS=] [CODEBASE=] [SEED=]; without SEED, towards your misses" \
 "  make stats           your drill record per bug class" \
 "Mock interviews:" \
 "  make mock [N=] [TIER=] [MINUTES=]  a timed round; Ctrl-C stops the clock" \
 "  make mock-end        end the round: checks, time, hints, a scorecard" \
 "  make mock-notes N=7  the interviewer's sheet: it gives the answers away" \
 "  make bundle N=7 OUT=dir  what a candidate gets: loop, brief, run.py, lab/" \
 "  make grade N=7 SUBMISSION=f OUT=dir [SEED=]  grade a fix in isolation" \
 "The reference trainer (grpo_katas.training.train --help explains each):" \
 "  make train           train the reference with a live display" \
 "       [TASK=sum] [STEPS=200] [SEED=0] [DEVICE=auto|mps] [SET='beta=0.1']" \
 "       [OUT=runs/x] [RESUME=1] keep metrics, samples, checkpoints; continue" \
 "       [EVAL_EVERY=20] [SAMPLES=2] held-out reward, completions in the log" \
 "       [COMPILE=1] [NPROC=2] [MODEL=m] [CHECKPOINTING=1]" \
 "  make bench           how fast the reference trains here [DEVICE= MODEL=]" \
 "  make gpu-check       on CUDA: the reference on the GPU, then a bf16 run" \
 "  MODEL=hub/name|dir   a Hugging Face causal LM (docs/trainer.md)" \
 "The repository:" \
 "  make setup           create .venv with the pinned dependencies" \
 "  make bubblewrap      install the checks' sandbox (bwrap) when missing" \
 "  make test            the tests (not the slow ones), the checks on the" \
 "                       reference, the proof's static rules, katas reproduced" \
 "  make verify          prove every bug is caught, every kata fails exactly its" \
 "       [FRESH=1]       FAIL_TO_PASS; FRESH=1 judges all again" \
 "  make katas           rebuild katas/*/grpo.py after editing the reference" \
 "A setting a target does not take is refused; through make the exit status is" \
 "0 (done), 1 (not done: the last line says why) or 130 (Ctrl-C)."

# .venv is made (unless CURRENT, below) in .do-venv, whose status $(STAMP) reads back as a target reads its command's:
# a failed step ends the set-up with its own words and status 1 under any make (make 3.81, macOS's, adds its
# "*** Error 1" line even to a step that fails in question mode).
# pip byte-compiles one file at a time; compileall on every core does the same work in half the time on two
# (a file of torch's tests is Python 3.12 syntax that 3.11 cannot compile: pip skips it quietly, so does this)
.do-venv:
	$(if $(CURRENT),,$(RUN){ $(MAKE_VENV); }; echo $$? > $(STATUS)/venv)
MAKE_VENV = echo "setting up $(VENV) with the pinned dependencies (a minute or two, once)" && \
	$(PY) -m venv $(VENV) && \
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -e '.[dev]' && \
	{ $(PYTHON) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true; } && \
	{ command -v bwrap >/dev/null || { $(DO_bubblewrap); }; } && \
	touch $(STAMP)
$(STAMP): .do-venv
	$(if $(CURRENT),,$(if $(filter 0,$(call status_of,venv)),,false))

# The checks run the code under test in a bubblewrap sandbox. Without it they still run, in a plain process
# that can see the repository (docs/grading.md); as root on Debian or Ubuntu we install it.
.do-bubblewrap:
	$(call do,bubblewrap)
DO_bubblewrap = if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing bubblewrap (the checks' sandbox)"; \
		apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
		echo "could not install bubblewrap: the checks will run in a plain process"; \
	else \
		echo "bubblewrap (bwrap) is not installed: the checks will run in a plain process, not a sandbox;" \
		     "install it with your package manager (Debian/Ubuntu: sudo apt-get install bubblewrap)"; \
	fi

# (whether .venv was current before this make began: then a second `make setup` says so)
CURRENT := $(shell [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt constraints.txt ] && echo yes)
.do-setup: $(STAMP)
	$(call do,setup)
DO_setup = $(if $(CURRENT),echo "$(VENV) is up to date with pyproject.toml and constraints.txt; nothing to do",true)

# make test: the tests but the slow ones (a kata of each codebase reproduced against its recorded run among them), the
# checks on the reference, and the proof's static rules beside them (tests/__main__.py); .ci/run adds the slow tests
# and the whole proof (make verify FRESH=1)
.do-test: $(STAMP)
	$(call do,test)
DO_test = $(PYTHON) -m tests

# N given, even empty (`make check N=`), means a kata; else TARGET, a file; with neither the CLI asks which kata.
# Both print the same component table; `pytest checks --target FILE` gives pytest's own report.
CHECK_FLAGS = $(if $(SEED),--seed $(call q,SEED)) $(call switch,ALL,--all) $(if $(COMPONENT),--component $(call q,COMPONENT))
.do-check: $(STAMP)
	$(call do,check)
DO_check = $(if $(filter N,$(GIVEN)),$(if $(filter TARGET,$(GIVEN)),$(BOTH_N_AND_TARGET),$(CHECK)),$(CHECK))
BOTH_N_AND_TARGET = echo "error: make check takes N= (your copy of a kata) or TARGET= (any file), not both" >&2; \
		(exit 2)
CHECK = $(CLI) check $(CHECK_FLAGS) $(if $(FORMAT),--format $(call q,FORMAT)) $(if $(filter-out \
		undefined,$(origin N)),-- $(call q,N),$(if $(filter-out undefined,$(origin TARGET)),--target $(call q,TARGET)))

.do-watch: $(STAMP)
	$(call do,watch)
DO_watch = $(CLI) watch $(CHECK_FLAGS) -- $(call q,N)

.do-kata: $(STAMP)
	$(call do,kata)
DO_kata = $(CLI) kata -- $(call q,N)

.do-hint: $(STAMP)
	$(call do,hint)
DO_hint = $(CLI) hint -- $(call q,N)

.do-next: $(STAMP)
	$(call do,next)
DO_next = $(CLI) next $(if $(TIER),--tier $(call q,TIER)) $(if $(CODEBASE),--codebase $(call q,CODEBASE))

# SET is split into KEY=VALUE words on purpose (SET="beta=0.5 lr=3e-3"); every other value is passed whole, and a
# target's own values after --, so that one that begins with - (N=-h) is a value, never an option.
# FORCE, YES, ALL, RESUME, COMPILE and CHECKPOINTING go through as given: 1/yes/true/on mean yes, 0/no/false/off no.
.do-run: $(STAMP)
	$(call do,run)
DO_run = $(CLI) run $(if $(STEPS),--steps $(call q,STEPS)) $(if $(NPROC),--nproc $(call q,NPROC)) \
		$(if $(MODEL),--hf-model $(call q,MODEL)) $(if $(TASK),--task $(call q,TASK)) $(if $(SEED),--seed $(call q,SEED)) \
		$(if $(DEVICE),--device $(call q,DEVICE)) $(if $(BUDGET),--budget $(call q,BUDGET)) \
		$(if $(SET),--set $(call qwords,SET)) -- $(call q,N)

.do-solution: $(STAMP)
	$(call do,solution)
DO_solution = $(CLI) solution $(call switch,FORCE,--force) -- $(call q,N)

.do-reset: $(STAMP)
	$(call do,reset)
DO_reset = $(CLI) reset $(call switch,YES,--yes) -- $(call q,N)

.do-list: $(STAMP)
	$(call do,list)
DO_list = $(CLI) list $(if $(TIER),--tier $(call q,TIER)) $(if $(CODEBASE),--codebase $(call q,CODEBASE))

.do-drill: $(STAMP)
	$(call do,drill)
DO_drill = $(CLI) drill $(if $(TIER),--tier $(call q,TIER)) $(if $(BUGS),--bugs $(call q,BUGS)) \
		$(if $(CODEBASE),--codebase $(call q,CODEBASE)) $(if $(SEED),--seed $(call q,SEED))

.do-stats: $(STAMP)
	$(call do,stats)
DO_stats = $(CLI) stats

.do-verify: $(STAMP)
	$(call do,verify)
DO_verify = $(PYTHON) -m grpo_katas.proof.verify $(if $(filter FRESH,$(GIVEN)),--fresh $(call q,FRESH))

.do-katas: $(STAMP)
	$(call do,katas)
DO_katas = $(PYTHON) -m grpo_katas.catalogue.katas build

.do-mock: $(STAMP)
	$(call do,mock)
DO_mock = $(CLI) mock $(if $(TIER),--tier $(call q,TIER)) $(if $(MINUTES),--minutes $(call q,MINUTES)) -- $(call q,N)

.do-mock-notes: $(STAMP)
	$(call do,mock-notes)
DO_mock-notes = $(CLI) mock-notes -- $(call q,N)

.do-mock-end: $(STAMP)
	$(call do,mock-end)
DO_mock-end = $(CLI) mock-end

.do-bundle: $(STAMP)
	$(call do,bundle)
DO_bundle = $(CLI) bundle -- $(call q,N) $(call q,OUT)

.do-grade: $(STAMP)
	$(call do,grade)
DO_grade = $(PYTHON) -m grpo_katas.judge.grade $(if $(SEED),--seed $(call q,SEED)) -- $(call q,N) $(call q,SUBMISSION) $(call q,OUT)

.do-train: $(STAMP)
	$(call do,train)
DO_train = $(VIA) $(PYTHON) -m grpo_katas.training.train $(if $(TASK),--task $(call q,TASK)) $(if $(STEPS),--steps $(call q,STEPS)) \
		$(if $(DEVICE),--device $(call q,DEVICE)) $(if $(SET),--set $(call qwords,SET)) $(if $(OUT),--out $(call q,OUT)) \
		$(call switch,RESUME,--resume) $(call switch,COMPILE,--compile) $(if $(NPROC),--nproc $(call q,NPROC)) \
		$(if $(MODEL),--hf-model $(call q,MODEL)) $(call switch,CHECKPOINTING,--gradient-checkpointing) \
		$(if $(SEED),--seed $(call q,SEED)) $(if $(EVAL_EVERY),--eval-every $(call q,EVAL_EVERY)) \
		$(if $(SAMPLES),--samples $(call q,SAMPLES))

.do-bench: $(STAMP)
	$(call do,bench)
DO_bench = $(PYTHON) -m grpo_katas.training.bench $(if $(DEVICE),--device $(call q,DEVICE)) \
		$(if $(MODEL),--hf-model $(call q,MODEL))

.do-gpu-check: $(STAMP)
	$(call do,gpu-check)
DO_gpu-check = $(PYTHON) -m grpo_katas.training.gpu_check $(if $(MODEL),--hf-model $(call q,MODEL))

# the files make reads, so that the rule below never takes them for a target
Makefile pyproject.toml constraints.txt: ;

# Anything else (a typo: `make runs`, where runs/ is a folder make would call up to date) is no target: one line.
%: .no-such-target
	$(RUN)echo "error: there is no target '$@'; make help lists them" >&2; rmdir $(STATUS) 2>/dev/null
	false
