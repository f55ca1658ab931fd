"""Prove that the checks bite: `make verify` (also run by `make test`).

For three seeds, the hidden checks run against the reference, every catalogue bug planted alone, and every kata,
through the same judge as `make check` (conftest.py, grpo_katas/judge): the targets are split over one judge
process per CPU core, each with one worker that loads its share of the targets once and serves every seed.
Then:
  - the reference passes every check;
  - each bug fails exactly the checks it declares, at least one of them in its own component;
  - each kata fails exactly its FAIL_TO_PASS set (the union of its bugs' checks) and passes the rest;
  - each kata is the reference plus exactly its bugs, byte for byte, so the kata with its fixes applied
    (healed) is the reference, which passes everything;
  - every check is failed by at least one bug (no dead checks);
  - the verdicts are identical across the seeds (no flaky check);
  - every failure is the check's own assertion or a contract call that failed, never an exception raised by
    the checks' own code.
It prints the bugs-by-checks matrix and exits non-zero on any violation.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpo_katas import REFERENCE, ROOT
from grpo_katas.catalogue import CheckId, fail_to_pass, kata_source, load_bugs, load_katas, plant
from grpo_katas.matrix import Verdict

SEEDS = (0, 1, 2)


def run_matrix(targets: dict, seeds, processes: int) -> tuple:
    """({seed: {name: {CheckId: Verdict}}}, problems) for every target, in `processes` parallel judges."""
    names = list(targets)
    chunks = [names[i::processes] for i in range(processes)]

    def run_chunk(chunk):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = Path(f.name)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, "-m", "grpo_katas.matrix", *[f"--seed={s}" for s in seeds], "--out", str(out),
               *[str(targets[n]) for n in chunk]]
        r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            data = json.loads(out.read_text())
        except ValueError:
            return {}, [f"the judge for {chunk[0]}.. wrote no verdicts (exit {r.returncode}): {r.stderr[-500:]}"]
        finally:
            out.unlink(missing_ok=True)
        found = {s: {} for s in seeds}
        problems = [f"{chunk[int(i)]}: cannot be loaded: {m}" for i, m in data["load_errors"].items()]
        problems += [f"worker event while judging {chunk[0]}..: {e}" for e in data["events"]]
        for name, per_seed in zip(chunk, data["verdicts"]):
            for s in seeds:
                found[s][name] = {CheckId.parse(c): Verdict(**v) for c, v in per_seed.get(str(s), {}).items()}
        return found, problems

    merged, problems = {s: {} for s in seeds}, []
    with ThreadPoolExecutor(processes) as pool:
        for found, trouble in pool.map(run_chunk, [c for c in chunks if c]):
            for s in seeds:
                merged[s].update(found.get(s, {}))
            problems += trouble
    return merged, problems


def failing(result: dict) -> set:
    return {c for c, v in result.items() if not v.passed}


def print_matrix(bugs: dict, checks: list, result: dict) -> None:
    short = {c: f"{i + 1}" for i, c in enumerate(checks)}
    print("\nchecks:")
    for c in checks:
        print(f"  {short[c]:>2}  {c}")
    print(f"\n{'bug':30s} " + " ".join(f"{short[c]:>2}" for c in checks))
    for b in bugs:
        row = failing(result[b])
        print(f"{b:30s} " + " ".join(" X" if c in row else " ." for c in checks))


def main() -> int:
    start = time.perf_counter()
    bugs, katas = load_bugs(), load_katas()
    reference = REFERENCE.read_text()
    problems = []
    processes = max(1, min(os.cpu_count() or 1, 4))
    with tempfile.TemporaryDirectory() as tmp:
        targets = {"reference": REFERENCE}
        for bug in bugs.values():
            path = Path(tmp) / f"bug_{bug.id.replace('-', '_')}.py"
            path.write_text(plant(reference, [bug]))
            targets[bug.id] = path
        for kata in katas:
            if kata.loop.read_text() != kata_source(kata, bugs):
                problems.append(f"{kata.name}: grpo.py is not the reference plus its bugs; run `make katas`")
            targets[kata.name] = kata.loop
        runs, trouble = run_matrix(targets, SEEDS, processes)
        problems += trouble
        print(f"{len(targets)} targets checked at seeds {SEEDS} ({time.perf_counter() - start:.0f} s)", flush=True)

    first = runs[SEEDS[0]]
    checks = sorted(first["reference"])
    for seed in SEEDS[1:]:
        for name in targets:
            if failing(runs[seed][name]) != failing(first[name]):
                diff = sorted(failing(runs[seed][name]) ^ failing(first[name]))
                problems.append(f"{name}: verdicts differ between seed {SEEDS[0]} and seed {seed} on {diff}")
    if failing(first["reference"]):
        problems.append(f"reference fails {sorted(failing(first['reference']))}")
    for bug in bugs.values():
        got = failing(first[bug.id])
        if got != set(bug.checks):
            problems.append(f"bug {bug.id}: fails {sorted(got)} but declares {sorted(bug.checks)}")
        if not any(c.component == bug.component for c in got):
            problems.append(f"bug {bug.id}: no failing check names its component {bug.component!r}")
    for kata in katas:
        f2p = fail_to_pass(kata, bugs)
        got = failing(first[kata.name])
        if got != f2p:
            problems.append(f"{kata.name}: FAIL_TO_PASS {sorted(f2p)} but fails {sorted(got)}")
    dead = [c for c in checks if not any(c in failing(first[b]) for b in bugs)]
    problems += [f"dead check: no bug fails {c}" for c in dead]

    for name, result in first.items():
        for c, v in result.items():
            if not v.passed and v.kind not in ("assertion", "call"):
                problems.append(f"{name}: {c} failed by {v.kind}, not by its own assertion: {v.message[:200]}")
    print_matrix(bugs, checks, first)
    elapsed = time.perf_counter() - start
    print(f"\n{len(bugs)} bugs, {len(katas)} katas, {len(checks)} checks, seeds {SEEDS}: "
          f"{len(problems)} problem(s) in {elapsed:.0f} s")
    for p in problems:
        print(f"  FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
