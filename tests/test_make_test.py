"""`make test` (tests/__main__.py): the proof runs niced beside the other parts, its report comes last, and the exit
status is the first failure. Tiny commands stand in for the tests, the checks and the proof. CI (.ci/run) runs make
test, then the whole proof and the slow tests, and .ci/measure times each of its commands.
Run: pytest tests/test_make_test.py"""
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from grpo_katas import ROOT
from tests.__main__ import run


def py(code: str) -> list:
    return [sys.executable, "-c", code]


PROOF = py("import os, time; time.sleep(0.5); print('proof', 'report', 'niceness', os.nice(0))")


@pytest.mark.parametrize("codes, expected", [((0, 0, 0), 0), ((1, 0, 0), 1), ((0, 4, 0), 4), ((0, 0, 3), 3),
                                             ((5, 4, 3), 5)])
def test_the_first_failure_is_the_exit_status(tmp_path, capfd, codes, expected):
    tests, checks, proof = codes
    parts = [("the tests", [py(f"print('tests', 'ran'); raise SystemExit({tests})")]),
             ("the checks on the reference", [py(f"print('checks', 'ran'); raise SystemExit({checks})")])]
    assert run(parts, PROOF[:-1] + [PROOF[-1] + f"; raise SystemExit({proof})"], cwd=tmp_path) == expected
    out = capfd.readouterr().out
    assert out.index("tests ran") < out.index("checks ran") < out.index("proof report")
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("make test: the tests") and "the proof's static tier" in summary
    assert ("passed" if expected == 0 else f"exit {expected}") in summary and summary.endswith("CPU-s in all")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("codes, expected", [((0, 0), 0), ((0, 2), 2), ((1, 2), 1)])
def test_workers_run_side_by_side_and_report_in_order(tmp_path, capfd, codes, expected):
    # the first worker waits for the second's file: run in turn, it would wait forever (the timeout below)
    first = py(f"import os, time; exec('while not os.path.exists(\\'second\\'): time.sleep(0.01)'); "
               f"print('first', 'worker'); raise SystemExit({codes[0]})")
    second = py(f"open('second', 'w'); print('second', 'worker'); raise SystemExit({codes[1]})")
    assert run([("the tests", [first, second])], py("pass"), cwd=tmp_path) == expected
    out = capfd.readouterr().out
    assert out.index("first worker") < out.index("second worker")


def two_workers(folder, test_file: str) -> list:
    """The output of two pytest processes given one --share folder, as make test starts them, over `test_file` in
    `folder` with this repository's tests/conftest.py beside it; both must pass."""
    (folder / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    share = folder / "share"
    share.mkdir()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--share={share}", test_file]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the conftest imports from this repository's tests/
    workers = [subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [w.communicate(timeout=60)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outs
    return outs


def test_workers_that_share_a_folder_run_each_test_once(tmp_path):
    """Two pytest processes given one --share folder, as make test starts them: each test runs in one of them."""
    (tmp_path / "test_many.py").write_text(
        "import os, time\nimport pytest\n\n@pytest.mark.parametrize('n', range(12))\n"
        "def test_one(n):\n    open(f'ran-{n}-{os.getpid()}', 'w').close()\n    time.sleep(0.05)\n")
    outs = two_workers(tmp_path, "test_many.py")
    ran = [f.name.split("-") for f in tmp_path.glob("ran-*")]
    assert sorted(int(n) for _, n, _ in ran) == list(range(12))  # every test once
    taken = [int(re.search(r"this worker took (\d+) of the 12 tests", out)[1]) for out in outs]
    assert sum(taken) == 12 and len({pid for *_, pid in ran}) == sum(t > 0 for t in taken)


def test_a_sharing_worker_names_each_failure_on_stderr_as_it_happens(tmp_path, capfd):
    """make test replays a second worker's report when it ends: a run cut short (CI's time limit) would lose which of
    its tests failed, so each worker names its failures on stderr at once, which is not held back."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_two.py").write_text("import time\n\ndef test_fails():\n    assert False\n\n"
                                         "def test_waits():\n    time.sleep(30)\n")
    (tmp_path / "share").mkdir()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--share={tmp_path / 'share'}",
           "test_two.py"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:  # cut short while its second test runs, as CI's limit would: the failure was named before
        assert worker.stderr.readline().strip() == "FAILED test_two.py::test_fails (call)"
    finally:
        worker.kill()
        worker.communicate()


def test_the_tests_of_a_module_scoped_fixture_run_in_one_worker_which_sets_it_up_once(tmp_path):
    """A module's costly fixture (the hostile grading suite is minutes) is set up by one worker, not by each."""
    (tmp_path / "test_shared.py").write_text(
        "import os, time\nimport pytest\n\n@pytest.fixture(scope='module')\ndef costly():\n"
        "    open(f'setup-{os.getpid()}', 'w').close()\n    return 1\n\n"
        "@pytest.mark.parametrize('n', range(6))\ndef test_uses_it(costly, n):\n    time.sleep(0.05)\n\n"
        "@pytest.mark.parametrize('n', range(6))\ndef test_alone(n):\n    time.sleep(0.05)\n")
    outs = two_workers(tmp_path, "test_shared.py")
    assert len(list(tmp_path.glob("setup-*"))) == 1  # one worker set the fixture up
    taken = [int(re.search(r"this worker took (\d+) of the 12 tests", out)[1]) for out in outs]
    assert sum(taken) == 12 and max(taken) >= 6


def test_tests_of_a_module_that_use_other_module_scoped_fixtures_are_a_group_apart():
    """The tests that need only test_grade.py's copy of the repository do not wait behind the hostile suite that
    uses it too: a group is a module's tests that use the same module-scoped fixtures."""
    from types import SimpleNamespace

    from tests.conftest import together

    def item(nodeid, *scoped):
        defs = {name: [SimpleNamespace(scope="module")] for name in scoped}
        return SimpleNamespace(nodeid=nodeid, _fixtureinfo=SimpleNamespace(
            name2fixturedefs={**defs, "tmp_path": [SimpleNamespace(scope="function")]}))
    items = [item("t.py::a", "repo", "hostile"), item("t.py::b", "repo"), item("t.py::c", "repo", "hostile"),
             item("t.py::d"), item("u.py::e", "repo")]
    assert together(items) == [[0, 2], [1], [3], [4]]


def test_the_proof_runs_beside_the_tests_at_a_lower_priority(tmp_path, capfd):
    parts = [("the tests", [py("import time; time.sleep(0.2)")])]
    assert run(parts, PROOF, cwd=tmp_path) == 0
    out = capfd.readouterr().out
    assert "waiting for the proof" in out  # the proof (0.5 s) was still running when the tests (0.2 s) ended
    assert int(out.rsplit("niceness", 1)[1].split()[0]) == min(os.nice(0) + 10, 19)  # 19 is the lowest priority


def test_the_slow_tests_run_without_a_proof_beside_them_and_say_so(tmp_path, capfd):
    parts = [("the slow tests", [py("print('slow', 'ran'); raise SystemExit(1)"), py("print('other', 'ran')")])]
    assert run(parts, None, cwd=tmp_path, name="the slow tests") == 1
    out = capfd.readouterr().out
    assert "proof" not in out and out.index("slow ran") < out.index("other ran")
    assert out.strip().splitlines()[-1].startswith("the slow tests: the slow tests ")


def test_make_test_and_the_slow_tests_share_their_tests_out_over_the_same_workers():
    from tests.__main__ import WORKERS, slow_steps, steps
    fast, slow = steps([], "F")[0][1], slow_steps([], "S")[0][1]
    assert len(fast) == len(slow) == WORKERS
    assert all(c[c.index("-m", 3) + 1] == "not slow" and "--share=F" in c for c in fast)
    assert all(c[c.index("-m", 3) + 1] == "slow" and "--share=S" in c for c in slow)


def ci_measure():
    loader = importlib.machinery.SourceFileLoader("ci_measure", str(ROOT / ".ci" / "measure"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_ci_runs_make_test_then_the_whole_proof_fresh_then_the_slow_tests_and_measure_times_each():
    measure = ci_measure()
    setup, rest = measure.split_setup(measure.ci_commands(ROOT / ".ci" / "run"))
    # tests/test_hf.py and tests/test_platforms.py run in make test's own environment, with the hf and ci extras
    assert [c.split("&&")[0].strip() for c in setup] == ["make setup"] and "'.[hf,ci]'" in setup[0]
    assert rest[:3] == ["make test", "make verify FRESH=1", ".venv/bin/python -m tests --slow"]
    extras = rest[3]
    assert len(rest) == 4 and "'.[dev,hf,plot]'" in extras and extras.endswith("pytest -q -p no:cacheprovider -m plot tests")
    every = re.findall(r"^(\w+) = \[", (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
                       .split("\n[")[0], re.M)
    installed = {extra for group in re.findall(r"'\.\[([\w,]+)\]'", " ".join(setup + rest)) for extra in group.split(",")}
    assert sorted(every) == ["ci", "dev", "hf", "plot"] and set(every) <= installed, (every, installed)  # and CI installs it
    assert measure.split_setup(["make test"]) == (["make setup"], ["make test"])


def test_every_test_that_skips_without_matplotlib_is_marked_for_ci_s_environment_of_extras():
    import ast
    for path in (ROOT / "tests").glob("test_*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            skips = any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "importorskip" and n.args and
                        getattr(n.args[0], "value", None) == "matplotlib" for n in ast.walk(fn))
            marked = any(ast.unparse(d) == "pytest.mark.plot" for d in fn.decorator_list)
            assert marked or not skips, f"{path.name}::{fn.name} needs matplotlib: mark it @pytest.mark.plot"


def test_measure_gives_each_command_its_wall_and_cpu_seconds(tmp_path, capfd):
    burn = "python3 -c 'import time; t = time.process_time(); exec(\"while time.process_time() - t < 0.3: pass\")'"
    with open(tmp_path / "log", "w") as log:
        code, wall, cpu, busy = ci_measure().timed(f"{burn}; echo 'make test: done'; exit 3", tmp_path, log)
    assert code == 3 and cpu >= 0.3 and wall >= cpu - 0.05 and busy >= 0.25
    assert "make test: done" in capfd.readouterr().out and "make test: done" in (tmp_path / "log").read_text()


def test_measure_projects_ci_at_twice_the_catalogue_by_doubling_the_proof_alone():
    line = ci_measure().projection(["make setup", "make test", "make verify FRESH=1", ".venv/bin/python -m tests --slow"],
                                   [45.0, 200.0, 1000.0, 300.0])
    assert line.startswith("at twice the catalogue: 2545 s (42.4 min), the proof 2000 s of it") and "the rest 545 s" in line
