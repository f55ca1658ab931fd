"""Fixtures for the repository's own tests (the checks' plugin is the top-level conftest.py)."""
import re
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
    parser.addoption("--shard", metavar="I/K", default=None,
                     help="run every K-th test only, starting from the I-th (0 <= I < K): make test runs K side by side")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs: the shards split what is left
def pytest_collection_modifyitems(config, items):
    if config.getoption("--shard"):
        mine = shard(items, config.getoption("--shard"))
        kept = set(map(id, mine))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = mine


def shard(items: list, spec: str) -> list:
    """The I-th of K shards of the items (spec "I/K"): every K-th one, from the I-th."""
    m = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not m or int(m[1]) >= int(m[2]):
        raise pytest.UsageError(f"--shard takes I/K with 0 <= I < K, such as 0/2; got {spec!r}")
    return items[int(m[1])::int(m[2])]


def pytest_terminal_summary(terminalreporter):
    """A test file skipped whole (tests/test_hf.py without the hf extra) says why in one line; pytest -q would
    only count it."""
    for report in terminalreporter.stats.get("skipped", []):
        if "::" not in report.nodeid and isinstance(report.longrepr, tuple):
            terminalreporter.write_line(f"{report.nodeid} skipped: {report.longrepr[2].removeprefix('Skipped: ')}")
