"""Prove that the checks bite: `make verify` (also run by `make test`).

For each of three seeds, one pytest process per CPU core runs the hidden checks against the reference, every
catalogue bug planted alone, and every kata. Then:
  - the reference passes every check;
  - each bug fails exactly the checks it declares, at least one of them in its own component;
  - each kata fails exactly its FAIL_TO_PASS set (the union of its bugs' checks) and passes the rest;
  - each kata is the reference plus exactly its bugs, byte for byte, so the kata with its fixes applied
    (healed) is the reference, which passes everything;
  - every check is failed by at least one bug (no dead checks);
  - the verdicts are identical across the seeds (no flaky check).
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
from grpo_katas.catalogue import COMPONENTS, fail_to_pass, kata_source, load_bugs, load_katas, plant

SEEDS = (0, 1, 2)


def run_matrix(targets: dict, seed: int, workers: int) -> dict:
    """{name: {check: passed}} for every target, in `workers` parallel pytest processes."""
    names = list(targets)
    chunks = [names[i::workers] for i in range(workers)]

    def run_chunk(chunk):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, "-m", "grpo_katas.matrix", "--seed", str(seed), "--out", out,
               *[str(targets[n]) for n in chunk]]
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        data = json.loads(Path(out).read_text())
        os.unlink(out)
        return {n: {c: v["passed"] for c, v in r.items()} for n, r in zip(chunk, data["results"])}

    merged = {}
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(run_chunk, [c for c in chunks if c]):
            merged.update(part)
    return merged


def failing(result: dict) -> set:
    return {c for c, ok in result.items() if not ok}


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
    workers = max(1, min(os.cpu_count() or 1, 4))
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
        runs = {}
        for seed in SEEDS:
            runs[seed] = run_matrix(targets, seed, workers)
            print(f"seed {seed}: {len(targets)} targets checked ({time.perf_counter() - start:.0f} s)", flush=True)

    first = runs[SEEDS[0]]
    checks = sorted(first["reference"], key=lambda c: (COMPONENTS.index(c.split("::")[0]), c))
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
        if not any(c.split("::")[0] == bug.component for c in got):
            problems.append(f"bug {bug.id}: no failing check names its component {bug.component!r}")
    for kata in katas:
        f2p = fail_to_pass(kata, bugs)
        got = failing(first[kata.name])
        if got != f2p:
            problems.append(f"{kata.name}: FAIL_TO_PASS {sorted(f2p)} but fails {sorted(got)}")
    dead = [c for c in checks if not any(c in failing(first[b]) for b in bugs)]
    problems += [f"dead check: no bug fails {c}" for c in dead]

    print_matrix(bugs, checks, first)
    elapsed = time.perf_counter() - start
    print(f"\n{len(bugs)} bugs, {len(katas)} katas, {len(checks)} checks, seeds {SEEDS}: "
          f"{len(problems)} problem(s) in {elapsed:.0f} s")
    for p in problems:
        print(f"  FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
