"""Run the hidden checks against one or many targets and seeds, and record a verdict per target, seed and check.

    python -m grpo_katas.judge.matrix --seed 0 --seed 1 --out results.json target.py [target.py ...]

pytest runs in this process (the judge): the targets are imported by a worker process only (conftest.py,
grpo_katas/judge). A check passes only on evidence: every one of its test items (its draws) for that target and
seed must have run its call phase and passed. Skipped, errored or missing items are failures, each with a
message; so is an item whose setup or teardown failed. Each failure also records how it came about: the check's
own assertion ("assertion"), a contract call that raised, hung or crashed ("call"), or an exception in the
checks' own code ("error", which `make verify` refuses). A message is kept to MESSAGE_CHARS characters, whatever
a target made a check quote.

With a kata (`--kata N`, one target), the brief's run is judged too: run::brief_symptoms_gone
(grpo_katas/judge/brief.py), a verdict that stands for every seed. The judge starts the target's runs itself, beside
the checks, each in a run's sandbox of its own (the one `make run` trains in), never through the worker that
imports the target. Without a kata there is no brief, and no verdict on a run.
"""
import argparse
import contextlib
import io
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from grpo_katas import CHECKS, ROOT
from grpo_katas.catalogue.katas import RUN_CHECK, CheckId


MESSAGE_CHARS = 2000


@dataclass
class Verdict:
    passed: bool
    message: str = ""
    kind: str = ""        # how the first failure came about: assertion, call, error, skipped, missing
    items: int = 0        # test items (draws) that ran for this check


@dataclass
class Run:
    exit_code: int
    verdicts: list        # per target: {seed: {CheckId: Verdict}}
    load_errors: dict     # target index -> message
    sandbox: str          # the worker's sandbox mode, and why when it is not bubblewrap
    events: list          # hangs, crashes and restarts of the worker
    worker_cpu: float = 0.0  # CPU-seconds of the worker's sandboxed processes, which no wait of the judge counts

    def of(self, target: int, seed: int) -> dict:
        return self.verdicts[target].get(seed, {})


def check_id(item) -> CheckId:
    return CheckId(item.get_closest_marker("component").args[0], item.originalname.removeprefix("test_"))


class Collector:
    """A pytest plugin that files every report under (target, seed, check) and keeps the worker's record."""

    def __init__(self, targets, brief=None):
        self.index = {str(Path(t).resolve()): i for i, t in enumerate(targets)}
        self.where = {}                          # nodeid -> (target index, seed, CheckId)
        self.outcomes = defaultdict(dict)        # nodeid -> {phase: (outcome, message, kind)}
        self.worker = None
        self.brief, self.first, self.run_verdict = brief, None, None   # the brief's run of the first target

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        seeds = tuple(config.getoption("--seed") or [0])
        for item in items:
            params = getattr(item, "callspec", None) and item.callspec.params
            if not params or "grpo" not in params:
                continue
            target = params["grpo"]
            self.worker = target.worker
            if self.index[str(target.path.resolve())] == 0:
                self.first = target
            # a check that draws nothing from the seed (the training run) stands for every seed
            self.where[item.nodeid] = (self.index[str(target.path.resolve())],
                                       (params["seed"],) if "seed" in params else seeds, check_id(item))

    def pytest_runtest_logreport(self, report):
        if report.nodeid in self.where:
            kind = dict(report.user_properties).get("failure", "skipped" if report.skipped else "")
            self.outcomes[report.nodeid][report.when] = (report.outcome, failure_message(report), kind)

    def pytest_sessionfinish(self, session, exitstatus):
        """The brief's run, while the worker is still there (pytest_unconfigure closes it); not after a Ctrl-C."""
        if self.brief is None or self.brief.skipped() or self.first is None \
                or exitstatus == pytest.ExitCode.INTERRUPTED:
            return
        try:
            passed, message, kind = self.brief.verdict(self.first)
        except Exception as exc:  # a defect of the judge's own side: a failure that says so, never a pass
            passed, message, kind = False, f"the brief's run could not be judged ({type(exc).__name__}: {exc})", "error"
        self.run_verdict = Verdict(passed, message[:MESSAGE_CHARS], kind, 1)

    def verdicts(self, n_targets: int) -> list:
        out = [defaultdict(dict) for _ in range(n_targets)]
        for nodeid, (target, seeds, check) in self.where.items():
            for seed in seeds:
                self.file(out[target][seed].setdefault(check, Verdict(True)), self.outcomes.get(nodeid, {}))
        if self.run_verdict is not None:  # the brief's run has no seed of the checks': it stands for each
            for seed in list(out[0]):
                out[0][seed][RUN_CHECK] = self.run_verdict
        return [dict(t) for t in out]

    @staticmethod
    def file(v: Verdict, phases: dict) -> None:
        v.items += "call" in phases
        if not v.passed:
            return
        bad = [(when, o) for when, o in phases.items() if o[0] != "passed"]
        if bad:
            when, (outcome, message, kind) = bad[0]
            v.passed, v.kind = False, kind or "error"
            v.message = message if outcome == "failed" else f"{outcome} in {when}: {message}"
        elif "call" not in phases:
            v.passed, v.kind, v.message = False, "missing", "did not run"


def failure_message(report) -> str:
    """The failure's own message (the symptom), without the traceback."""
    if report.passed:
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    for prefix in ("AssertionError: ", "Failed: ", "grpo_katas.judge.client.CallFailed: "):
        text = text.removeprefix(prefix)
    text = text.split("\nassert ")[0].strip()
    return text if len(text) <= MESSAGE_CHARS else f"{text[:MESSAGE_CHARS]}... ({len(text)} characters)"


def run(targets, seeds=(0,), *, sandbox: str = "auto", memory_gb: float = 8.0, time_limit: float | None = None,
        deadline: float | None = None, checks: Path = CHECKS, echo: bool = False, kata=None) -> Run:
    """Run the checks in this process against the targets; the targets run in one worker process. With a kata (one
    target), its brief's run is judged as well."""
    brief = None
    if kata is not None:
        if len(targets) != 1:
            raise ValueError("the brief's run judges one target")
        from grpo_katas.judge.brief import Brief
        from grpo_katas.judge.sandbox import resolve
        try:  # the file's runs start beside the checks, in the worker's sandbox mode
            brief = Brief(kata).start(Path(targets[0]).resolve(), resolve(sandbox)[0], deadline)
        except RuntimeError:  # no sandbox of that mode: the worker says so, and the brief's run is made after
            brief = Brief(kata).start()
    collector = Collector(targets, brief)
    # logging and warnings capture cost more than the checks on a busy run, and the checks use neither
    args = [str(checks), "-q", "-p", "no:cacheprovider", "-p", "no:logging", "-p", "no:warnings",
            "--rootdir", str(ROOT), "--no-header",
            "-o", "console_output_style=classic", "--tb=no", f"--sandbox={sandbox}", f"--memory-gb={memory_gb}",
            *[f"--seed={s}" for s in seeds], *[f"--target={t}" for t in targets]]
    if time_limit is not None:
        args.append(f"--time-limit={time_limit}")
    if deadline is not None:
        args.append(f"--deadline={deadline}")
    sink = contextlib.nullcontext() if echo else contextlib.redirect_stdout(io.StringIO())
    with sink:
        code = int(pytest.main(args, plugins=[collector]))
    w = collector.worker
    load_errors = {collector.index[str(w.targets[k].resolve())]: m for k, m in w.load_errors.items()} if w else {}
    sandbox_desc = (w.mode + (f" ({w.why})" if w.why else "") + (f"; {w.caps}" if w.caps else "")) if w else "none"
    return Run(code, collector.verdicts(len(targets)), load_errors, sandbox_desc, list(w.events) if w else [],
               w.unreaped_cpu if w else 0.0)


def report(r: Run, targets) -> dict:
    """A run as JSON-ready data (what `--out` holds)."""
    return {"exit_code": r.exit_code, "targets": [str(t) for t in targets], "load_errors": r.load_errors,
            "sandbox": r.sandbox, "events": r.events, "worker_cpu_seconds": round(r.worker_cpu, 2),
            "verdicts": [{str(seed): {str(c): asdict(v) for c, v in by_check.items()}
                          for seed, by_check in t.items()} for t in r.verdicts]}


def from_report(data: dict) -> Run:
    """The run a `report` describes."""
    verdicts = [{int(seed): {CheckId.parse(c): Verdict(**v) for c, v in by_check.items()}
                 for seed, by_check in t.items()} for t in data["verdicts"]]
    return Run(int(data["exit_code"]), verdicts, {int(k): str(m) for k, m in data["load_errors"].items()},
               str(data["sandbox"]), [str(e) for e in data["events"]], float(data.get("worker_cpu_seconds", 0.0)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, action="append", default=None, help="repeatable (default 0)")
    parser.add_argument("--out", required=True, help="where to write the verdicts as JSON")
    parser.add_argument("--sandbox", default="auto", choices=["auto", "bubblewrap", "process"])
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit of the worker")
    parser.add_argument("--time-limit", type=float, default=None, help="wall-clock seconds for every contract call")
    parser.add_argument("--deadline", type=float, default=None,
                        help="the same as an instant, time.monotonic() on this machine (what grade passes its judge)")
    parser.add_argument("--kata", default=None,
                        help="the kata the one target fixes (7, d3): its brief's run is judged too (run::...)")
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    kata = None
    if args.kata is not None:
        from grpo_katas.catalogue import drawn
        from grpo_katas.catalogue.katas import find_kata
        kata = drawn.load(args.kata) if drawn.is_drill(args.kata) else find_kata(args.kata)
    r = run(args.targets, args.seed or [0], sandbox=args.sandbox, memory_gb=args.memory_gb,
            time_limit=args.time_limit, deadline=args.deadline, kata=kata)
    Path(args.out).write_text(json.dumps(report(r, args.targets)))
    return r.exit_code


if __name__ == "__main__":
    sys.exit(main())
