"""Run the hidden checks against one or many targets and seeds, and record a verdict per target, seed and check.

    python -m grpo_katas.matrix --seed 0 --seed 1 --out results.json target.py [target.py ...]

pytest runs in this process (the judge): the targets are imported by a worker process only (conftest.py,
grpo_katas/judge). A check passes only on evidence: every one of its test items (its draws) for that target and
seed must have run its call phase and passed. Skipped, errored or missing items are failures, each with a
message; so is an item whose setup or teardown failed. Each failure also records how it came about: the check's
own assertion ("assertion"), a contract call that raised, hung or crashed ("call"), or an exception in the
checks' own code ("error", which `make verify` refuses). A message is kept to MESSAGE_CHARS characters, whatever
a target made a check quote.
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
from grpo_katas.catalogue import CheckId

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

    def of(self, target: int, seed: int) -> dict:
        return self.verdicts[target].get(seed, {})


def check_id(item) -> CheckId:
    return CheckId(item.get_closest_marker("component").args[0], item.originalname.removeprefix("test_"))


class Collector:
    """A pytest plugin that files every report under (target, seed, check) and keeps the worker's record."""

    def __init__(self, targets):
        self.index = {str(Path(t).resolve()): i for i, t in enumerate(targets)}
        self.where = {}                          # nodeid -> (target index, seed, CheckId)
        self.outcomes = defaultdict(dict)        # nodeid -> {phase: (outcome, message, kind)}
        self.worker = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        seeds = tuple(config.getoption("--seed") or [0])
        for item in items:
            params = getattr(item, "callspec", None) and item.callspec.params
            if not params or "grpo" not in params:
                continue
            target = params["grpo"]
            self.worker = target.worker
            # a check that draws nothing from the seed (the training run) stands for every seed
            self.where[item.nodeid] = (self.index[str(target.path.resolve())],
                                       (params["seed"],) if "seed" in params else seeds, check_id(item))

    def pytest_runtest_logreport(self, report):
        if report.nodeid in self.where:
            kind = dict(report.user_properties).get("failure", "skipped" if report.skipped else "")
            self.outcomes[report.nodeid][report.when] = (report.outcome, failure_message(report), kind)

    def verdicts(self, n_targets: int) -> list:
        out = [defaultdict(dict) for _ in range(n_targets)]
        for nodeid, (target, seeds, check) in self.where.items():
            for seed in seeds:
                self.file(out[target][seed].setdefault(check, Verdict(True)), self.outcomes.get(nodeid, {}))
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
        deadline: float | None = None, checks: Path = CHECKS, echo: bool = False) -> Run:
    """Run the checks in this process against the targets; the targets run in one worker process."""
    collector = Collector(targets)
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
    sandbox_desc = (w.mode + (f" ({w.why})" if w.why else "")) if w else "none"
    return Run(code, collector.verdicts(len(targets)), load_errors, sandbox_desc, list(w.events) if w else [])


def report(r: Run, targets) -> dict:
    """A run as JSON-ready data (what `--out` holds)."""
    return {"exit_code": r.exit_code, "targets": [str(t) for t in targets], "load_errors": r.load_errors,
            "sandbox": r.sandbox, "events": r.events,
            "verdicts": [{str(seed): {str(c): asdict(v) for c, v in by_check.items()}
                          for seed, by_check in t.items()} for t in r.verdicts]}


def from_report(data: dict) -> Run:
    """The run a `report` describes."""
    verdicts = [{int(seed): {CheckId.parse(c): Verdict(**v) for c, v in by_check.items()}
                 for seed, by_check in t.items()} for t in data["verdicts"]]
    return Run(int(data["exit_code"]), verdicts, {int(k): str(m) for k, m in data["load_errors"].items()},
               str(data["sandbox"]), [str(e) for e in data["events"]])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, action="append", default=None, help="repeatable (default 0)")
    parser.add_argument("--out", required=True, help="where to write the verdicts as JSON")
    parser.add_argument("--sandbox", default="auto", choices=["auto", "bubblewrap", "process"])
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit of the worker")
    parser.add_argument("--time-limit", type=float, default=None, help="wall-clock seconds for every contract call")
    parser.add_argument("--deadline", type=float, default=None,
                        help="the same as an instant, time.monotonic() on this machine (what grade passes its judge)")
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    r = run(args.targets, args.seed or [0], sandbox=args.sandbox, memory_gb=args.memory_gb,
            time_limit=args.time_limit, deadline=args.deadline)
    Path(args.out).write_text(json.dumps(report(r, args.targets)))
    return r.exit_code


if __name__ == "__main__":
    sys.exit(main())
