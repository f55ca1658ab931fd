"""grpo-katas' pytest plugin: puts the implementation under test into the `grpo` fixture.

    pytest checks                                   # judges the reference, solutions/grpo.py
    pytest checks --target path/to/grpo.py          # judges any file that implements the contract
    pytest checks --target a.py --target b.py       # several at once (make verify): one test per target

A target that cannot be imported (syntax error, import error, exit or hang at import) stops the run with one
line naming the file and line, never a collection traceback. The target and seed go in the report header, and
every check carries a pytest-timeout limit.
"""
import os
from pathlib import Path

import pytest

from grpo_katas.loader import TargetError, load_target

ROOT = Path(__file__).resolve().parent
DEFAULT_TARGET = ROOT / "solutions" / "grpo.py"
CHECK_TIMEOUT_S = int(os.environ.get("GRPO_KATAS_CHECK_TIMEOUT", "60"))  # the grader may lower it

HELP_TARGET = "Python file implementing the GRPO contract (repeatable; default: solutions/grpo.py)"
HELP_SEED = "base seed for every randomly drawn shape and value in the checks (default: 0)"

TARGETS = pytest.StashKey[dict]()  # path -> loaded module, in --target order


def pytest_addoption(parser):
    group = parser.getgroup("grpo-katas", "grpo-katas checks")
    group.addoption("--target", action="append", default=None, metavar="PATH", help=HELP_TARGET)
    group.addoption("--seed", type=int, default=0, help=HELP_SEED)


def pytest_configure(config):
    config.addinivalue_line("markers", "component(name): the contract component a check judges")
    paths = config.getoption("--target", None) or [str(DEFAULT_TARGET)]
    targets = {}
    for p in paths:
        try:
            targets[p] = load_target(p)
        except TargetError as exc:
            raise pytest.UsageError(f"cannot load the target: {exc}") from None
    config.stash[TARGETS] = targets


def pytest_report_header(config):
    targets = ", ".join(config.stash[TARGETS])
    return f"grpo-katas: target {targets} | seed {config.getoption('--seed')}"


def pytest_generate_tests(metafunc):
    if "grpo" in metafunc.fixturenames:
        targets = metafunc.config.stash[TARGETS]
        ids = [f"t{i}" for i in range(len(targets))] if len(targets) > 1 else None
        metafunc.parametrize("grpo", list(targets.values()), ids=ids, scope="session")


@pytest.fixture(scope="session")
def seed(request) -> int:
    return request.config.getoption("--seed")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(CHECK_TIMEOUT_S))
