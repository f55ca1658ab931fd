"""The symptoms a kata's brief cites, as data, and the proof that they are its bugs' effects on any seed and CPU.

A brief reports what a run shows, never what is wrong. Every symptom it cites is a [[symptom]] in kata.toml, and
`make verify` runs the kata and its healthy codebase (the kata with its bugs fixed) with the kata's [run]
settings and asserts that each symptom shows:

    [run]                       # the run the brief describes; `make run` makes the same one
    steps = 40
    seed = 0
    nproc = 1                   # data-parallel ranks (stats of rank r are key@r)
    set = {beta = 0.5}          # GRPOConfig overrides

    [[symptom]]
    metric = "kl"               # a stat the loop logs: reward_mean, kl, loss, clip_frac, grad_norm, ...
    window = "last"             # first | last (the mean of 5 steps), max | min (over the run), or a step number
    relation = "above"          # above | below the healthy run (by factor and margin), same (within margin),
                                # differs (by more than margin), nonfinite (the metric is NaN or inf at some
                                # step), crash (the run raises)
    factor = 3.0                # above: kata > factor * healthy + margin; below: kata < healthy / factor - margin
    margin = 0.0
    against = {set = {beta = 0.0}}   # optional: compare with the kata's own run under these settings instead,
    against = {metric = "reward_mean@1"}  # or with another metric of the same run (another rank, say)
    probe = {set = {temperature = 0.7}}   # optional: both runs under these settings too, a rerun the first hint
                                # names (`SET=temperature=0.7`); the brief's run is then not where it shows
    bugs = ["kl-k1"]            # the bugs whose effect it is (a kata of one bug: that bug); with this bug
                                # fixed and the others left in, the symptom must not show
    says = "2.7431"             # optional: the kata's reading as the brief prints it, and the reading it is
    says_against = "0.4216"     # compared with: the number `make run` prints, at the metric's digits; where the
                                # kernel paths print different numbers, a bound: "about X", "under X", "over X"

    [[probe]]                   # a bug no run shows: what the first hint has the candidate look at
    bugs = ["sampling-with-grad"]
    look = "requires_grad"      # words of the first hint rung
    why = "sampling with autograd on changes no number a run logs"

A symptom is its bugs' effect, not a seed's luck: verify checks each one over several seeds on this CPU's kernel path,
of which it must hold at all but one in five (4 of 0-4): the brief's seed and three more first, and the fifth only
where one of those missed (where all four held, no fifth seed can change the verdict). Practice runs compute in
float64 (runs.lab_dtype), so torch's CPU kernel paths (ATEN_CPU_CAPABILITY=default and avx2, and avx512 where the CPU
has it) part only in bits far below the digits a run prints: the brief's run is recorded in the kata's run.txt
(record.py), and every kernel path must print that table, row for row, the healthy codebase's beside it. The numbers a
brief prints (says) are exactly what `make run` prints, at the metric's digits (curves.DIGITS), read on every kernel
path wherever they come from the recorded runs (which every path makes anyway), and on this CPU's path where they come
from a rerun under other settings (a run whose dynamics amplify a last bit into other tokens late in a run, as two
katas' bugs do, is the exception: where the paths print different numbers, the brief prints a bound that holds for
each). Every bug of a kata is reachable: a symptom of the brief's run or of a probe run shows it (healing that bug
alone makes the symptom go), or a [[probe]] names where to look in the first hint.

A kernel path is fixed when torch is imported, so each is a process of its own: the runs a check needs are
shared out over child processes (this module, --compute) under each path, and kept in .cache/symptoms/
(git-ignored), one file per run, keyed by the loop file's bytes, the code a run depends on (lab/, runs.py,
loader.py), its settings and seed but its length, the kernel path and torch's version: a run's first steps do not
depend on how many follow, so each is made once, as long as the longest window that reads it, and a second verify
re-runs only what changed.

    python -m grpo_katas.catalogue.symptoms 3 17                       # each window of each metric, kata against healthy
    python -m grpo_katas.catalogue.symptoms --seeds 0 1 2 3 4 3        # kata 3's symptoms and windows at each seed
    python -m grpo_katas.catalogue.symptoms --check --seeds 0 1 2 3 4 --kernels default avx2   # the proof CI's verify runs
"""
import argparse
import functools
import hashlib
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch

from grpo_katas import ROOT, run_counted
from grpo_katas.catalogue import record
from grpo_katas.catalogue.katas import CODEBASES, codebase_source, find_kata, load_bugs, load_katas, plant
from grpo_katas.training.curves import cell, digits
from grpo_katas.training.runs import RunConfig, drive, drive_ranks


METRICS = ["reward_mean", "reward_max", "kl", "loss", "clip_frac", "grad_norm", "adv_std", "completion_len",
           "ratio_dev"]
WINDOW = 5
ABOUT = 0.15  # "about X" in a brief: within 15% of X
CACHE = ROOT / ".cache" / "symptoms"
DEPENDS = [ROOT / "lab", ROOT / "grpo_katas" / "training" / "runs.py", ROOT / "grpo_katas" / "training" / "loader.py"]  # what a run imports


def needed(seeds: int) -> int:
    """Of n seeds, how many a symptom must hold at: all but one in five (4 of 5, 8 of 10, 3 of 3, 1 of 1)."""
    return seeds - seeds // 5


# --- runs -----------------------------------------------------------------------------------------------

class Run:
    """One run's history, or the crash that ended it; `steps`, the steps it was asked for (its history's length
    unless it crashed)."""

    def __init__(self, history: list, crash: str | None, steps: int | None = None):
        self.history, self.crash = history, crash
        self.steps = len(history) if steps is None else steps

    @property
    def made(self) -> dict:
        return {"history": self.history, "crash": self.crash, "steps": self.steps}

    def window(self, metric: str, window) -> float | None:
        values = [h.get(metric) for h in self.history]
        values = [float(v) for v in values if isinstance(v, (int, float))]
        if not values:
            return None
        if isinstance(window, int):
            return values[window - 1] if window <= len(values) else None
        if window == "first":
            return sum(values[:WINDOW]) / len(values[:WINDOW])
        if window == "last":
            return sum(values[-WINDOW:]) / len(values[-WINDOW:])
        return {"max": max, "min": min}[window](values)

    def nonfinite(self, metric: str) -> bool:
        return any(isinstance(h.get(metric), float) and not math.isfinite(h[metric]) for h in self.history)


def kernel() -> str:
    """This process's CPU kernel path: default, avx2, avx512 (zvector, sve256, ... elsewhere)."""
    return torch.backends.cpu.get_cpu_capability().lower()


def supported(name: str) -> bool:
    """Can this CPU run torch's kernels of that path? (ATEN_CPU_CAPABILITY=avx512 is obeyed without asking the CPU,
    which then meets instructions it does not have.)"""
    probe = {"avx2": "_is_avx2_supported", "avx512": "_is_avx512_supported"}.get(name)
    if name == "default" or name == kernel():
        return True
    return bool(getattr(torch.cpu, probe)()) if probe and hasattr(torch.cpu, probe) else False


@functools.cache
def depends_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(f for d in DEPENDS for f in ([d] if d.is_file() else d.rglob("*.py"))):
        h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@functools.cache
def cpu() -> str:
    """The CPU model: the BLAS torch calls picks its own code path by CPU, whatever the kernel path says."""
    try:
        names = re.findall(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        names = []
    return (names[0] if names else platform.processor()) + " " + platform.machine()


def run_key(path, settings: dict, kernel_name: str) -> str:
    """What makes a run what it is: the code run, the code it depends on, its settings (seed included) but its
    length, the kernel path, the CPU and torch's version. A run's first steps do not depend on how many follow, so
    runs that differ only in length are one run, kept at the longest length asked for (Store)."""
    what = {"loop": hashlib.sha256(Path(path).read_bytes()).hexdigest(), "depends": depends_digest(),
            "settings": {**settings, "steps": None}, "kernel": kernel_name, "cpu": cpu(), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def serves(entry: dict, steps: int) -> bool:
    """Does a made run (its `steps` asked for, its history, its crash) answer for a run of `steps` steps? A longer one
    does, and so does one that crashed: a longer run would have crashed at the same step."""
    return entry.get("crash") is not None or entry.get("steps", len(entry.get("history", []))) >= steps


def prefix(run: "Run", steps: int) -> "Run":
    """A run's first `steps` steps: the run of that length (it raised only if it raised within them)."""
    if len(run.history) >= steps:
        return Run(run.history[:steps], None)
    return run


_runs = {}


def run_loop(path, settings: dict) -> Run:
    """The loop at `path` under a kata's [run] settings, run in this process once (trusted files only: katas,
    codebases). A file rewritten in place is a new run: the key is its bytes."""
    key = run_key(path, settings, kernel())
    if key not in _runs or not serves(_runs[key].made, settings["steps"]):
        run = fresh_run(path, settings)
        _runs[key] = Run(run.history, run.crash, settings["steps"])
    return prefix(_runs[key], settings["steps"])


def fresh_run(path, settings: dict) -> Run:
    from grpo_katas.training.loader import load_target
    run = RunConfig(steps=settings["steps"], seed=settings["seed"], nproc=settings["nproc"], device="cpu",
                    grpo=dict(settings["set"]))
    history, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # as make run: float sums, and so the whole run, differ with the thread count
    try:
        if run.nproc > 1:
            drive_ranks(path, run, history.append)
        else:
            drive(load_target(path), run, history.append)
        return Run(history, None)
    except Exception as exc:  # a kata's crash is a symptom like any other; the steps before it still count
        return Run(history, f"{type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        torch.set_num_threads(threads)


class Changed(RuntimeError):
    """A file whose runs were being made changed on disk while they were made (a kata rebuilt mid-proof)."""


class Store:
    """Runs by (path, settings) under one kernel path each, kept one file a run in `folder` (.cache/symptoms/):
    read from there unless `fresh`, else made by child processes under that path, which write them there as they
    finish (an interrupted check keeps what it made). Runs that differ only in length are made once, at the longest
    length asked for, and each is read as its first steps."""

    def __init__(self, folder: Path = CACHE, fresh: bool = False, made=None):
        self.folder, self.fresh, self.runs, self.skipped = Path(folder), fresh, {}, {}
        self.made = made or (lambda runs, steps, cpu: None)  # hears of each child's runs: how many, steps, CPU-s
        self.planned = {}  # (path, settings, kernel name) -> the key its bytes had when fetch was asked for it

    def get(self, path, settings: dict, kernel_name: str) -> Run:
        key = run_key(path, settings, kernel_name)
        if key not in self.runs and self.planned.get(self.spec(path, settings, kernel_name), key) != key:
            raise Changed(f"{os.path.relpath(path, ROOT)} changed while its runs were made: run this again once "
                          f"nothing is rebuilding it")
        return prefix(self.runs[key], settings["steps"])

    @staticmethod
    def spec(path, settings: dict, kernel_name: str) -> tuple:
        return str(path), json.dumps(settings, sort_keys=True), kernel_name

    def fetch(self, wanted: dict, processes: int) -> None:
        """wanted: kernel name -> [(path, settings)]. Makes every run not yet at hand, each at the longest length
        asked for, the longest first, in up to `processes` children at a time; a kernel path the CPU lacks is
        recorded in `skipped`, not run."""
        todo, longest = {}, {}
        for name, specs in wanted.items():
            if not supported(name):
                self.skipped[name] = f"this CPU has no {name} kernels"
                continue
            for path, settings in specs:
                key = run_key(path, settings, name)
                self.planned[self.spec(path, settings, name)] = key
                if key not in longest or longest[key][2]["steps"] < settings["steps"]:
                    longest[key] = (name, str(path), settings)
        for key, (name, path, settings) in longest.items():
            if key in self.runs and serves(self.runs[key].made, settings["steps"]):
                continue
            if not self.fresh and self.load(key, settings["steps"]):
                continue
            todo[key] = (name, path, settings)
            (self.folder / f"{key}.json").unlink(missing_ok=True)  # fresh, or too short: never read back the old one
        cost = lambda key: todo[key][2]["steps"] * todo[key][2]["nproc"]  # noqa: E731
        chunks = []
        for name in sorted({t[0] for t in todo.values()}):
            mine = sorted((k for k, t in todo.items() if t[0] == name), key=cost, reverse=True)
            bins = [[] for _ in range(max(1, min(processes, len(mine))))]
            for key in mine:  # the longest first, each to the lightest bin
                min(bins, key=lambda b: sum(map(cost, b))).append(key)
            chunks += [(name, b) for b in bins]
        with ThreadPoolExecutor(max(1, processes)) as pool:
            for name, chunk, why in pool.map(lambda c: (*c, self.compute(*c, todo)), chunks):
                if why:
                    self.skipped[name] = why
                    continue
                for key in chunk:
                    if not self.load(key, todo[key][2]["steps"]):  # the child died before making it: say so where
                        self.runs[key] = Run([], f"the run could not be made under the {name} kernels")  # it is used

    def load(self, key: str, steps: int) -> bool:
        """Read the run kept under `key` if it is long enough for `steps` steps."""
        try:
            d = json.loads((self.folder / f"{key}.json").read_text())
            if not serves(d, steps):
                return False
            self.runs[key] = Run(d["history"], d["crash"], d.get("steps", len(d["history"])))
            return True
        except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: make it (again)
            return False

    def compute(self, kernel_name: str, chunk: list, todo: dict) -> str | None:
        """Make the chunk's runs in a child process under the kernel path; None, or why that path was skipped."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            spec, out = Path(tmp) / "spec.json", Path(tmp) / "kernel"
            spec.write_text(json.dumps([[key, *todo[key][1:]] for key in chunk]))
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                   "ATEN_CPU_CAPABILITY": kernel_name}
            _, cpu = run_counted([sys.executable, "-m", "grpo_katas.catalogue.symptoms", "--compute", str(spec),
                                  str(self.folder), str(out), "--kernel", kernel_name] + ["--fresh"] * self.fresh,
                                 cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.made(len(chunk), sum(todo[k][2]["steps"] * todo[k][2]["nproc"] for k in chunk), cpu)
            chosen = out.read_text() if out.exists() else kernel_name
        return None if chosen == kernel_name else f"this CPU has no {kernel_name} kernels (torch chose {chosen})"


def cpu_seconds() -> float:
    """CPU time of this process and of the rank processes it has waited for."""
    own, ranks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ranks.ru_utime + ranks.ru_stime


def made_meanwhile(file: Path, steps: int) -> bool:
    try:
        return serves(json.loads(file.read_text()), steps)
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def compute_main(spec: str, folder: str, out: str, kernel_name: str, fresh: bool = False) -> int:
    """The child: under this process's kernel path, make each (key, path, settings) of the spec and write it to
    folder/key.json as soon as it is made; `out` gets the kernel path torch chose."""
    Path(out).write_text(kernel())
    if kernel() != kernel_name:
        return 0
    for key, path, settings in json.loads(Path(spec).read_text()):
        if not fresh and made_meanwhile(Path(folder) / f"{key}.json", settings["steps"]):
            continue  # by another check sharing the folder
        start = cpu_seconds()
        run = fresh_run(path, settings)
        if run_key(path, settings, kernel_name) != key:
            continue  # the file changed under the run: its history is not the keyed bytes', and the parent says so
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            json.dump({"loop": path, "settings": settings, "kernel": kernel_name, "steps": settings["steps"],
                       "history": run.history, "crash": run.crash, "cpu_seconds": round(cpu_seconds() - start, 2)}, f)
        os.replace(f.name, Path(folder) / f"{key}.json")
    return 0


# --- what a symptom compares ----------------------------------------------------------------------------

def settings_of(kata, symptom: dict, seed: int | None) -> dict:
    """The kata's [run] at `seed` (None: the brief's), under the symptom's probe settings if it has any."""
    run = kata.run if seed is None else {**kata.run, "seed": seed}
    probe = symptom.get("probe", {})
    return {**run, "steps": probe.get("steps", run["steps"]), "set": {**run["set"], **probe.get("set", {})}}


def sides(kata, symptom: dict, seed: int | None, loop=None) -> tuple:
    """((path, settings) of the kata's run, (path, settings) of the run it is compared with, or None): the kata (or
    `loop`, the kata healed of one bug) and, unless the symptom compares it with itself, its healthy codebase. Each
    runs only as many steps as the symptom's window reads (a run's first steps do not depend on how many follow):
    the first 5 steps, or up to a step number; a crash or a non-finite number, and the last, largest or smallest
    window, read the whole run."""
    mine = settings_of(kata, symptom, seed)
    window = symptom.get("window", "last")
    if symptom["relation"] not in ("crash", "nonfinite"):
        mine = {**mine, "steps": min(mine["steps"], window if isinstance(window, int) else
                                     WINDOW if window == "first" else mine["steps"])}
    loop = loop or kata.loop
    if symptom["relation"] in ("crash", "nonfinite"):
        return (loop, mine), None
    if "against" in symptom:  # the kata itself: under other settings, or the same run's other metric
        if "set" not in symptom["against"]:
            return (loop, mine), (loop, mine)
        return (loop, mine), (loop, {**mine, "set": {**mine["set"], **symptom["against"]["set"]}})
    return (loop, mine), (CODEBASES[kata.codebase].path, mine)


def recorded(kata, symptom: dict) -> bool:
    """Are the runs a symptom reads at the brief's seed the brief's own runs, which its record holds (no rerun under
    other settings)? Such a symptom is read under every kernel path at no cost: the record's runs are made there."""
    brief = {run_key(path, settings, "") for path, settings in record.runs_of(kata).values()}
    return all(run_key(path, settings, "") in brief for path, settings in filter(None, sides(kata, symptom, None)))


def shows(kata, symptom: dict, seed: int | None = None, get=None, loop=None) -> tuple:
    """(does the symptom show, what was measured, (kata's value, compared value)) at `seed` (None: the brief's),
    with runs from get(path, settings) (default: run here), for the kata's loop or another (the kata healed of
    one bug)."""
    get = get or run_loop
    (path, settings), other_side = sides(kata, symptom, seed, loop)
    mine = get(path, settings)
    relation, metric, window = symptom["relation"], symptom.get("metric", ""), symptom.get("window", "last")
    if relation == "crash":
        return mine.crash is not None and symptom.get("match", "") in mine.crash, f"crash: {mine.crash}", (None, None)
    if relation == "nonfinite":
        bad = mine.nonfinite(metric)
        return bad or mine.crash is not None, f"{metric} not finite: {bad}", (None, None)
    other = get(*other_side)
    a, b = mine.window(metric, window), other.window(symptom.get("against", {}).get("metric", metric), window)
    seen = f"{metric} ({window}) {fmt(a)} against {fmt(b)}" + (f"; the kata crashed: {mine.crash}" if mine.crash
                                                                 else "")
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return False, seen, (a, b)
    factor, margin = float(symptom.get("factor", 1.0)), float(symptom.get("margin", 0.0))
    ok = {"above": lambda: a > factor * b + margin, "below": lambda: a < b / factor - margin,
          "same": lambda: abs(a - b) <= margin, "differs": lambda: abs(a - b) > margin}[relation]()
    return ok, seen, (a, b)


def fmt(v) -> str:
    return "none" if v is None else f"{v:.4g}"


def describe(symptom: dict) -> str:
    return f"{symptom.get('relation')} {symptom.get('metric', '')}".strip()


# --- the numbers a brief prints ---------------------------------------------------------------------------

def quote(value: float | None, metric: str) -> str:
    """A reading as `make run` prints it: at the metric's digits (curves.DIGITS; its curve's first and last 5-step
    means and the table's rows print the same), "none" where the run has no value."""
    return "none" if value is None else cell(value, digits(metric))


def quotes(symptom: dict) -> list:
    """(the brief's text, the metric it reads) of each number a symptom says: the kata's reading (says) and the
    reading it is compared with (says_against, of the against metric where the symptom names one)."""
    metric = symptom.get("metric", "")
    other = symptom.get("against", {}).get("metric", metric)
    return [(text, m) for text, m in ((symptom.get("says"), metric), (symptom.get("says_against"), other))
            if text is not None]


BOUND = re.compile(r"(about|under|over) (-?\d+(?:\.\d+)?)")


def reads(text: str, value: float | None) -> bool:
    """Does a bound a brief prints hold for `value`: "about X" (within 15%), "under X", "over X"?"""
    m = BOUND.fullmatch(text.strip())
    if m is None or value is None or not math.isfinite(value):
        return False
    how, number = m.group(1), float(m.group(2))
    return {"about": abs(value - number) <= ABOUT * abs(number), "under": value < number,
            "over": value > number}[how]


def says_problems(symptom: dict, read: dict) -> list:
    """What is wrong with the numbers a symptom says, given its readings at the brief's seed under each kernel path
    (read: path -> (kata's value, compared value)). Where every path prints the same number the brief prints it,
    exactly; where the paths print different numbers (a run whose dynamics amplify a last bit), the brief prints a
    bound that holds for each of them: about X (within 15%), under X, over X."""
    out = []
    sides = (0, 1) if symptom.get("says") is not None else (1,)
    for (text, metric), side in zip(quotes(symptom), sides):
        values = {path: pair[side] for path, pair in read.items()}
        shown = {path: quote(v, metric) for path, v in values.items()}
        printed = ", ".join(f"{v} under {path}" for path, v in shown.items())
        if len(set(shown.values())) <= 1:
            if shown and text != next(iter(shown.values())):
                out.append(f"the brief says {text!r}, the run prints {printed}")
        elif not all(reads(text, v) for v in values.values()):
            out.append(f"the brief says {text!r}, and the kernel paths print different numbers ({printed}): it must "
                       f"be a bound that holds for each, such as {suggest(list(values.values()), metric)!r}")
    return out


def suggest(values: list, metric: str, bound: str = "over") -> str:
    """What a brief can print for a reading whose value under each kernel path is in `values`: the number as the
    run prints it where every path prints the same; else "about X" where that holds for each, else a bound."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    shown = sorted({quote(v, metric) for v in values})
    if len(shown) <= 1:
        return shown[0] if shown else "none"
    lo, hi = min(values), max(values)
    mid = quote((lo + hi) / 2, metric)
    if all(reads(f"about {mid}", v) for v in values):
        return f"about {mid}"
    return f"over {quote(lo * 0.9 if lo > 0 else lo * 1.1, metric)}" if bound == "over" else \
        f"under {quote(hi * 1.1 if hi > 0 else hi * 0.9, metric)}"


# --- the proof ----------------------------------------------------------------------------------------------

def healed_loop(kata, bug: str, bugs: dict, folder: Path) -> Path:
    """The kata with one bug fixed and the others left in, written to `folder` (named by its content)."""
    text = plant(codebase_source(kata.codebase), [bugs[b] for b in kata.bugs if b != bug], kata.codebase)
    path = folder / "loops" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def attributed(kata, symptom: dict) -> list:
    """The bugs a symptom shows: those it names, or the one bug of a one-bug kata."""
    return list(symptom.get("bugs", kata.bugs if len(kata.bugs) == 1 else ()))


def coverage_problems(kata, bugs: dict) -> list:
    """Every bug is shown by a symptom or named by a [[probe]] whose words are in the first hint, and the
    settings of every rerun a symptom compares with (against, probe) are named by the brief or the first hint."""
    out, hint = [], kata.hints[0] if kata.hints else ""
    named = hint + "\n" + (kata.brief if (kata.path / "BRIEF.md").exists() else "")
    shown = {b for s in kata.symptoms for b in attributed(kata, s)}
    for p in load_probes(kata):
        if not p.get("look") or p["look"] not in hint or not p.get("why"):
            out.append(f"{kata.name}: a [[probe]] for {', '.join(p.get('bugs', []))} needs a why and a look that "
                       f"the first hint contains")
        shown |= set(p.get("bugs", []))
    for b in kata.bugs:
        if b not in shown:
            out.append(f"{kata.name}: no symptom shows {b} and no probe of the first hint names where to see it")
    for s in kata.symptoms:
        for b in attributed(kata, s):
            if b not in kata.bugs:
                out.append(f"{kata.name}: a symptom names {b}, which is not one of its bugs")
        rerun = {**s.get("against", {}).get("set", {}), **s.get("probe", {}).get("set", {})}
        for key, value in rerun.items():
            if not any(same_value(v, value) for v in re.findall(rf"\b{key}\s*=\s*([\w.+-]+)", named)):
                out.append(f"{kata.name}: symptom {describe(s)} is seen on a rerun with {key}={value}, which neither "
                           f"the brief nor the first hint names")
    return out


def same_value(text: str, value) -> bool:
    try:
        return float(text) == float(value)
    except (TypeError, ValueError):
        return text == str(value)


def load_probes(kata) -> list:
    import tomllib
    meta = kata.path / "kata.toml"
    return tomllib.loads(meta.read_text()).get("probe", []) if meta.exists() else []


def first_seeds(kata, seeds) -> list:
    """The seeds a symptom is swept over first: the brief's, then the others in order, as many as it must hold at
    (4 of 5). Where it holds at every one of them the others cannot change its verdict, so they wait on a miss."""
    order = sorted(seeds, key=lambda seed: seed not in (None, kata.run["seed"]))
    return order[:needed(len(order))]


class Healed(NamedTuple):
    bug: str      # the bug healed
    loop: Path    # the kata with that bug fixed and the others left in


class Reading(NamedTuple):
    """One reading of a symptom the proof makes: at a seed on this CPU's kernel path ("seed"), at the brief's seed
    on another path ("kernel"), or at the brief's seed with one of its bugs healed ("healed")."""
    how: str
    kata: object
    symptom: int              # its index in kata.symptoms
    seed: int | None          # None: the brief's
    kernel: str
    healed: Healed | None = None

    def shows(self, store: "Store") -> tuple:
        """shows(...) for this reading, with the runs `store` holds."""
        return shows(self.kata, self.kata.symptoms[self.symptom], self.seed,
                     lambda path, settings: store.get(path, settings, self.kernel),
                     self.healed.loop if self.healed else None)


def plan(katas, seeds, kernels, native: str, folder: Path, healing: bool = True, sweep=None) -> tuple:
    """(wanted runs per kernel path, the readings to make): the brief's run and its healthy run (the record's) on
    every kernel path named; each symptom at every seed on this process's path (or at sweep(kata, i)'s); at the
    brief's seed on every other path where the symptom reads the record's runs; and, with `healing`, at the brief's
    seed with each bug it names healed."""
    bugs = load_bugs()
    sweep = sweep or (lambda kata, i: seeds)
    wanted, readings = {}, []
    for k in katas:
        for name in dict.fromkeys([native, *kernels]):  # the brief's run as its record holds it, on each path
            wanted.setdefault(name, []).extend(record.runs_of(k).values())
        swept = None in seeds or k.run["seed"] in seeds
        for i, s in enumerate(k.symptoms):
            readings += [Reading("seed", k, i, seed, native) for seed in sweep(k, i)]
            readings += [Reading("kernel", k, i, None, name) for name in dict.fromkeys(kernels)
                         if (name == native and not swept) or (name != native and recorded(k, s))]
            if len(k.bugs) > 1 and healing:
                readings += [Reading("healed", k, i, None, native, Healed(b, healed_loop(k, b, bugs, folder)))
                             for b in attributed(k, s) if b in k.bugs]
    return runs_read(readings, wanted), readings


def runs_read(readings, wanted: dict | None = None) -> dict:
    """`wanted` (kernel path -> [(path, settings)]) with the runs each reading reads added: both sides of it."""
    wanted = {} if wanted is None else wanted
    for r in readings:
        mine, other = sides(r.kata, r.kata.symptoms[r.symptom], r.seed, r.healed.loop if r.healed else None)
        wanted.setdefault(r.kernel, []).extend([mine] + ([other] if other else []))
    return wanted


def rest_of_sweep(seeds, readings, store) -> list:
    """The readings of the seeds not yet swept, for each symptom that held at fewer of those that were than it must
    hold at of them all."""
    swept, held = {}, {}
    for r in readings:
        if r.how == "seed":
            key = id(r.kata), r.symptom
            swept.setdefault(key, []).append(r)
            held[key] = held.get(key, 0) + r.shows(store)[0]
    return [r._replace(seed=seed) for key, done in swept.items() if held[key] < needed(len(seeds))
            for r in done[:1] for seed in seeds if seed not in {d.seed for d in done}]


def check(katas, processes: int = 1, seeds=None, kernels=None, fresh: bool = False, folder: Path = CACHE,
          healing: bool | None = None, log=lambda line: None, made=None) -> list:
    """The problems with the katas' symptoms: each must show at the brief's seed on this kernel path, and at
    needed(len(seeds)) of `seeds` (None: the brief's seed only); the table of the brief's run must be its record's
    (record.py) on this path and on each of `kernels`, and so must the numbers the brief prints, read on each path
    where the symptom reads the record's runs (elsewhere on this path: a rerun under other settings, whose table no
    record holds); every bug must be shown by a symptom or named by a probe; and, with `healing` (default: when
    seeds are given, the full proof), a symptom must go away with a bug it names healed. made(runs, steps,
    CPU-seconds) hears of the runs made for it, as each child process ends."""
    native = kernel()
    healing = seeds is not None if healing is None else healing
    seeds = list(seeds) if seeds else [None]
    kernels = list(dict.fromkeys(kernels or [native]))
    store = Store(folder, fresh, made)
    wanted, readings = plan(katas, seeds, kernels, native, Path(folder), healing,
                            lambda k, i: first_seeds(k, seeds))
    store.fetch(wanted, processes)
    more = rest_of_sweep(seeds, readings, store)
    store.fetch(runs_read(more), processes)
    readings += more
    for name, why in store.skipped.items():
        log(f"symptoms: the {name} kernel path is skipped: {why}")
    out = problems(katas, readings, store, seeds)
    for k in katas:  # the brief's run prints its recorded table on every path
        for name in dict.fromkeys([native, *kernels]):
            if name not in store.skipped:
                out += record.differences(k, record.tables_of(k, store, name), f"the {name} kernel path")
    return out


def problems(katas, readings, store, seeds) -> list:
    """What the readings say is wrong with each kata's symptoms (see check)."""
    bugs = load_bugs()
    out = []
    for k in katas:
        if not k.symptoms:
            out.append(f"{k.name}: its brief cites no symptom recorded in kata.toml")
        out += coverage_problems(k, bugs)
        for i, s in enumerate(k.symptoms):
            name = f"{k.name}: symptom {i + 1} ({describe(s)})"
            swept, read = {}, {}  # read: kernel path -> (kata's value, compared value) at the brief's seed
            for r in readings:
                if r.kata is not k or r.symptom != i or r.kernel in store.skipped:
                    continue
                ok, seen, (a, b) = r.shows(store)
                if r.how == "seed":
                    swept[k.run["seed"] if r.seed is None else r.seed] = (ok, seen)
                if r.how in ("seed", "kernel") and r.seed in (None, k.run["seed"]):
                    if not ok:
                        out.append(f"{name} does not show at the brief's seed {k.run['seed']} under the {r.kernel} "
                                   f"kernels: {seen}")
                    read[r.kernel] = (a, b)
                if r.how == "healed" and ok:
                    out.append(f"{name} still shows with {r.healed.bug} fixed (the other bugs left in), so it is "
                               f"not that bug's effect: {seen}")
            out += [f"{name}: {p}" for p in says_problems(s, read)]
            if len(seeds) > 1:  # swept at every seed, or at as many as it must hold at, where it held at each
                held = [sd for sd, (ok, _) in swept.items() if ok]
                if len(held) < needed(len(seeds)):
                    misses = "; ".join(f"seed {sd}: {seen}" for sd, (ok, seen) in swept.items() if not ok)
                    out.append(f"{name} holds at {len(held)} of {len(swept)} seeds, fewer than "
                               f"{needed(len(seeds))}: {misses}")
    return out


# --- the author's table ---------------------------------------------------------------------------------

def report(kata, seeds, store: Store, kernels=()) -> str:
    """Each symptom's verdict at each seed (and at the brief's seed on each other kernel path), then every
    metric's windows, kata / healthy, per seed: what a brief can cite, and how much of it is the seed's luck."""
    native = kernel()
    get = lambda name: lambda p, st: store.get(p, st, name)  # noqa: E731
    lines = [f"kata {kata.number} ({kata.codebase}, {kata.bugs}, {kata.run}), kernels {native}"]
    for i, s in enumerate(kata.symptoms):
        cells = [(f"seed {sd}", *shows(kata, s, sd, get(native))) for sd in seeds]
        at_brief = [c[3] for c, sd in zip(cells, seeds) if sd == kata.run["seed"]]
        cells += [(f"{name} seed {kata.run['seed']}", *shows(kata, s, None, get(name)))
                  for name in kernels if name != native and name not in store.skipped]
        at_brief += [c[3] for c in cells[len(seeds):]]
        held = sum(ok for _, ok, _, _ in cells[:len(seeds)])
        spec = {k: v for k, v in s.items() if k not in ("metric", "relation")}
        other = s.get("against", {}).get("metric", s.get("metric", ""))
        bound = "under" if s["relation"] == "below" else "over"
        says = f"; can say {suggest([a for a, _ in at_brief], s.get('metric', ''), bound)!r} against " \
               f"{suggest([b for _, b in at_brief], other, 'over' if bound == 'under' else 'under')!r}" \
            if at_brief and s["relation"] not in ("crash", "nonfinite") else ""
        lines.append(f"  symptom {i + 1} {describe(s)} {spec}: holds at {held}/{len(seeds)}{says}")
        lines += [f"      {where:18s} {'ok' if ok else 'NO'}  {seen}" for where, ok, seen, _ in cells]
    lines.append(f"  {'metric':16s} {'window':6s} " + " ".join(f"{'seed ' + str(sd):>17s}" for sd in seeds))
    for m in METRICS:
        for w in ("first", "last", "max", "min"):
            cells = []
            for sd in seeds:
                run = {**kata.run, "seed": sd}
                mine, healthy = store.get(kata.loop, run, native), store.get(CODEBASES[kata.codebase].path, run, native)
                cells.append(f"{fmt(mine.window(m, w)):>8s}/{fmt(healthy.window(m, w)):<8s}")
            if any("none/none" not in c for c in cells):
                lines.append(f"  {m:16s} {w:6s} " + " ".join(f"{c:>17s}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("katas", nargs="*", help="kata numbers (default: all)")
    p.add_argument("--check", action="store_true", help="check the recorded symptoms instead of reporting them")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="seeds to run at (default: each kata's own); of 5 seeds a symptom must hold at 4")
    p.add_argument("--kernels", nargs="+", default=None,
                   help="CPU kernel paths to check the brief's seed under, each in processes of its own: default, "
                        "avx2, avx512 (one the CPU lacks is skipped with a note); default: this process's")
    p.add_argument("--processes", type=int, default=max(1, min(os.cpu_count() or 1, 4)),
                   help="runs made in parallel (default: one per core, at most 4)")
    p.add_argument("--fresh", action="store_true", help="make every run again instead of reading .cache/symptoms/")
    p.add_argument("--compute", nargs=3, metavar=("SPEC", "FOLDER", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--kernel", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.compute:
        return compute_main(*a.compute, a.kernel, a.fresh)
    if a.seeds and not a.katas and not a.check:
        p.error("name the katas first (python -m grpo_katas.catalogue.symptoms 17 --seeds 0 1 2 3 4) or after -- "
                "(--seeds 0 1 2 3 4 -- 17): --seeds takes every number after it")
    try:
        return answer(a)
    except Changed as exc:
        print(f"symptoms: {exc}", file=sys.stderr)
        return 2


def answer(a) -> int:
    katas = [find_kata(n) for n in a.katas] if a.katas else load_katas()
    if a.check:
        found = check(katas, a.processes, a.seeds, a.kernels, a.fresh, log=print)
        for msg in found:
            print(msg)
        print(f"{len(katas)} katas' symptoms checked: {len(found)} problem(s)")
        return 1 if found else 0
    seeds = a.seeds or [None]
    native, store = kernel(), Store(CACHE, a.fresh)
    wanted = {}
    for k in katas:
        for sd in seeds:
            run = {**k.run, "seed": k.run["seed"] if sd is None else sd}
            wanted.setdefault(native, []).extend([(k.loop, run), (CODEBASES[k.codebase].path, run)])
            for s in k.symptoms:
                mine, other = sides(k, s, sd)
                wanted[native] += [mine] + ([other] if other else [])
        for name in a.kernels or []:
            for s in k.symptoms:
                mine, other = sides(k, s, None)
                wanted.setdefault(name, []).extend([mine] + ([other] if other else []))
    store.fetch(wanted, a.processes)
    for k in katas:
        print(report(k, [k.run["seed"] if sd is None else sd for sd in seeds], store, a.kernels or ()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
