"""Fixtures for the repository's own tests (the checks' plugin is the top-level conftest.py)."""
import hashlib
import os
import shutil
import subprocess

import pytest
import torch

from grpo_katas import ROOT


@pytest.fixture
def repo(tmp_path):
    """A copy of the repository's files. Its healthy runs are this repository's .cache/symptoms/: a run's key is the
    bytes of the code it ran, its settings, the kernel path and the CPU, so a copy reads back what any test made."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp_path / f)
    shared = ROOT / ".cache" / "symptoms"
    shared.mkdir(parents=True, exist_ok=True)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "symptoms").symlink_to(shared, target_is_directory=True)
    return tmp_path


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
                          "is free")


TAKEN = pytest.StashKey[tuple]()  # (the indexes of the tests this process took, how many were collected): --share


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """pytest's own loop (_pytest/main.py) over the tests this process takes (--share): it takes the next one before
    it runs this one, so that each test's teardown knows what comes after it here."""
    folder = session.config.getoption("--share")
    if folder is None or session.config.option.collectonly or session.testsfailed:
        return None  # pytest's loop: it reports collection errors
    taken = []
    session.config.stash[TAKEN] = taken, len(session.items)
    i = take(folder, session.items, 0, taken)
    while i is not None:
        after = take(folder, session.items, i + 1, taken)
        session.items[i].config.hook.pytest_runtest_protocol(
            item=session.items[i], nextitem=None if after is None else session.items[after])
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        i = after
    return True


def take(folder, items: list, start: int, taken: list) -> int | None:
    """The index of the first test from `start` on that no process sharing `folder` has taken, now taken by this one
    (a file named by its id's hash, made if absent in one atomic step) and added to `taken`, or None."""
    for i in range(start, len(items)):
        name = hashlib.sha256(items[i].nodeid.encode()).hexdigest()[:32]
        try:
            os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        taken.append(i)
        return i
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
