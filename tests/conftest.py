"""Fixtures for the repository's own tests (the checks' plugin is the top-level conftest.py)."""
import hashlib
import os
import sys

import pytest
import torch

from tests.cli_helpers import private_copy


@pytest.fixture
def repo(tmp_path):
    """A copy of the repository's files. Its healthy runs are this repository's .cache/symptoms/: a run's key is the
    bytes of the code it ran, its settings, the kernel path and the CPU, so a copy reads back what any test made."""
    return private_copy(tmp_path, shared_runs=True)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models and tensors: one intra-op thread is faster, and steadier on a busy machine, than a thread pool.
    A module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_addoption(parser):
    parser.addoption("--share", metavar="FOLDER", default=None,
                     help="run only the tests that no other pytest given the same FOLDER has taken, each taken as this "
                          "one comes to it: make test's workers share the tests out so, the next free test to whichever "
                          "is free (the tests of a module that share a module-scoped fixture go together)")


TAKEN = pytest.StashKey[tuple]()  # (the indexes of the tests this process took, how many were collected): --share


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """With --share, each failure is named on stderr as it happens: make test holds a second worker's report until
    it ends, so a run cut short (CI's time limit) would otherwise not say which of its tests failed."""
    report = yield
    if report.failed and item.config.getoption("--share") is not None:
        print(f"FAILED {report.nodeid} ({report.when})", file=sys.__stderr__, flush=True)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """pytest's own loop (_pytest/main.py) over the tests this process takes (--share), a group at a time: it takes
    the next group before it runs this one, so that each test's teardown knows what comes after it here."""
    folder = session.config.getoption("--share")
    if folder is None or session.config.option.collectonly or session.testsfailed:
        return None  # pytest's loop: it reports collection errors
    taken = []
    session.config.stash[TAKEN] = taken, len(session.items)
    groups = together(session.items)
    g = take(folder, session.items, groups, 0, taken)
    while g is not None:
        after = take(folder, session.items, groups, g + 1, taken)
        for i, nxt in zip(groups[g], groups[g][1:] + [None if after is None else groups[after][0]]):
            session.items[i].config.hook.pytest_runtest_protocol(
                item=session.items[i], nextitem=None if nxt is None else session.items[nxt])
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        g = after
    return True


def together(items: list) -> list:
    """The tests in groups that one process runs whole, the largest first (then in the order collected), so that no
    process is left with a long group at the end: the tests of a module that use the same module-scoped fixtures
    go together (two processes would each set them up, the hostile grading suite's minutes among them), apart from
    those of the module that use others (the tests that need only test_grade.py's copy of the repository do not
    wait behind the hostile suite that also uses it); every other test is a group of its own."""
    groups, by_module = [], {}
    for i, item in enumerate(items):
        info = getattr(item, "_fixtureinfo", None)
        scoped = frozenset(name for name, defs in (info.name2fixturedefs.items() if info else ())
                           if defs and defs[-1].scope == "module")
        if not scoped:
            groups.append([i])
            continue
        key = item.nodeid.split("::")[0], scoped
        if key not in by_module:
            by_module[key] = []
            groups.append(by_module[key])
        by_module[key].append(i)
    return sorted(groups, key=len, reverse=True)


def take(folder, items: list, groups: list, start: int, taken: list) -> int | None:
    """The index of the first group from `start` on that no process sharing `folder` has taken, now taken by this
    one (a file named by its first test's id hash, made if absent in one atomic step) and its tests added to
    `taken`; None when none is left."""
    for g in range(start, len(groups)):
        name = hashlib.sha256(items[groups[g][0]].nodeid.encode()).hexdigest()[:32]
        try:
            os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        taken.extend(groups[g])
        return g
    return None


def pytest_terminal_summary(terminalreporter, config):
    """A test file skipped whole (tests/test_hf.py without the hf extra) says why in one line; pytest -q would
    only count it. With --share, how many of the tests this process ran."""
    if TAKEN in config.stash:
        taken, total = config.stash[TAKEN]
        terminalreporter.write_line(f"this worker took {len(taken)} of the {total} tests, the others the rest")
    for report in terminalreporter.stats.get("skipped", []):
        if "::" not in report.nodeid and isinstance(report.longrepr, tuple):
            terminalreporter.write_line(f"{report.nodeid} skipped: {report.longrepr[2].removeprefix('Skipped: ')}")
