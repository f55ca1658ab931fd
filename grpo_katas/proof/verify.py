"""Prove that the checks bite: `make verify` (the whole proof; .ci/run runs it fresh) and `make test`'s static tier.

    python -m grpo_katas.proof.verify [--tier full|static] [--fresh] [--seeds 0 1 2] [--codebase NAME]

(--codebase judges one codebase and its bugs only: a quick loop while writing its edits.)

  full    (make verify, .ci/run): every bug planted alone in every codebase it applies to, the checks at seeds 0, 1
          and 2, every symptom at seeds 0-4 (seed 4 only where one of the first four missed), and every kata's
          recorded run (run.txt) printed alike on each CPU kernel path (default, avx2, and avx512 where the CPU has
          it), with the numbers its brief reads from it;
  static  (make test): the rules that need no run and no verdict, for every planting and every kata: an edit still
          applies, no tell, no unused name, no linter finding, no structural tell, a kata is its codebase plus its
          bugs, every bug is reachable from its brief or first hint, every kata has its recorded run. The tests
          then reproduce a kata of each codebase against its record (tests/test_record.py).

The hidden checks run through the same judge as `make check` (conftest.py, grpo_katas/judge): the targets are split
over one judge process per CPU core, each with one worker that loads its share of the targets once and serves every
seed. A target's verdicts at a seed are kept in .cache/verify/ (git-ignored) under a key made of the hashes of its
file, checks/, lab/ and the judge's files (JUDGE_FILES) with the torch and pytest versions, so a second run judges
only the targets an edit changed; --fresh judges everything (CI does). Targets with the same bytes (a one-bug kata
and that bug planted alone in its codebase) are judged once. Then, for every codebase:
  - the codebase passes every check;
  - each bug planted alone fails exactly the checks it declares, at least one of them in its own component;
  - each kata fails exactly its FAIL_TO_PASS set (the union of its bugs' checks) and passes the rest;
  - each kata is its codebase plus exactly its bugs, byte for byte, so the kata with its fixes applied (healed)
    is the codebase, which passes everything;
  - no kata file, and no file with one bug planted, contains a tell of its own bugs, and no kata file calls
    itself a reference or a corrected loop, or says where it comes from (a style line, a path into solutions/,
    the repository it is modelled on);
and overall:
  - every check is failed by at least one bug (no dead checks);
  - the verdicts are identical across the seeds (no flaky check);
  - every failure is the check's own assertion or a contract call that failed, never an exception raised by
    the checks' own code;
  - at least 90% of the bugs can be planted in at least 3 of the 4 codebases, and every bug that cannot be
    planted somewhere says why;
  - each interview round uses a codebase that no warm-up uses;
  - no bug, planted alone, leaves a parameter or local name unused that its codebase uses (a linter's pointer),
    or a structural tell: a state variable no longer updated, a keyword parameter no caller passes, a twin
    computation from another expression; or a reader's tell: a comment or docstring beside it, as the codebase
    has it, that names what the planted lines no longer do, or a pure call whose result is dropped
    (grpo_katas/proof/structure.py);
  - no planting and no kata carries a ruff finding its codebase does not carry (grpo_katas/proof/lint.py: pyflakes,
    bugbear, pylint's unused, no-effect and comparison rules), compared by rule and line text; without ruff
    installed this is one problem, never a pass;
  - every symptom a kata's brief cites (kata.toml) shows in a run of the kata against its healthy codebase, at
    the brief's seed and at all but one in five of the seeds asked for; the brief's recorded run and its healthy
    run print their recorded tables under each CPU kernel path asked for, and the numbers the brief prints read
    true there (under each path where they come from those runs, under this CPU's where they come from a rerun
    under other settings); and, with seeds asked for, each symptom goes away when a bug it names is healed, so
    every bug is reachable (grpo_katas/catalogue/symptoms.py);
  - the first codebase with any one contract function returning NaN (every float it returns) fails at least one
    check of that function's component: no comparison lets a NaN through.
It prints the bugs-by-checks matrix, then what the proof cost (`make verify: ...`: the CPU-seconds of judging and of
making runs, and what each costs a planting, a kata and a symptom, which .ci/measure echoes), and exits non-zero on
any violation.
"""
import argparse
import ast
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_katas import ROOT, run_counted, yes_or_no
from grpo_katas.catalogue.katas import (CODEBASES, CheckId, codebase_source, fail_to_pass, kata_source, load_bugs,
                                        load_katas, plant, tells_in)
from grpo_katas.judge.matrix import Verdict
from grpo_katas.proof.lint import LintUnavailable, planted_findings
from grpo_katas.proof.structure import structural_tells


SEEDS = (0, 1, 2)
SYMPTOM_SEEDS = (0, 1, 2, 3, 4)
# a file that advertises itself as the answer (the reference *policy* is GRPO's own vocabulary and is fine)
ADVERTS = re.compile(r"reference (implementation|loop|solution|version)|corrected (loop|version|implementation|code)"
                     r"|the reference:|measured against", re.I)
CACHE = ROOT / ".cache" / "verify"
# what a verdict depends on besides the target: every file of this repository the judge or its worker imports
# (tests/test_verify.py holds this list to what they do import)
JUDGE_FILES = ("checks", "lab", "grpo_katas/judge", "conftest.py", "grpo_katas/__init__.py", "grpo_katas/catalogue",
               # what the brief's run runs (the runner in its sandbox) and reads its runs with
               "grpo_katas/training/__init__.py", "grpo_katas/training/runs.py", "grpo_katas/training/runner.py",
               "grpo_katas/training/loader.py", "grpo_katas/training/curves.py")


@dataclass(frozen=True)
class Tier:
    """How much a proof judges; every tier applies every static rule to every planting and every kata."""
    name: str
    seeds: tuple                  # the checks' base seeds; none: nothing is judged and nothing is run
    symptom_seeds: tuple | None   # the seeds of the symptom runs; None: each kata's own [run] seed (the brief's)
    kernels: tuple                # the CPU kernel paths besides this machine's own (ATEN_CPU_CAPABILITY); avx512
                                  # where the CPU has it


TIERS = {"full": Tier("full", SEEDS, SYMPTOM_SEEDS, ("default", "avx2", "avx512")),
         "static": Tier("static", (), None, ())}


def has_avx512() -> bool:
    """Whether torch would take its AVX-512 kernels here, asked in a process that ATEN_CPU_CAPABILITY does not cap."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=env, capture_output=True, text=True)
    return "AVX512" in probe.stdout


class VerdictCache:
    """Each target's verdicts at one seed, in .cache/verify/SEED/NAME.json with the key they were judged under: the
    hashes of the target's file and of JUDGE_FILES, the torch and pytest versions and ATEN_CPU_CAPABILITY. One file
    per target and seed, replaced when its key changes, so the folder never holds more than one entry for each."""

    def __init__(self, root: Path = CACHE, fresh: bool = False, source: Path = ROOT):
        self.root, self.fresh = root, fresh
        h = hashlib.sha256()
        for rel in JUDGE_FILES:
            base = source / rel
            for f in sorted(base.rglob("*")) if base.is_dir() else [base]:
                if f.is_file() and "__pycache__" not in f.parts:
                    h.update(f"{f.relative_to(source)}\0".encode() + f.read_bytes() + b"\0")
        for dist in ("torch", "pytest"):
            h.update(f"{dist}=={importlib.metadata.version(dist)}\0".encode())
        h.update(os.environ.get("ATEN_CPU_CAPABILITY", "").encode())  # the kernel path this machine's judges take
        self.judge = h.hexdigest()

    def key(self, path: Path) -> str:
        return hashlib.sha256(self.judge.encode() + Path(path).read_bytes()).hexdigest()

    def file(self, name: str, seed: int) -> Path:
        return self.root / str(seed) / f"{name.replace(':', '-').replace('/', '-')}.json"

    def get(self, name: str, key: str, seed: int) -> dict | None:
        """The verdicts judged under this key, or None (also under --fresh)."""
        if self.fresh:
            return None
        try:
            entry = json.loads(self.file(name, seed).read_text())
            if entry["key"] != key:
                return None
            return {CheckId.parse(c): Verdict(**v) for c, v in entry["verdicts"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, name: str, key: str, seed: int, verdicts: dict) -> None:
        path = self.file(name, seed)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "verdicts": {str(c): asdict(v) for c, v in verdicts.items()}}))
            os.replace(tmp, path)  # whole or not at all, should two proofs write at once
        except OSError:
            pass  # an unwritable cache costs a later run time, never a verdict

# where a kata comes from: no file at work names the repository it was modelled on, or the path of its answer
PROVENANCE = re.compile(r"^#\s*style:.*$|solutions/\S*|\b(karpathy|volcengine|huggingface)/\w+", re.I | re.M)


# each contract function, and the component whose checks judge it
CONTRACT = {"generate": "sampling", "completion_mask": "sampling", "group_advantages": "advantages",
            "token_logprobs": "log-probs", "token_entropies": "log-probs", "kl_penalty": "kl", "grpo_loss": "loss",
            "grpo_step": "update", "train": "training"}
# appended to a codebase, with FN replaced: FN returns NaN wherever it returned a float (its gradient too)
NAN_VARIANT = """

import torch as _torch


def _nan(value):
    if isinstance(value, _torch.Tensor):
        return value * float("nan") if value.is_floating_point() else value
    if isinstance(value, float):
        return float("nan")
    if isinstance(value, dict):
        return {k: _nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan(v) for v in value]
    for k, v in list(getattr(value, "__dict__", {}).items()):
        object.__setattr__(value, k, _nan(v))
    return value


def _returns_nan(fn):
    return lambda *args, **kwargs: _nan(fn(*args, **kwargs))


FN = _returns_nan(FN)
"""


def nan_variants(codebase: str, tmp: Path) -> dict:
    """"nan:FN" -> a file: the codebase with the contract function FN returning NaN in every float it returns."""
    out = {}
    for fn in CONTRACT:
        path = tmp / f"nan_{fn}__{codebase}.py"
        path.write_text(codebase_source(codebase) + NAN_VARIANT.replace("FN", fn))
        out[f"nan:{fn}"] = path
    return out


def nan_problems(first: dict) -> list:
    """Each NaN variant must fail a check of its function's component; prints what each fails."""
    problems = []
    print("\nNaN-returning variants (each contract function returns NaN in every float):")
    for fn, component in CONTRACT.items():
        failed = failing(first.get(f"nan:{fn}", {}))
        own = [c for c in failed if c.component == component]
        print(f"  {fn:18s} fails {len(failed):2d} checks, {len(own)} of them {component} checks")
        if not own:
            problems.append(f"{fn} returning NaN passes every {component} check: a comparison lets NaN through")
    return problems


def run_matrix(targets: dict, seeds, processes: int, cost: "Cost | None" = None) -> tuple:
    """({seed: {name: {CheckId: Verdict}}}, problems, clean) for every target, in `processes` parallel judges; clean
    names the targets that loaded and whose judge saw no hang, crash or restart: verdicts fit to keep. The judges'
    CPU-seconds (their workers' included) go to `cost`."""
    names = list(targets)
    chunks = [names[i::processes] for i in range(processes)]

    def run_chunk(chunk):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = Path(f.name)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, "-m", "grpo_katas.judge.matrix", *[f"--seed={s}" for s in seeds], "--out", str(out),
               *[str(targets[n]) for n in chunk]]
        with tempfile.TemporaryFile("w+") as err:
            code, cpu = run_counted(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
            err.seek(0)
            stderr = err.read()
        try:
            data = json.loads(out.read_text())
        except ValueError:
            data = None
        finally:
            out.unlink(missing_ok=True)
        if cost is not None:  # the judge and what it reaped, and its sandboxed worker, which it kills instead
            cost.judged(len(chunk) * len(seeds), cpu + float((data or {}).get("worker_cpu_seconds", 0.0)))
        if data is None:
            return {}, [f"the judge for {chunk[0]}.. wrote no verdicts (exit {code}): {stderr[-500:]}"], []
        found = {s: {} for s in seeds}
        problems = [f"{chunk[int(i)]}: cannot be loaded: {m}" for i, m in data["load_errors"].items()]
        problems += [f"worker event while judging {chunk[0]}..: {e}" for e in data["events"]]
        for name, per_seed in zip(chunk, data["verdicts"]):
            for s in seeds:
                found[s][name] = {CheckId.parse(c): Verdict(**v) for c, v in per_seed.get(str(s), {}).items()}
        clean = [] if data["events"] else [n for i, n in enumerate(chunk) if str(i) not in data["load_errors"]]
        return found, problems, clean

    merged, problems, clean = {s: {} for s in seeds}, [], []
    with ThreadPoolExecutor(processes) as pool:
        for found, trouble, fine in pool.map(run_chunk, [c for c in chunks if c]):
            for s in seeds:
                merged[s].update(found.get(s, {}))
            problems += trouble
            clean += fine
    return merged, problems, clean


def judge(targets: dict, seeds, processes: int, cache: VerdictCache, cost: "Cost | None" = None) -> tuple:
    """({seed: {name: verdicts}}, problems, files judged, targets reused). Targets with the same bytes are judged
    once (a one-bug kata is its bug planted alone in its codebase); a file judged before under the same key at every
    seed comes from the cache; what was judged cleanly goes into the cache."""
    same = {}  # key -> the names of the targets with those bytes
    for name, path in targets.items():
        same.setdefault(cache.key(path), []).append(name)
    runs, todo = {s: {} for s in seeds}, {}  # todo: key -> the name it is judged under
    for key, names in same.items():
        hits = [{s: cache.get(name, key, s) for s in seeds} for name in names]
        found = next((h for h in hits if None not in h.values()), None)
        if found is None:
            todo[key] = names[0]
            continue
        for s, verdicts in found.items():
            runs[s].update(dict.fromkeys(names, verdicts))
    fresh, problems, clean = run_matrix({n: targets[n] for n in todo.values()}, seeds, processes, cost)
    for key, name in todo.items():
        if cache.key(targets[name]) != key:  # rebuilt while judged: its verdicts are of bytes no key names
            problems.append(f"{name}: its file changed while it was judged: run verify again once nothing is "
                            f"rebuilding it")
            clean = [n for n in clean if n != name]
        for s in seeds:
            if name in fresh[s]:
                runs[s].update(dict.fromkeys(same[key], fresh[s][name]))
                if name in clean:
                    for each in same[key]:
                        cache.put(each, key, s, fresh[s][name])
    return runs, problems, len(todo), len(targets) - sum(len(same[k]) for k in todo)


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


def targets_for(bugs, codebases, judged, tmp: Path) -> dict:
    """name -> path of each file to judge but the katas: the codebases and each planting in `judged` (a set of (bug
    id, codebase)), written to tmp. An edit that no longer applies plants nothing (static_rules says so)."""
    targets = {f"codebase:{name}": CODEBASES[name].path for name in codebases}
    for bug_id, name in sorted(judged):
        try:
            text = plant(codebase_source(name), [bugs[bug_id]], name)
        except Exception:  # noqa: BLE001 (an edit that no longer matches, whatever plant raised: judge the rest)
            continue
        path = tmp / f"{bug_id.replace('-', '_')}__{name}.py"
        path.write_text(text)
        targets[f"{bug_id}@{name}"] = path
    return targets


def static_rules(bugs, katas, codebases) -> list:
    """The problems the rules that read files find: for every planting in these codebases, an edit still applies and
    leaves no unused name, no tell, no structural tell and no linter finding; every bug plants in each codebase or
    says why not; every kata is its codebase plus its bugs and has no tell, advert or provenance."""
    problems = []
    sources = {name: codebase_source(name) for name in codebases}
    linted = {}  # "bug@codebase" or a kata's name -> (codebase, text), for one ruff run over them all
    for name in codebases:
        source = sources[name]
        unused_before = unused_names(source)
        for bug in bugs.values():
            if bug.applies_to(name):
                try:
                    text = plant(source, [bug], name)
                except Exception as exc:  # an edit that no longer matches: report it, check the rest
                    problems.append(str(exc).splitlines()[0])
                    continue
                for left in sorted(unused_names(text) - unused_before):
                    problems.append(f"bug {bug.id}@{name}: the planted file leaves {left} unused, which points at it")
                for _, tell in tells_in(text, [bug], name):
                    problems.append(f"bug {bug.id}@{name}: the planted file says {tell!r}, which gives it away")
                for tell in structural_tells(source, text):
                    problems.append(f"bug {bug.id}@{name}: {tell}, which points at it")
                linted[f"bug {bug.id}@{name}"] = (name, text)
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
        if PROVENANCE.search(text):
            problems.append(f"{kata.name}: the file says where it comes from: {PROVENANCE.search(text).group(0)!r}")
        if kata.codebase in sources:
            linted[kata.name] = (kata.codebase, text)
    return problems + lint_problems(sources, linted)


def lint_problems(sources: dict, linted: dict) -> list:
    """One problem per ruff finding a planted file or a kata adds to its codebase; one if ruff cannot run."""
    try:
        found = planted_findings(sources, linted)
    except LintUnavailable as exc:
        return [str(exc)]
    return [f"{key}: {finding}, which the codebase does not carry" for key, extra in sorted(found.items())
            for finding in extra]


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


def symptom_problems(katas, processes: int, seeds=None, kernels=None, cost: "Cost | None" = None) -> list:
    """Each kata's recorded symptoms against runs of the kata and its healthy codebase (grpo_katas/catalogue/symptoms.py),
    made in `processes` parallel processes and kept in .cache/symptoms/ (keyed by the bytes of the code they ran).
    seeds None: the brief's seed; otherwise each symptom must hold at all but one in five of them (4 of 0-4).
    kernels None: this process's CPU kernel path; otherwise each record is checked under each (("default", "avx2"),
    "avx512" where the CPU has it). What the runs cost goes to `cost`."""
    from grpo_katas.catalogue import symptoms
    try:
        return symptoms.check(katas, processes, seeds, kernels, log=print, made=cost.ran if cost is not None else None)
    except symptoms.Changed as exc:
        return [f"symptoms: {exc}"]


class Cost:
    """What a proof spent, in CPU-seconds: judging files (each at each seed; a judge's sandboxed worker, which it
    kills rather than reaps, included) and making runs (each of some steps), counted as the judges and the run
    makers end; the arithmetic of the CI issue's projection."""

    def __init__(self):
        self.lock, self.judging, self.judgings, self.running, self.runs, self.steps = threading.Lock(), 0.0, 0, 0.0, 0, 0

    def judged(self, judgings: int, cpu: float) -> None:
        with self.lock:
            self.judgings, self.judging = self.judgings + judgings, self.judging + cpu

    def ran(self, runs: int, steps: int, cpu: float) -> None:
        with self.lock:
            self.runs, self.steps, self.running = self.runs + runs, self.steps + steps, self.running + cpu

    def line(self, plantings: int, katas: int, symptoms: int) -> str:
        """One line `.ci/measure` echoes: each part's CPU-seconds and what it costs a planting, a kata, a symptom."""
        per = lambda total, n: f"{total / n:.2f}" if n else "-"  # noqa: E731
        return (f"make verify: judging {self.judging:.0f} CPU-s for {self.judgings} file-seeds "
                f"({per(self.judging, self.judgings)} each; {per(self.judging, plantings)} a planting); runs "
                f"{self.running:.0f} CPU-s for {self.runs} runs, {self.steps} steps ({per(self.running, self.steps)} "
                f"a step; {per(self.running, katas)} a kata, {per(self.running, symptoms)} a symptom)")


def catalogue_rules(bugs, katas, problems) -> None:
    wide = [b for b in bugs.values() if len(b.edits) >= 3]
    if len(wide) < 0.9 * len(bugs):
        narrow = sorted(b.id for b in bugs.values() if len(b.edits) < 3)
        problems.append(f"only {len(wide)} of {len(bugs)} bugs plant in 3+ codebases (90% must): {narrow}")
    warm = {k.codebase for k in katas if k.tier == "warm-up"}
    for k in katas:
        if k.tier == "interview" and k.codebase in warm:
            problems.append(f"{k.name}: an interview round on the {k.codebase} codebase, which a warm-up uses")


def static_problems(katas) -> list:
    """What the symptoms and the records require without a run: every bug of a kata reachable from its brief or
    first hint, and a recorded run (run.txt) of its brief's run with a table on each side."""
    from grpo_katas.catalogue import record, symptoms
    bugs, out = load_bugs(), []
    for k in katas:
        out += symptoms.coverage_problems(k, bugs)
        recorded = record.load(k)
        if recorded is None or not all(len(recorded.get(side, [])) > 1 for side in record.SIDES):
            out.append(f"{k.name}: no recorded run with both tables ({record.NAME}): python -m grpo_katas.proof.record_runs "
                       f"{k.number} writes it")
    return out


def switch(text: str) -> bool:
    """FRESH= as make passes it: 1/yes/true/on or 0/no/false/off, anything else refused in one line."""
    try:
        return yes_or_no(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Parser(argparse.ArgumentParser):
    """A usage error as one line and exit status 2."""

    def error(self, message):
        print(f"error: {message}; python -m grpo_katas.proof.verify --help says more", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", choices=list(TIERS), default="full",
                        help="full: every bug in every codebase, three seeds, every symptom at five seeds and each "
                             "kernel path (make verify, CI); static: the rules that need no run (make test)")
    parser.add_argument("--fresh", nargs="?", const="yes", default="no", type=switch, metavar="yes|no",
                        help="judge every target again, reusing no verdict from .cache/verify (CI always does)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="base seeds of the checks' draws (default: the full tier's, 0 1 2)")
    parser.add_argument("--processes", type=int, default=max(1, min(os.cpu_count() or 1, 4)),
                        help="parallel judges (default: one per core, at most 4)")
    parser.add_argument("--codebase", choices=list(CODEBASES), default=None,
                        help="judge only this codebase and its bugs (while writing its edits)")
    args = parser.parse_args(argv)
    level = TIERS[args.tier]
    seeds = tuple(args.seeds) if args.seeds and level.seeds else level.seeds
    codebases = [args.codebase] if args.codebase else list(CODEBASES)
    start = time.perf_counter()
    bugs = load_bugs()
    katas = load_katas() if not args.codebase else []  # --codebase: the codebase and its bugs only
    judged = {(b.id, name) for b in bugs.values() for name in codebases if b.applies_to(name)} if seeds else set()
    problems, cost = [], Cost()
    if not args.codebase:
        catalogue_rules(bugs, katas, problems)
    if not seeds:  # the static tier: no verdict, no run
        problems += static_rules(bugs, katas, codebases) + static_problems(katas)
        return conclude(f"static tier: {sum(len(b.edits) for b in bugs.values())} plantings ({len(CODEBASES)} "
                        f"codebases) and {len(katas)} katas", problems, start)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        # the symptom runs and the judges need nothing of the static rules: they start first, and the rules are
        # applied here while they run, so that no core waits for the rules (nor for another's last process)
        kernels = tuple(k for k in level.kernels if k != "avx512" or has_avx512()) if katas else ()
        symptoms = pool.submit(symptom_problems, katas, args.processes, seeds=level.symptom_seeds, kernels=kernels,
                               cost=cost) if katas else None
        targets = targets_for(bugs, codebases, judged, Path(tmp))
        targets.update({k.name: k.loop for k in katas})
        targets.update(nan_variants(codebases[0], Path(tmp)))
        judging = pool.submit(judge, targets, seeds, args.processes, VerdictCache(CACHE, fresh=args.fresh), cost)
        problems += static_rules(bugs, katas, codebases)
        runs, trouble, files, reused = judging.result()
        problems += trouble
        print(f"{len(targets)} targets at seeds {seeds}: {len(targets) - reused} judged ({files} distinct files), "
              f"{reused} reused from {os.path.relpath(CACHE, ROOT)} ({time.perf_counter() - start:.0f} s)", flush=True)
        if symptoms:
            problems += symptoms.result()
            print(f"the symptoms and records of {len(katas)} katas ({time.perf_counter() - start:.0f} s)", flush=True)
    first = runs[seeds[0]]
    for seed in seeds[1:]:
        for name in targets:
            if failing(runs[seed].get(name, {})) != failing(first.get(name, {})):
                diff = sorted(map(str, failing(runs[seed].get(name, {})) ^ failing(first.get(name, {}))))
                problems.append(f"{name}: verdicts differ between seed {seeds[0]} and seed {seed} on {diff}")
    checks = (judge_verdicts(bugs, katas, first, problems, codebases) if all(t in first for t in targets) else [])
    if checks:
        print_matrix(bugs, checks, first, codebases)
        problems += nan_problems(first)
    print("\n" + cost.line(len(judged), len(katas), sum(len(k.symptoms) for k in katas)), flush=True)
    return conclude(f"{level.name} tier: {len(judged)} of {sum(len(b.edits) for b in bugs.values())} plantings "
                    f"judged ({len(CODEBASES)} codebases), {len(katas)} katas, {len(checks)} checks, seeds {seeds}",
                    problems, start)


def conclude(what: str, problems: list, start: float) -> int:
    """A tier's last lines: what it judged, how many problems and how long, then each problem; its exit status."""
    print(f"\n{what}: {len(problems)} problem(s) in {time.perf_counter() - start:.0f} s")
    for p in problems:
        print(f"  FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
