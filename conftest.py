"""grpo-katas' pytest plugin: puts the implementation under test into the `grpo` fixture.

    pytest checks                                   # judges the reference, solutions/grpo.py
    pytest checks --target path/to/grpo.py          # judges any file that implements the contract
    pytest checks --target a.py --target b.py       # several at once (make verify): one test per target

A target that cannot be imported (syntax error, import error, exit or hang at import) stops the run with one
line naming the file and line, never a collection traceback. The target and seed go in the report header, and
every check carries a pytest-timeout limit.
"""
import hashlib
import importlib.util
import os
import signal
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
DEFAULT_TARGET = ROOT / "solutions" / "grpo.py"
CHECK_TIMEOUT_S = 60
IMPORT_TIMEOUT_S = 30

HELP_TARGET = "Python file implementing the GRPO contract (repeatable; default: solutions/grpo.py)"
HELP_SEED = "base seed for every randomly drawn shape and value in the checks (default: 0)"


TARGETS = pytest.StashKey[dict]()  # path -> loaded module, in --target order


class TargetError(Exception):
    """A target file that cannot be loaded; the message names the file and line."""


def pytest_addoption(parser):
    group = parser.getgroup("grpo-katas", "grpo-katas checks")
    group.addoption("--target", action="append", default=None, metavar="PATH", help=HELP_TARGET)
    group.addoption("--seed", type=int, default=0, help=HELP_SEED)


def _where(exc: BaseException, path: Path) -> str:
    """file:line of the deepest frame inside the target file (or of the syntax error)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else str(path)


def _on_alarm(signum, frame):
    raise TimeoutError(f"importing it took longer than {IMPORT_TIMEOUT_S} s")


def load_target(path) -> object:
    """Import a file as a fresh module, turning every way it can fail into one TargetError line."""
    path = Path(path).resolve()
    if not path.is_file():
        raise TargetError(f"{path}: no such file")
    name = "grpo_target_" + hashlib.sha1(str(path).encode()).hexdigest()[:10]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(IMPORT_TIMEOUT_S)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise TargetError(f"{_where(exc, path)}: the file exits at import (SystemExit({exc.code!r}))") from None
    except BaseException as exc:  # a broken submission can raise anything, KeyboardInterrupt included
        detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise TargetError(f"{_where(exc, path)}: {type(exc).__name__}: {detail}") from None
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    sys.modules[name] = module
    return module


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
