"""The symptoms a kata's brief cites, as data, and the proof that a run shows them.

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
                                # nonfinite (the metric is NaN or inf at some step), crash (the run raises)
    factor = 3.0                # above: kata > factor * healthy + margin; below: kata < healthy / factor - margin
    margin = 0.0
    against = {set = {beta = 0.0}}   # optional: compare with the kata's own run under these settings instead,
    against = {metric = "reward_mean@1"}  # or with another metric of the same run (another rank, say)

    python -m grpo_katas.symptoms 3 17        # each window of each metric, the kata's and the healthy run's
    python -m grpo_katas.symptoms --check --json out.json 3 17    # what verify runs
"""
import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import torch

from grpo_katas.catalogue import CODEBASES, find_kata, load_katas
from grpo_katas.runs import RunConfig, drive, drive_ranks

METRICS = ["reward_mean", "reward_max", "kl", "loss", "clip_frac", "grad_norm", "adv_std", "completion_len",
           "ratio_dev"]
WINDOW = 5


class Run:
    """One run's history, or the crash that ended it."""

    def __init__(self, history: list, crash: str | None):
        self.history, self.crash = history, crash

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


_runs = {}


def run_loop(path, settings: dict) -> Run:
    """The loop at `path` under a kata's [run] settings, in this process (trusted files only: katas, codebases)."""
    key = (hashlib.sha256(Path(path).read_bytes()).hexdigest(), json.dumps(settings, sort_keys=True))  # the code run
    if key not in _runs:
        from grpo_katas.loader import load_target
        run = RunConfig(steps=settings["steps"], seed=settings["seed"], nproc=settings["nproc"], device="cpu",
                        grpo=dict(settings["set"]))
        history, threads = [], torch.get_num_threads()
        torch.set_num_threads(1)  # as make run: float sums, and so the whole run, differ with the thread count
        try:
            if run.nproc > 1:
                drive_ranks(path, run, history.append)
            else:
                drive(load_target(path), run, history.append)
            _runs[key] = Run(history, None)
        except Exception as exc:  # a kata's crash is a symptom like any other; the steps before it still count
            _runs[key] = Run(history, f"{type(exc).__name__}: {exc}".splitlines()[0])
        finally:
            torch.set_num_threads(threads)
    return _runs[key]


def against(kata, symptom: dict) -> tuple:
    """(path, settings) of the run a symptom compares with: the healthy codebase, or the kata itself elsewhere."""
    if "against" in symptom:  # the kata itself: under other settings, or the same run's other metric
        return kata.loop, {**kata.run, "set": {**kata.run["set"], **symptom["against"].get("set", {})}}
    return CODEBASES[kata.codebase].path, kata.run


def shows(kata, symptom: dict) -> tuple:
    """(does the symptom show, what was measured): the kata's run against the run it is compared with."""
    mine = run_loop(kata.loop, kata.run)
    relation, metric, window = symptom["relation"], symptom.get("metric", ""), symptom.get("window", "last")
    if relation == "crash":
        return mine.crash is not None and symptom.get("match", "") in mine.crash, f"crash: {mine.crash}"
    if relation == "nonfinite":
        return mine.nonfinite(metric) or mine.crash is not None, f"{metric} not finite: {mine.nonfinite(metric)}"
    other = run_loop(*against(kata, symptom))
    a, b = mine.window(metric, window), other.window(symptom.get("against", {}).get("metric", metric), window)
    seen = f"{metric} ({window}) {fmt(a)} against {fmt(b)}" + (f"; the kata crashed: {mine.crash}" if mine.crash
                                                                 else "")
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return False, seen
    factor, margin = float(symptom.get("factor", 1.0)), float(symptom.get("margin", 0.0))
    ok = {"above": lambda: a > factor * b + margin, "below": lambda: a < b / factor - margin,
          "same": lambda: abs(a - b) <= margin}[relation]()
    return ok, seen


def fmt(v) -> str:
    return "none" if v is None else f"{v:.4g}"


def problems(kata) -> list:
    out = []
    if not kata.symptoms:
        out.append(f"{kata.name}: its brief cites no symptom recorded in kata.toml")
    for i, symptom in enumerate(kata.symptoms):
        ok, seen = shows(kata, symptom)
        if not ok:
            out.append(f"{kata.name}: symptom {i + 1} ({symptom.get('relation')} {symptom.get('metric', '')}) does "
                       f"not show: {seen}")
    return out


def report(kata) -> str:
    """Every metric's windows for the kata's run and its healthy run: what a brief can cite."""
    mine, healthy = run_loop(kata.loop, kata.run), run_loop(CODEBASES[kata.codebase].path, kata.run)
    lines = [f"kata {kata.number} ({kata.codebase}, {kata.run})" + (f": crashed: {mine.crash}" if mine.crash else "")]
    keys = [m for m in METRICS if mine.window(m, "last") is not None or healthy.window(m, "last") is not None]
    keys += sorted({k for h in mine.history for k in h if "@" in k})
    for m in keys:
        cells = [f"{w}: {fmt(mine.window(m, w))} vs {fmt(healthy.window(m, w))}" for w in ("first", "last", "max")]
        lines.append(f"  {m:16s} " + " | ".join(cells) + ("  (not finite)" if mine.nonfinite(m) else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("katas", nargs="*", help="kata numbers (default: all)")
    p.add_argument("--check", action="store_true", help="check the recorded symptoms instead of reporting")
    p.add_argument("--json", default=None, help="with --check: write the problems to this file as JSON")
    a = p.parse_args(argv)
    katas = [find_kata(n) for n in a.katas] if a.katas else load_katas()
    if not a.check:
        for k in katas:
            print(report(k), flush=True)
        return 0
    found = [msg for k in katas for msg in problems(k)]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(found, f)
    for msg in found:
        print(msg)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
