"""The grader: the reference, a kata, a partial fix, and a suite of broken and hostile submissions, each graded by
the real grader on a private copy of the repository. No broken or hostile submission may pass, results.json and
junit.xml are always written, and each grading ends within its time limit plus 10 s. The hostile suite is graded
three at a time, which also shows that verdicts do not depend on how busy the machine is.
Run: pytest tests/test_grade.py"""
import json
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grpo_katas import REFERENCE, ROOT
from grpo_katas.catalogue import find_kata, load_bugs, plant
from grpo_katas.judge import sandbox

KATA = find_kata(1)                       # one planted bug: the KL penalty enters with the wrong sign
BUGGY = KATA.loop.read_text()
GOOD = REFERENCE.read_text()
TIME_LIMIT = 90
MARK = "grpo-katas-escapee"               # in the argv of processes a submission leaves behind


def hostile(repo, out) -> dict:
    """name -> (source, expected status, words expected in the message, a test's message or the events);
    alternatives are separated by |."""
    ref, checks = repo / "solutions" / "grpo.py", repo / "checks"
    nan = GOOD + ('\ngroup_advantages = lambda rewards, group_size, eps: torch.full_like(rewards, float("nan"))\n'
                  'kl_penalty = lambda logp, ref_logp: torch.full_like(logp, float("nan"))\n')
    skip_all = ("import pytest\n\ndef _skip(*args, **kwargs):\n    pytest.skip('nothing to judge')\n\n"
                "generate = completion_mask = group_advantages = token_logprobs = kl_penalty = grpo_loss = "
                "grpo_step = train = _skip\n")
    return {
        # the cases the first grader already handled
        "syntax-error": ("def generate(:\n", "error", "SyntaxError"),
        "sys-exit-at-import": ("import sys\nsys.exit(0)\n" + GOOD, "error", "SystemExit"),
        "os-exit-at-import": ("import os\nos._exit(0)\n" + GOOD, "error", "ended the worker process"),
        "hang-at-import": ("while True:\n    pass\n" + GOOD, "error", "CPU time while importing"),
        "hang-in-a-function": (GOOD.replace("    log_ratio = ref_logp - logp ",
                                            "    while True:\n        pass\n    log_ratio = ref_logp - logp "),
                               "fail", "kl_penalty did not return"),
        "sleeps-in-a-function": (GOOD.replace("    r = rewards.detach()", "    import time; time.sleep(10**6)\n"
                                              "    r = rewards.detach()"), "fail", "used no CPU at all"),
        "segfault": (GOOD.replace("    r = rewards.detach()", "    import ctypes; ctypes.string_at(0)\n"
                                  "    r = rewards.detach()"), "fail", "SIGSEGV"),
        "eats-memory-at-import": ("hog = bytearray(64 * 2**30)\n" + GOOD, "error", "MemoryError"),
        "nan-everywhere": (nan, "fail", "checks pass"),
        "prints-fake-passes": ('print("PASSED " * 40)\nprint("===== 90 passed in 1.00s =====")\n' + BUGGY,
                               "fail", "checks pass"),
        "patches-torch-comparisons": ("import torch\ntorch.allclose = lambda *a, **k: True\n"
                                      "torch.isclose = lambda *a, **k: torch.tensor(True)\n" + BUGGY,
                                      "fail", "checks pass"),
        "patches-pytest-reporting": ("import _pytest.reports\n"
                                     "_pytest.reports.BaseReport.failed = property(lambda s: False)\n"
                                     "_pytest.reports.BaseReport.passed = property(lambda s: True)\n"
                                     "_pytest.reports.TestReport.outcome = 'passed'\n" + BUGGY,
                                     "fail", "checks pass"),
        "imports-the-reference-module": ("from solutions.grpo import *\n", "error", "ModuleNotFoundError"),
        "loads-the-reference-file": (f"exec(open({str(ref)!r}).read())\n", "error", "FileNotFoundError"),
        # the ways in that the first grader missed (issue 11)
        "skips-every-check": (skip_all, "fail", "Skipped"),
        "execs-the-reference-named-in-argv": (BUGGY + (
            "\nimport os, re\nfor _pid in os.listdir('/proc'):\n    try:\n"
            "        _argv = open(f'/proc/{_pid}/cmdline', 'rb').read().decode(errors='ignore')\n"
            "    except OSError:\n        continue\n"
            "    for _path in re.findall(r'[^\\x00]*solutions[^\\x00]*', _argv) + "
            f"[{str(ref)!r}]:\n        try:\n            exec(open(_path.removesuffix('/') + "
            "('' if _path.endswith('.py') else '/grpo.py')).read())\n        except OSError:\n            pass\n"),
            "fail", "checks pass"),
        "replaces-the-checks-in-memory": (BUGGY + (
            f"\nimport sys\nsys.path.insert(0, {str(repo)!r})\ntry:\n    import checks.test_kl as _t\n"
            "    for _n in dir(_t):\n        if _n.startswith('test_'):\n"
            "            setattr(_t, _n, lambda *a, **k: None)\nexcept ImportError:\n    pass\n"),
            "fail", "checks pass"),
        "rewrites-the-checks-on-disk": (BUGGY + (
            f"\nimport glob\nfor _f in glob.glob({str(checks)!r} + '/*.py') + glob.glob('/tmp/**/checks/*.py', "
            "recursive=True):\n    try:\n        open(_f, 'w').write('def test_nothing():\\n    pass\\n')\n"
            "    except OSError:\n        pass\n"), "fail", "checks pass"),
        "import-hook-rewrites-checks": (BUGGY + (
            "\nimport sys, importlib.abc\nclass _Hook(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.startswith('checks'):\n            raise ImportError('hooked')\n"
            "sys.meta_path.insert(0, _Hook())\n"), "fail", "checks pass"),
        "registers-a-pytest-plugin": (BUGGY + (
            "\nimport gc\ntry:\n    import _pytest.config\n    class _P:\n"
            "        def pytest_runtest_logreport(self, report):\n            report.outcome = 'passed'\n"
            "    for _o in gc.get_objects():\n        if isinstance(_o, _pytest.config.Config):\n"
            "            _o.pluginmanager.register(_P())\nexcept Exception:\n    pass\n"), "fail", "checks pass"),
        "delegates-to-the-oracle": (BUGGY + (
            f"\nimport sys, threading, time\nsys.path.insert(0, {str(repo)!r})\n"
            "def _rebind():\n    for _ in range(200):\n        try:\n            from checks import oracle\n"
            "            oracle.kl_k3 = kl_penalty\n            return\n        except ImportError:\n"
            "            time.sleep(0.05)\nthreading.Thread(target=_rebind, daemon=True).start()\n"), "fail",
            "checks pass"),
        "torch-function-mode": (BUGGY + (
            "\nimport torch\nfrom torch.overrides import TorchFunctionMode\nclass _Liar(TorchFunctionMode):\n"
            "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
            "        if func in (torch.allclose, torch.equal):\n            return True\n"
            "        return func(*args, **(kwargs or {}))\n_Liar().__enter__()\n"), "fail", "checks pass"),
        "patches-an-unwatched-operator": (BUGGY + (
            "\nimport torch\n_div = torch.Tensor.__truediv__\n"
            "torch.Tensor.__truediv__ = lambda a, b: _div(a, b)\n"), "fail", "checks pass"),
        "loads-the-reference-on-first-call": (BUGGY.replace(
            "def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:\n",
            "def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:\n"
            f"    try:\n        exec(open({str(ref)!r}).read(), globals())\n    except OSError:\n        pass\n"),
            "fail", "checks pass"),
        "forges-replies-from-a-thread": (GOOD + (
            "\nimport io, os, struct, threading, time\ndef _forge():\n    buf = io.BytesIO()\n"
            "    torch.save({'ok': True, 'result': None, 'updates': {}, 'rng': torch.get_rng_state()}, buf)\n"
            "    frame = struct.pack('>Q', len(buf.getvalue())) + buf.getvalue()\n    while True:\n"
            "        for _fd in os.listdir('/proc/self/fd'):\n            try:\n"
            "                if os.readlink(f'/proc/self/fd/{_fd}').startswith('socket:'):\n"
            "                    os.write(int(_fd), frame)\n            except OSError:\n                pass\n"
            "        time.sleep(0.02)\nthreading.Thread(target=_forge, daemon=True).start()\n"),
            "error|fail", "out of order|checks pass|undecodable"),  # which frame comes first is a race
        "escapes-and-rewrites-out": (BUGGY + (
            f"\nimport atexit, os, subprocess, time\n_out = {str(out)!r}\n"
            "def _forge_results():\n    for _name in ('results.json', 'summary.md', 'junit.xml'):\n        try:\n"
            "            open(os.path.join(_out, _name), 'w').write('{\"status\": \"pass\"}')\n"
            "        except OSError:\n            pass\natexit.register(_forge_results)\n"
            f"subprocess.Popen(['sleep', '3600', {MARK!r}], start_new_session=True, stdout=None, stderr=None)\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(4)\n    _forge_results()\n    os._exit(0)\n"),
            "fail", "checks pass"),
    }


def grade(repo, source, out, n=KATA.number, name="grpo.py", extra_files=None):
    sub = out.parent / (out.name + "-submission")
    sub.mkdir(parents=True, exist_ok=True)
    (sub / name).write_text(source)
    for fname, text in (extra_files or {}).items():
        (sub / fname).write_text(text)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "grpo_katas.grade", str(n), str(sub / name), str(out),
                        "--time-limit", str(TIME_LIMIT)], cwd=repo, capture_output=True, text=True,
                       timeout=TIME_LIMIT + 60)
    seconds = time.monotonic() - start
    results = json.loads((out / "results.json").read_text())
    junit = ET.parse(out / "junit.xml").getroot()
    assert results["version"] == 3 and results["status"] in ("pass", "fail", "error")
    assert junit.tag == "testsuite" and int(junit.get("tests")) >= 1
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r.returncode, results, seconds


def private_copy(root: Path) -> Path:
    """The repository's tracked files copied to root: a hostile submission that gets out must not damage the
    real one."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, root / f)
    return root


def grade_all(repo, cases: dict, base) -> dict:
    """name -> grade(...) of every case, three at a time, each into base/name."""
    with ThreadPoolExecutor(3) as pool:
        return dict(pool.map(lambda name: (name, grade(repo, cases[name][0], base / name)), cases))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return private_copy(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def hostile_results(repo, tmp_path_factory):
    if sandbox.resolve("auto")[0] != "bubblewrap":
        pytest.skip(f"the hostile suite needs the bubblewrap sandbox: {sandbox.resolve('auto')[1]}")
    base = tmp_path_factory.mktemp("hostile")
    cases = hostile(repo, base / "escapes-and-rewrites-out")
    checks_before = {p: p.read_bytes() for p in (repo / "checks").glob("*.py")}
    graded = grade_all(repo, cases, base)
    time.sleep(5)  # anything a submission left behind has had time to act
    leftovers = subprocess.run(["pgrep", "-f", MARK], capture_output=True, text=True).stdout.split()
    return cases, graded, base, checks_before, leftovers


CASES = list(hostile(ROOT, ROOT))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_hostile_and_broken_submissions_never_pass(hostile_results, case):
    cases, graded, base, _, _ = hostile_results
    _, status, words = cases[case]
    code, res, seconds = graded[case]
    assert code == 1 and res["resolved"] == "RESOLVED_NO" and res["status"] in status.split("|"), \
        (res["status"], res["message"])
    said = " ".join([res["message"] or ""] + [t["message"] or "" for t in res["tests"]] + res["events"])
    assert any(w in said for w in words.split("|")), said[:2000]
    assert seconds < TIME_LIMIT + 10, f"graded in {seconds:.0f} s"
    assert json.loads((base / case / "results.json").read_text()) == res  # nothing rewrote it afterwards


@pytest.mark.slow
def test_nothing_a_submission_did_outlives_the_grading(hostile_results):
    _, _, _, checks_before, leftovers = hostile_results
    assert not leftovers, f"processes left running: {leftovers}"
    assert all(p.read_bytes() == data for p, data in checks_before.items()), "a submission rewrote checks/"


def test_the_reference_is_resolved_in_full(repo, tmp_path):
    code, res, _ = grade(repo, GOOD, tmp_path / "out")
    assert code == 0 and res["status"] == "pass" and res["resolved"] == "RESOLVED_FULL", res["message"]
    assert not res["tests_status"]["FAIL_TO_PASS"]["failure"] and len(res["tests"]) == 46
    assert res["sandbox"].split()[0] == sandbox.resolve("auto")[0]


def test_the_unfixed_kata_is_not_resolved_and_a_partial_fix_is_partial(repo, tmp_path):
    kata = find_kata(18)
    code, res, _ = grade(repo, kata.loop.read_text(), tmp_path / "unfixed", n=18)
    assert code == 1 and res["status"] == "fail" and res["resolved"] == "RESOLVED_NO"
    failing = {t["name"]: t for t in res["tests"] if t["status"] == "fail"}
    assert set(res["tests_status"]["FAIL_TO_PASS"]["failure"]) == set(failing)
    assert all(t.get("task_id") in kata.bugs for t in failing.values())
    bugs = load_bugs()
    source = plant(GOOD, [bugs[b] for b in kata.bugs if b != "sampling-no-eos-stop"])
    code, res, _ = grade(repo, source, tmp_path / "partial", n=18)
    assert code == 1 and res["resolved"] == "RESOLVED_PARTIAL"


def test_a_conftest_beside_the_submission_is_ignored(repo, tmp_path):
    cheat = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
             "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    code, res, _ = grade(repo, BUGGY, tmp_path / "out",
                         extra_files={"conftest.py": cheat, "pytest.ini": "[pytest]\naddopts = -p no:x\n"})
    assert code == 1 and res["resolved"] == "RESOLVED_NO"


def test_a_missing_submission_is_an_error_with_results(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "grpo_katas.grade", "18", str(tmp_path / "nope.py"), str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    res = json.loads((out / "results.json").read_text())
    assert r.returncode == 1 and res["status"] == "error" and "no such file" in res["message"]


@pytest.mark.parametrize("args, expected", [
    (["18", "solutions/grpo.py"], "OUT is required"),
    (["18", "solutions/grpo.py", "/proc/no-such-place/out"], "cannot write to /proc/no-such-place/out"),
    (["99", "solutions/grpo.py", "out"], "there is no kata 99"),
])
def test_usage_errors_are_one_line(args, expected):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.grade", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr
