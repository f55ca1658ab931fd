"""Prove that the checks bite: `make verify` (`make test` runs it at one seed, `.ci/run` at three).

    python -m grpo_katas.verify [--seeds 0 1 2] [--codebase NAME]

(--codebase judges one codebase and its bugs only: a quick loop while writing its edits.)

The hidden checks run against every codebase, every catalogue bug planted alone in every codebase it applies
to, and every kata, through the same judge as `make check` (conftest.py, grpo_katas/judge): the targets are
split over one judge process per CPU core, each with one worker that loads its share of the targets once and
serves every seed. Then, for every codebase:
  - the codebase passes every check;
  - each bug planted alone fails exactly the checks it declares, at least one of them in its own component;
  - each kata fails exactly its FAIL_TO_PASS set (the union of its bugs' checks) and passes the rest;
  - each kata is its codebase plus exactly its bugs, byte for byte, so the kata with its fixes applied (healed)
    is the codebase, which passes everything;
  - no kata file, and no file with one bug planted, contains a tell of its own bugs, and no kata file calls
    itself a reference or a corrected loop;
and overall:
  - every check is failed by at least one bug (no dead checks);
  - the verdicts are identical across the seeds (no flaky check);
  - every failure is the check's own assertion or a contract call that failed, never an exception raised by
    the checks' own code;
  - at least 90% of the bugs can be planted in at least 3 of the 4 codebases, and every bug that cannot be
    planted somewhere says why;
  - each interview round uses a codebase that no warm-up uses;
  - no bug, planted alone, leaves a parameter or local name unused that its codebase uses (a linter's pointer);
  - every symptom a kata's brief cites (kata.toml) shows in a run of the kata against its healthy codebase, at
    the brief's seed under each CPU kernel path asked for and at all but one in five of the seeds asked for; the
    numbers the brief prints read true under each kernel path; and, with seeds asked for, each symptom goes away
    when a bug it names is healed, so every bug is reachable (grpo_katas/symptoms.py).
It prints the bugs-by-checks matrix and exits non-zero on any violation.
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpo_katas import ROOT
from grpo_katas.catalogue import (CODEBASES, CheckId, codebase_source, fail_to_pass, kata_source, load_bugs,
                                  load_katas, plant, tells_in)
from grpo_katas.matrix import Verdict

SEEDS = (0, 1, 2)
# a file that advertises itself as the answer (the reference *policy* is GRPO's own vocabulary and is fine)
ADVERTS = re.compile(r"reference (implementation|loop|solution|version)|corrected (loop|version|implementation|code)"
                     r"|the reference:|measured against", re.I)


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


def print_matrix(bugs: dict, checks: list, first: dict, codebases) -> None:
    short = {c: f"{i + 1}" for i, c in enumerate(checks)}
    print("\nchecks:")
    for c in checks:
        print(f"  {short[c]:>2}  {c}")
    print(f"\n{'bug':34s} {'codebases':9s} " + " ".join(f"{short[c]:>2}" for c in checks))
    for b in bugs.values():
        where = [name for name in codebases if f"{b.id}@{name}" in first]
        if not where:
            continue
        row = failing(first[f"{b.id}@{where[0]}"])
        marks = "".join(name[0] if b.applies_to(name) else "." for name in CODEBASES)
        print(f"{b.id:34s} {marks:9s} " + " ".join(" X" if c in row else " ." for c in checks))


def unused_names(source: str) -> set:
    """'function:name' for every parameter or local name a function binds and never reads."""
    out = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        bound = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x}
        read = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        out |= {f"{fn.name}:{n}" for n in bound - read if n not in ("self", "cls") and not n.startswith("_")}
    return out


def targets_for(bugs, katas, tmp: Path, problems: list, codebases) -> dict:
    targets = {f"codebase:{name}": CODEBASES[name].path for name in codebases}
    for name in codebases:
        source = codebase_source(name)
        unused_before = unused_names(source)
        for bug in bugs.values():
            if bug.applies_to(name):
                path = tmp / f"{bug.id.replace('-', '_')}__{name}.py"
                try:
                    text = plant(source, [bug], name)
                except Exception as exc:  # an edit that no longer matches: report it, check the rest
                    problems.append(str(exc).splitlines()[0])
                    continue
                path.write_text(text)
                targets[f"{bug.id}@{name}"] = path
                for left in sorted(unused_names(text) - unused_before):
                    problems.append(f"bug {bug.id}@{name}: the planted file leaves {left} unused, which points at it")
                for _, tell in tells_in(text, [bug], name):
                    problems.append(f"bug {bug.id}@{name}: the planted file says {tell!r}, which gives it away")
            elif name not in bug.skip:
                problems.append(f"bug {bug.id}: no edits for the {name} codebase and no reason why not")
    for kata in katas:
        text = kata.loop.read_text()
        try:
            if text != kata_source(kata, bugs):
                problems.append(f"{kata.name}: grpo.py is not its codebase plus its bugs; run `make katas`")
        except Exception as exc:
            problems.append(f"{kata.name}: {str(exc).splitlines()[0]}")
        for bug_id, tell in tells_in(text, [bugs[b] for b in kata.bugs], kata.codebase):
            problems.append(f"{kata.name}: the file says {tell!r}, which gives away {bug_id}")
        if ADVERTS.search(text):
            problems.append(f"{kata.name}: the file calls itself {ADVERTS.search(text).group(0)!r}")
        targets[kata.name] = kata.loop
    return targets


def judge_verdicts(bugs, katas, first, problems, codebases) -> list:
    checks = sorted(first[f"codebase:{codebases[0]}"])
    for name in codebases:
        if failing(first[f"codebase:{name}"]):
            problems.append(f"codebase {name} fails {sorted(map(str, failing(first[f'codebase:{name}'])))}")
    for bug in bugs.values():
        for name in codebases:
            key = f"{bug.id}@{name}"
            if key not in first:
                continue
            got, declared = failing(first[key]), set(bug.checks_in(name))
            if got != declared:
                problems.append(f"bug {key}: fails {sorted(map(str, got))} but declares {sorted(map(str, declared))}")
            if not any(c.component == bug.component for c in got):
                problems.append(f"bug {key}: no failing check names its component {bug.component!r}")
    for kata in katas:
        f2p, got = fail_to_pass(kata, bugs), failing(first[kata.name])
        if got != f2p:
            problems.append(f"{kata.name}: FAIL_TO_PASS {sorted(map(str, f2p))} but fails {sorted(map(str, got))}")
    bug_targets = [k for k in first if "@" in k]
    dead = [c for c in checks if not any(c in failing(first[k]) for k in bug_targets)]
    problems += [f"dead check: no bug fails {c}" for c in dead]
    for name, result in first.items():
        for c, v in result.items():
            if not v.passed and v.kind not in ("assertion", "call"):
                problems.append(f"{name}: {c} failed by {v.kind}, not by its own assertion: {v.message[:200]}")
    return checks


def symptom_problems(katas, processes: int, seeds=None, kernels=None) -> list:
    """Each kata's recorded symptoms against runs of the kata and its healthy codebase (grpo_katas/symptoms.py),
    made in `processes` parallel processes and kept in .cache/symptoms/. seeds None: the brief's seed; otherwise
    each symptom must hold at all but one in five of them (4 of 0-4). kernels None: this process's CPU kernel path;
    otherwise the brief's seed is checked under each (("default", "avx2"), "avx512" where the CPU has it)."""
    from grpo_katas import symptoms
    return symptoms.check(katas, processes, seeds, kernels, log=print)


def catalogue_rules(bugs, katas, problems) -> None:
    wide = [b for b in bugs.values() if len(b.edits) >= 3]
    if len(wide) < 0.9 * len(bugs):
        narrow = sorted(b.id for b in bugs.values() if len(b.edits) < 3)
        problems.append(f"only {len(wide)} of {len(bugs)} bugs plant in 3+ codebases (90% must): {narrow}")
    warm = {k.codebase for k in katas if k.tier == "warm-up"}
    for k in katas:
        if k.tier == "interview" and k.codebase in warm:
            problems.append(f"{k.name}: an interview round on the {k.codebase} codebase, which a warm-up uses")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="base seeds of the checks' draws")
    parser.add_argument("--processes", type=int, default=max(1, min(os.cpu_count() or 1, 4)),
                        help="parallel judges (default: one per core, at most 4)")
    parser.add_argument("--codebase", choices=list(CODEBASES), default=None,
                        help="judge only this codebase, its bugs and its katas (while writing its edits)")
    args = parser.parse_args(argv)
    seeds = tuple(args.seeds)
    codebases = [args.codebase] if args.codebase else list(CODEBASES)
    start = time.perf_counter()
    bugs = load_bugs()
    katas = load_katas() if not args.codebase else []  # --codebase: the codebase and its bugs only
    problems = []
    if not args.codebase:
        catalogue_rules(bugs, katas, problems)
    with tempfile.TemporaryDirectory() as tmp:
        targets = targets_for(bugs, katas, Path(tmp), problems, codebases)
        runs, trouble = run_matrix(targets, seeds, args.processes)
        problems += trouble
        if katas:
            problems += symptom_problems(katas, args.processes)
        print(f"{len(targets)} targets checked at seeds {seeds} ({time.perf_counter() - start:.0f} s)", flush=True)
    first = runs[seeds[0]]
    for seed in seeds[1:]:
        for name in targets:
            if failing(runs[seed].get(name, {})) != failing(first.get(name, {})):
                diff = sorted(map(str, failing(runs[seed][name]) ^ failing(first[name])))
                problems.append(f"{name}: verdicts differ between seed {seeds[0]} and seed {seed} on {diff}")
    checks = judge_verdicts(bugs, katas, first, problems, codebases) if all(t in first for t in targets) else []
    if checks:
        print_matrix(bugs, checks, first, codebases)
    planted = sum(len(b.edits) for b in bugs.values())
    print(f"\n{len(bugs)} bugs ({planted} plantings in {len(CODEBASES)} codebases), {len(katas)} katas, "
          f"{len(checks)} checks, seeds {seeds}: {len(problems)} problem(s) in {time.perf_counter() - start:.0f} s")
    for p in problems:
        print(f"  FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
