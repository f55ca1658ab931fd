"""Fixtures for the repository's own tests (the checks' plugin is the top-level conftest.py)."""
import shutil
import subprocess

import pytest
import torch

from grpo_katas import ROOT


@pytest.fixture
def repo(tmp_path):
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp_path / f)
    return tmp_path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models and tensors: one intra-op thread is faster, and steadier on a busy machine, than a thread pool.
    A module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_terminal_summary(terminalreporter):
    """A test file skipped whole (tests/test_hf.py without the hf extra) says why in one line; pytest -q would
    only count it."""
    for report in terminalreporter.stats.get("skipped", []):
        if "::" not in report.nodeid and isinstance(report.longrepr, tuple):
            terminalreporter.write_line(f"{report.nodeid} skipped: {report.longrepr[2].removeprefix('Skipped: ')}")
