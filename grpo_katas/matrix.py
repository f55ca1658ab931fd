"""Run the hidden checks against one or many targets in a single pytest process and record, per target, which
checks passed. A check is `component::name`; it fails for a target if any of its draws fails or errors.

    python -m grpo_katas.matrix --seed 0 --out results.json target.py [target.py ...]

The verdicts come from pytest's own reports (a plugin hook), never from what the targets print.
"""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from grpo_katas import CHECKS
from grpo_katas.tripwire import Tripwire, foreign_origins


def check_id(item) -> str:
    component = item.get_closest_marker("component").args[0]
    return f"{component}::{item.originalname.removeprefix('test_')}"


class Collector:
    """Per target index and check: passed (bool) and the first failure's message."""

    def __init__(self, targets, forbidden=()):
        self.index = {str(Path(t).resolve()): i for i, t in enumerate(targets)}
        self.ids = {}
        self.results = defaultdict(dict)
        self.tripwire = Tripwire()  # before pytest imports any target
        self.forbidden = [Path(f).resolve() for f in forbidden]
        self.foreign = []

    def pytest_collection_modifyitems(self, items):
        modules = {}
        for item in items:
            module = item.callspec.params["grpo"]
            modules[module.__name__] = module
            self.ids[item.nodeid] = (self.index[str(Path(module.__file__).resolve())], check_id(item))
        if self.forbidden:
            for module in modules.values():
                self.foreign += foreign_origins(module, self.forbidden)
        self.tripwire.check()

    def pytest_runtest_teardown(self, item):
        self.tripwire.check()

    def pytest_runtest_logreport(self, report):
        if report.nodeid not in self.ids or (report.when != "call" and report.passed):
            return
        target, check = self.ids[report.nodeid]
        entry = self.results[target].setdefault(check, {"passed": True, "message": ""})
        if report.failed and entry["passed"]:
            entry["passed"] = False
            entry["message"] = failure_message(report)


def failure_message(report) -> str:
    """The assertion's own message (the symptom), without the traceback."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = text.removeprefix("AssertionError: ").removeprefix("Failed: ")
    return text.split("\nassert ")[0].strip()


def run(targets, seed: int, extra=(), checks=CHECKS, forbidden=()) -> tuple:
    """(exit code, [{check: {passed, message}} per target], collector). Runs in this process."""
    collector = Collector(targets, forbidden)
    root = Path(checks).resolve().parent
    args = [str(checks), "-q", "-p", "no:cacheprovider", "--rootdir", str(root), f"--seed={seed}",
            "--no-header", "-o", "console_output_style=classic", *extra]
    args += [f"--target={t}" for t in targets]
    code = pytest.main(args, plugins=[collector])
    collector.tripwire.check()
    return int(code), [collector.results.get(i, {}) for i in range(len(targets))], collector


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checks", default=str(CHECKS), help="the checks folder (its parent holds the conftest)")
    parser.add_argument("--forbid", action="append", default=[], help="a folder the targets must not load from")
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    code, results, collector = run(args.targets, args.seed, extra=["--tb=no"], checks=args.checks,
                                   forbidden=args.forbid)
    report = {"exit_code": code, "targets": args.targets, "results": results,
              "tampered": collector.tripwire.tampered, "foreign": collector.foreign}
    with open(args.out, "w") as f:
        json.dump(report, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
