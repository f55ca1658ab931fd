"""grpo-katas' pytest plugin: the implementation under test, as the checks' `grpo` fixture.

    pytest checks                                   # judges the reference, solutions/grpo.py
    pytest checks --target path/to/grpo.py          # judges any file that implements the contract
    pytest checks --target a.py --target b.py       # several at once (make verify): one test per target
    pytest checks --seed 1 --seed 2                 # the base seeds of the drawn shapes and values

The target is never imported here. A worker process imports it (inside a bubblewrap sandbox where one can run,
see grpo_katas/judge/sandbox.py) and every contract call a check makes runs there; only data comes back, and
every comparison and verdict is made in this process. A target that cannot be imported stops the run with one
line naming the file and line (exit status 4). The targets, seeds and sandbox go in the report header. A call
that raises, hangs (its CPU budget, or no CPU at all for a while) or kills the worker fails its check with a
message saying so; later calls of a function that hung fail at once.
"""
import gc
import inspect
import time
from pathlib import Path

import pytest

from grpo_katas.judge.sandbox import Limits, Spawned, resolve  # torch-free: the worker starts before torch loads

ROOT = Path(__file__).resolve().parent
CHECKS = ROOT / "checks"
DEFAULT_TARGET = ROOT / "solutions" / "grpo.py"

HELP_TARGET = "Python file implementing the GRPO contract (repeatable; default: solutions/grpo.py)"
HELP_SEED = "base seed of every randomly drawn shape and value in the checks (repeatable; default: 0)"
HELP_SANDBOX = ("where the targets run: auto (bubblewrap when it can run here, else a plain process), "
                "bubblewrap (refuse to run without it), process")
HELP_MEMORY = "address-space limit of the worker process, in GiB (default: 8)"
HELP_TIME = "wall-clock seconds for the whole run; contract calls after that fail at once (default: none)"
HELP_DEADLINE = ("the same as an instant: time.monotonic() on this machine (how a grader hands its judge the time "
                 "it has left, its start-up included)")

WORKER = pytest.StashKey[object]()  # a judge.client.Worker
TARGETS = pytest.StashKey[list]()


def pytest_addoption(parser):
    group = parser.getgroup("grpo-katas", "grpo-katas checks")
    group.addoption("--target", action="append", default=None, metavar="PATH", help=HELP_TARGET)
    group.addoption("--seed", action="append", type=int, default=None, help=HELP_SEED)
    group.addoption("--sandbox", choices=["auto", "bubblewrap", "process"], default="auto", help=HELP_SANDBOX)
    group.addoption("--memory-gb", type=float, default=8.0, help=HELP_MEMORY)
    group.addoption("--time-limit", type=float, default=None, help=HELP_TIME)
    group.addoption("--deadline", type=float, default=None, help=HELP_DEADLINE)


def pytest_configure(config):
    config.addinivalue_line("markers", "component(name): the contract component a check judges")
    if runs_checks(config) and resolve(config.getoption("--sandbox"))[0] == "bubblewrap":
        # the worker imports torch while this process imports it and collects the checks: it is launched before
        # anything here imports torch. A plain-process worker starts only after collection, so that this run's
        # checks are in memory before any target code runs.
        worker(config, early=True).start()
    if runs_checks(config):
        # The judge's own tensors are tiny: one thread, so that it never spins against the worker for a core
        import torch
        torch.set_num_threads(1)
        # torch is some 175,000 objects that live as long as this process: set aside from the cyclic collector, a
        # collection looks only at what the checks made (a check run of the reference: 5.3 s to 4.9 s)
        gc.freeze()


def runs_checks(config) -> bool:
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == CHECKS or CHECKS in path.parents or path in CHECKS.parents:
            return True
    return False


def worker(config, early: bool = False):
    """The run's judge.client.Worker; `early` launches its process before this process imports torch."""
    if WORKER not in config.stash:
        paths = config.getoption("--target", None) or [str(DEFAULT_TARGET)]
        targets = {f"t{i}": p for i, p in enumerate(paths)}
        limit, deadline = config.getoption("--time-limit"), config.getoption("--deadline")
        if limit is not None:  # the earlier of the two
            deadline = time.monotonic() + limit if deadline is None else min(deadline, time.monotonic() + limit)
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            raise pytest.UsageError(f"cannot load the target: {missing[0]}: no such file")
        limits = Limits(memory_gb=config.getoption("--memory-gb"))
        try:
            spawned = Spawned(targets, config.getoption("--sandbox"), limits) if early else None
            from grpo_katas.judge.client import Target, Worker
            w = Worker(targets, sandbox_mode=config.getoption("--sandbox"), limits=limits,
                       deadline=deadline, spawned=spawned)
        except (RuntimeError, ValueError) as exc:
            raise pytest.UsageError(str(exc)) from None
        config.stash[WORKER] = w
        config.stash[TARGETS] = [Target(w, k, Path(p)) for k, p in targets.items()]
    return config.stash[WORKER]


def pytest_unconfigure(config):
    if WORKER in config.stash:
        config.stash[WORKER].close()


def pytest_report_header(config):
    if WORKER not in config.stash:
        return None
    w = config.stash[WORKER]
    sandbox = w.mode + (f" ({w.why})" if w.why else "")
    seeds = ", ".join(str(s) for s in config.getoption("--seed") or [0])
    return f"grpo-katas: target {', '.join(map(str, w.targets.values()))} | seed {seeds} | sandbox {sandbox}"


def pytest_generate_tests(metafunc):
    if CHECKS not in Path(metafunc.definition.path).parents:
        return
    if "grpo" in metafunc.fixturenames:
        worker(metafunc.config)
        targets = metafunc.config.stash[TARGETS]
        ids = [t.key for t in targets] if len(targets) > 1 else None
        metafunc.parametrize("grpo", targets, ids=ids, scope="session")
    if "seed" in metafunc.fixturenames:
        seeds = metafunc.config.getoption("--seed") or [0]
        metafunc.parametrize("seed", seeds, ids=[f"s{s}" for s in seeds] if len(seeds) > 1 else None,
                             scope="session")


def pytest_collection_finish(session):
    """While the worker starts (importing torch takes it seconds), rehearse the checks to be run, so that the
    oracle's answers are ready when they are; then wait for the worker and its targets."""
    config = session.config
    if WORKER not in config.stash or not any("grpo" in getattr(i, "fixturenames", ()) for i in session.items):
        return
    w = config.stash[WORKER]
    if w.proc is None:
        w.start()  # a plain-process worker: now that this run's checks are in memory
    if not config.option.collectonly and not w.out_of_time():
        from checks.stubs import rehearse
        rehearse(rehearsals(session.items))
    w.ready()
    if w.load_errors and len(w.load_errors) == len(w.targets):
        key, message = next(iter(w.load_errors.items()))
        pytest.exit(f"cannot load the target {w.targets[key]}: {message}", returncode=4)


def rehearsals(items) -> list:
    """(check function, its arguments but `grpo`) for each distinct check and draw among the items; checks that
    take fixtures other than their parameters are left out."""
    out = {}
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        names = inspect.signature(item.function).parameters
        if params and "grpo" in params and all(n in params for n in names):
            kwargs = {n: params[n] for n in names if n != "grpo"}
            out.setdefault((item.function, tuple(kwargs.items())), (item.function, kwargs))
    return list(out.values())


def pytest_runtest_setup(item):
    """Once the run's time limit has passed, a check fails at once instead of working out its oracle's answers:
    a grader that kills the judge soon after the limit then still gets a verdict on every check."""
    w = item.config.stash.get(WORKER, None)
    if w is not None and "grpo" in item.fixturenames and w.out_of_time():
        from grpo_katas.judge.client import CallFailed
        raise CallFailed("not run: the time limit for the whole run ran out")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Record how a failure came about: the check's own assertion, a contract call that failed (raised, hung,
    crashed), or an exception in the checks' own code (a defect of the checks, which `make verify` refuses)."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and report.failed:
        e = call.excinfo
        from grpo_katas.judge.client import CallFailed
        kind = "call" if e.errisinstance(CallFailed) else \
            "assertion" if e.errisinstance((AssertionError, pytest.fail.Exception)) else "error"
        report.user_properties.append(("failure", kind))
