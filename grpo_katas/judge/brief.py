"""The brief's run as a check, `run::brief_symptoms_gone`: the file trains as `make run` trains it, and each symptom
its brief cites must be gone from its run, unless the healthy codebase's own run shows it too.

The rule is the proof's (grpo_katas/catalogue/symptoms.py): `shows(kata, symptom, loop=file)` compares the file's run with
the healthy codebase's under the kata's [run] settings (or the rerun a symptom names), and a healed bug's symptom
does not show. A symptom the healthy codebase shows as well (the first step's reward, which no bug has moved yet)
sets the scene of the brief, and is not asked to go. A run must also finish every step and log every number a
symptom reads as a finite number: a crash or a NaN is no healing.

Where each run is made:
- the file's runs (the brief's run in full, and each rerun a symptom compares with), each in a run's sandbox of its
  own that this process starts (sandbox.start_run, the worker's mode and limits, a CPU budget of RUN_CPU_S per
  rank): `grpo_katas.training.runner` as `make run` starts it, with the same paths, environment, command line and channels,
  and nothing of the judge's or of the worker's (which imported the file for the checks) within reach: a file
  that changes the worker at import, sets a variable there, or looks for the judge's files cannot reach the run.
  Each step's numbers and how the run ended are read here, from the run's own channel.
- the healthy codebase's runs, here, from trusted files outside the sandbox: read from .cache/symptoms/ or made by
  a child process (symptoms.Store), under this process's kernel path. They are made while the checks run.
Every comparison is made here; a file only ever sends the numbers its training logged.
"""
import json
import math
import os
import tempfile
import threading
from pathlib import Path

from grpo_katas.catalogue import symptoms
from grpo_katas.catalogue.katas import CODEBASES
from grpo_katas.judge.client import display
from grpo_katas.judge.loop_run import LoopRun


RUN_CPU_S = 60.0   # CPU seconds a run may use, per rank (the reference's 40-step run: about 6 s, its start included)
RUN_STEPS = 10_000  # steps kept from a run's events


FILE = "<the file judged>"   # the file's runs, as symptoms.shows asks for them: made in the sandbox, never here


class Brief:
    """A kata's brief's run, judged for one file (the healthy codebase itself included: its runs in the sandbox are
    the file's, those made here are the healthy ones)."""

    def __init__(self, kata):
        self.kata = kata
        self.healthy = CODEBASES[kata.codebase].path
        self.kernel = symptoms.kernel()
        self.store = symptoms.Store(cache_folder())
        self.problem = None
        self.thread = threading.Thread(target=self.make_healthy_runs, name="healthy-runs", daemon=True)
        self.file_thread, self.file_made, self.cancelled = None, None, threading.Event()

    def start(self, path: Path | None = None, mode: str = "", deadline: float | None = None) -> "Brief":
        """Make (or read) the healthy runs in the background, while the checks run; with the file's `path` (and the
        worker's sandbox mode), the file's runs too, once the healthy ones say which it needs: each in a run's
        sandbox of its own, so nothing the checks' worker holds reaches them. The verdict waits for both."""
        if self.kata.symptoms:
            self.thread.start()
            if path is not None:
                self.file_thread = threading.Thread(target=self.make_file_runs, args=(Path(path), mode, deadline),
                                                    name="file-runs", daemon=True)
                self.file_thread.start()
        return self

    def make_file_runs(self, path: Path, mode: str, deadline: float | None) -> None:
        try:
            self.thread.join()
            if self.problem is None:
                self.file_made = self.run_file(path, mode, deadline, self.required())
        except Exception as exc:  # the judge's own side: the verdict says so, it is no pass
            self.file_made = None, f"the brief's run could not be made ({type(exc).__name__}: {exc})"

    def make_healthy_runs(self) -> None:
        try:
            self.store.fetch({self.kernel: self.healthy_runs()}, processes=1)
        except Exception as exc:  # the trusted side failed: the verdict says so, it is no pass
            self.problem = f"{type(exc).__name__}: {exc}"

    def healthy_runs(self) -> list:
        """(path, settings) of every healthy run a verdict reads: each symptom's comparison, for the file and for the
        healthy codebase in its place (which decides the symptoms a healed file must lose)."""
        out = []
        for s in self.kata.symptoms:
            for loop in (FILE, self.healthy):
                out += [side for side in symptoms.sides(self.kata, s, None, loop) if side and side[0] != FILE]
        return out

    def healthy_run(self, path, settings) -> symptoms.Run:
        return self.store.get(path, settings, self.kernel)

    def required(self) -> list:
        """The symptoms a healed file must lose: those the healthy codebase's own run does not show."""
        return [s for s in self.kata.symptoms
                if not symptoms.shows(self.kata, s, None, self.healthy_run, self.healthy)[0]]

    def file_runs(self, required: list) -> dict:
        """key -> settings of each run of the file the verdict reads: the brief's run in full, then each rerun a
        required symptom compares with, as many steps as its window needs (a run's first steps do not depend on
        how many follow)."""
        runs = {}
        for settings in [dict(self.kata.run)] + [side[1] for s in required
                                                 for side in symptoms.sides(self.kata, s, None, FILE)
                                                 if side and side[0] == FILE]:
            key = settings_key(settings)
            if key not in runs or runs[key]["steps"] < settings["steps"]:
                runs[key] = settings
        return runs

    def skipped(self) -> str | None:
        """Why there is no run to judge, or None."""
        return None if self.kata.symptoms else "its brief cites no symptom to judge a run by"

    def verdict(self, target) -> tuple:
        """(passed, message, kind) for the file behind `target` (a client.Target): kind is how a failure came
        about, as the checks' verdicts say it (assertion: a symptom shows; call: the run failed; error: the judge's
        own side failed)."""
        why = self.not_run(target) or self.healthy_problem()
        if why:
            return False, *why
        required = self.required()
        if self.file_thread is not None:  # made beside the checks
            self.file_thread.join()
            made, why = self.file_made
        else:
            w = target.worker
            made, why = self.run_file(w.targets[target.key], w.mode, w.deadline, required)
        if why:
            return False, why, "call"

        def get(path, settings):
            if path != FILE:
                return self.healthy_run(path, settings)
            return symptoms.Run(made[settings_key(settings)][:settings["steps"]], None)
        showing = [why for s in required if (why := still_shows(self.kata, s, get, FILE))]
        if showing:
            return False, (f"the brief's run ({described(self.kata.run)}) still shows {len(showing)} of the "
                           f"{len(required)} symptoms of its brief that a healthy run does not: "
                           f"{'; '.join(showing)}"), "assertion"
        return True, "", ""

    def not_run(self, target) -> tuple | None:
        """(message, kind) when the file cannot be run: it did not import, or a function it calls hung or crashed
        the worker earlier (a hang costs one budget, not one more per run)."""
        w = target.worker
        why = None
        if target.key in w.load_errors:
            why = f"not run: the file could not be imported: {w.load_errors[target.key]}", "call"
        broken = [f"{fn} {what}" for (key, fn), what in w.broken.items() if key == target.key]
        if broken:
            why = f"not run: earlier in this run, {broken[0]}; the brief's run would call it again", "call"
        if why and self.file_thread is not None:  # runs started beside the checks are stopped, and not read
            self.cancelled.set()
            self.file_thread.join()
        return why

    def healthy_problem(self) -> tuple | None:
        """(message, kind) when a healthy run could not be made (then no verdict can be a pass), once they are."""
        self.thread.join()
        healthy = [self.healthy_run(*side) for side in self.healthy_runs()] if self.problem is None else []
        unmade = next((r.crash or "no steps" for r in healthy if r.crash or not r.history), None)
        if self.problem or unmade:
            return f"the healthy codebase's run could not be made: {self.problem or unmade}", "error"
        return None

    def run_file(self, path: Path, mode: str, deadline: float | None, required: list) -> tuple:
        """({settings key: history}, None) of the file's runs, each made in a run's sandbox; or (None, why not)."""
        made = {}
        for key, settings in self.file_runs(required).items():
            history, problem = read_run(*make_run(path, settings, mode, deadline, self.cancelled), settings)
            if problem:
                problem = problem.replace(str(path), display(path))
                return None, f"the brief's run ({described(settings)}) {problem}"
            made[key] = history
        return made, None


def still_shows(kata, symptom: dict, get, path) -> str | None:
    """What the file's run shows of the symptom, or None when it is gone. A number the symptom reads that the run
    does not log, or logs as NaN or infinity, cannot show it gone."""
    shown, seen, (a, b) = symptoms.shows(kata, symptom, None, get, path)
    if shown:
        return f"{symptoms.describe(symptom)}, {seen}"
    unread = symptom["relation"] not in ("crash", "nonfinite") and any(
        v is None or not math.isfinite(v) for v in (a, b))
    return f"{symptoms.describe(symptom)} cannot be read: {seen}" if unread else None


def make_run(path: Path, settings: dict, mode: str, deadline: float | None = None, cancelled=None) -> tuple:
    """(step events, the event that ended it) of the file at `path` trained by the runner in a run's sandbox
    (LoopRun, as `make run` makes it: its limits too, whatever the worker's), its budget RUN_CPU_S per rank; what
    it prints is not read. It may run in a thread of its own (Ctrl-C is the judge's), stopped once `cancelled`
    (a threading.Event) is set."""
    budget = RUN_CPU_S * settings["nproc"]
    run = LoopRun(path, runner_args(settings), budget=budget, sandbox=mode, run_cpu=budget, deadline=deadline,
                  cancelled=cancelled)
    steps, end = [], None
    for kind, event in run:
        if kind != "event" or event.get("event") == "config":
            continue
        if event.get("event") != "step":
            end = event
        elif len(steps) < RUN_STEPS:
            steps.append(event)
    if end is None:
        end = {"event": "gone", "message": f"the runner's process exited with status {run.returncode} before the "
                                           f"run ended"}
    if run.reached:
        end["message"] = f"{end.get('message') or ''} (its sandbox reached its cap on {' and '.join(run.reached)})"
    return steps, end


def read_run(steps: list, end: dict, settings: dict) -> tuple:
    """(history, None) from a run's step events and the event that ended it, or (None, what went wrong).
    Untrusted: checked here, number by number."""
    if not all(isinstance(s, dict) for s in steps) or not isinstance(end, dict):
        return None, "answered with malformed data"
    history = [{str(k): float(v) for k, v in s.items() if k != "event" and number(v)} for s in steps]
    event, message = str(end.get("event")), str(end.get("why") or end.get("message") or "")[:1000]
    if event == "error":
        return None, f"could not start: {message}"
    if event == "crash":
        where, code = str(end.get("where") or "")[:300], str(end.get("code") or "")[:300]
        at = f" (at {where}" + (f": `{code}`" if code else "") + ")" if where else ""
        return None, f"raised {str(end.get('type'))[:100]} at step {len(history) + 1}: {message}{at}"
    if event == "hung":
        return None, f"was stopped at step {len(history) + 1}: {message}"
    if event != "done":
        return None, f"did not finish: {message}"
    if len(history) != settings["steps"]:
        return None, f"logged {len(history)} steps, not the {settings['steps']} it was asked for"
    return history, None


def number(v) -> bool:
    """A number a step logs: an int that a float holds, or a float (a bool is no number here)."""
    return type(v) is float or type(v) is int and abs(v) < 2**63


def settings_key(settings: dict) -> str:
    """A run's settings but its length: the runs that one longer run stands for."""
    return json.dumps({**settings, "steps": 0}, sort_keys=True)


def words(settings: dict) -> list:
    """The run's GRPOConfig overrides as `make run SET=` takes them."""
    return [f"{k}={v}" for k, v in settings["set"].items()]


def runner_args(settings: dict) -> list:
    """grpo_katas.training.runner's arguments for the run, as `make run` passes them (grpo_katas.practice.jobs.run_args)."""
    return ["--steps", str(settings["steps"]), "--seed", str(settings["seed"]), "--nproc", str(settings["nproc"]),
            "--set", *words(settings)]


def described(settings: dict) -> str:
    return (f"{settings['steps']} steps, seed {settings['seed']}" + (f", {settings['nproc']} ranks"
            if settings["nproc"] > 1 else "") + "".join(f", {w}" for w in words(settings)))


def cache_folder() -> Path:
    """Where the healthy runs are kept: .cache/symptoms/, shared with the proof, or a temporary folder where the
    repository cannot be written (a grader in a read-only container)."""
    try:
        symptoms.CACHE.mkdir(parents=True, exist_ok=True)
        if os.access(symptoms.CACHE, os.W_OK):
            return symptoms.CACHE
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="grpo-healthy-runs-"))
