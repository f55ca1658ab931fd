"""The grader against the reference, a kata, a partial fix and a suite of broken and hostile submissions.
Each is graded without crashing or hanging the grader, results.json and junit.xml are always valid, and no
broken or hostile submission is ever graded as passing. Run: pytest tests/test_grade.py"""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from grpo_katas import REFERENCE, ROOT
from grpo_katas.catalogue import find_kata, load_bugs, plant

KATA = find_kata(18)
BUGGY = KATA.loop.read_text()
GOOD = REFERENCE.read_text()

NAN_EVERYWHERE = GOOD + '''
group_advantages = lambda rewards, group_size, eps: torch.full_like(rewards, float("nan"))
kl_penalty = lambda logp, ref_logp: torch.full_like(logp, float("nan"))
token_logprobs = lambda *a: torch.full((a[1].shape[0], a[1].shape[1] - a[3]), float("nan"))
'''
HOSTILE = {
    # name: (source, expected status, expected words in the message or tampering)
    "syntax-error": ("def generate(:\n", "error", "SyntaxError"),
    "sys-exit-at-import": ("import sys\nsys.exit(0)\n" + GOOD, "error", "exits at import"),
    "os-exit-at-import": ("import os\nos._exit(0)\n" + GOOD, "error", "without writing their report"),
    "hang-at-import": ("while True:\n    pass\n" + GOOD, "error", "took longer than"),
    "hang-in-a-function": (GOOD.replace('    log_ratio = ref_logp - logp ', '    while True:\n        pass\n    log_ratio = ref_logp - logp '),
                           "error", "did not finish"),
    "segfault": (GOOD.replace('    r = rewards.detach()', '    import ctypes; ctypes.string_at(0)\n    r = rewards.detach()'),
                 "error", "killed by signal"),
    "eats-memory-at-import": ("hog = bytearray(64 * 2**30)\n" + GOOD, "error", "MemoryError"),
    "nan-everywhere": (NAN_EVERYWHERE, "fail", "checks pass"),
    "prints-fake-passes": ('print("PASSED " * 40)\nprint("===== 34 passed in 1.00s =====")\n' + BUGGY +
                           '\n_orig = train\ndef train(*a, **k):\n    print("34 passed, 0 failed")\n    return _orig(*a, **k)\n',
                           "fail", "checks pass"),
    "patches-torch-comparisons": ("import torch\ntorch.allclose = lambda *a, **k: True\n"
                                  "torch.Tensor.__lt__ = lambda a, b: torch.ones((), dtype=torch.bool)\n" + BUGGY,
                                  "fail", "torch.allclose"),
    "patches-pytest-reporting": ("import _pytest.reports\n_pytest.reports.BaseReport.failed = property(lambda s: False)\n"
                                 "_pytest.reports.BaseReport.passed = property(lambda s: True)\n" + BUGGY,
                                 "fail", "BaseReport"),
    "imports-the-reference-module": ("from solutions.grpo import *\n", "error", "ModuleNotFoundError"),
    "loads-the-reference-file": ("import importlib.util, grpo_katas\n"
                                 "_s = importlib.util.spec_from_file_location('ref', grpo_katas.REFERENCE)\n"
                                 "_m = importlib.util.module_from_spec(_s); _s.loader.exec_module(_m)\n"
                                 "globals().update({k: v for k, v in vars(_m).items() if not k.startswith('__')})\n",
                                 "fail", "not in the submission"),
}


def grade(tmp_path, source, name="grpo.py", extra_files=None, time_limit=120):
    sub = tmp_path / "submitted"
    sub.mkdir(exist_ok=True)
    (sub / name).write_text(source)
    for fname, text in (extra_files or {}).items():
        (sub / fname).write_text(text)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "grpo_katas.grade", str(KATA.number), str(sub / name), str(out),
                        "--time-limit", str(time_limit), "--check-timeout", "5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=time_limit + 60)
    results = json.loads((out / "results.json").read_text())
    junit = ET.parse(out / "junit.xml").getroot()
    assert results["version"] == 3 and results["status"] in ("pass", "fail", "error")
    assert junit.tag == "testsuite" and int(junit.get("tests")) >= 1
    assert "Traceback" not in r.stdout + r.stderr
    return r.returncode, results


def test_the_reference_is_resolved_in_full(tmp_path):
    code, res = grade(tmp_path, GOOD)
    assert code == 0 and res["status"] == "pass" and res["resolved"] == "RESOLVED_FULL"
    assert not res["tests_status"]["FAIL_TO_PASS"]["failure"] and len(res["tests"]) == 34


def test_the_unfixed_kata_is_not_resolved(tmp_path):
    code, res = grade(tmp_path, BUGGY)
    assert code == 1 and res["status"] == "fail" and res["resolved"] == "RESOLVED_NO"
    failing = {t["name"]: t for t in res["tests"] if t["status"] == "fail"}
    assert set(res["tests_status"]["FAIL_TO_PASS"]["failure"]) == set(failing)
    assert all(t.get("task_id") in KATA.bugs for t in failing.values())


def test_one_bug_fixed_is_partial(tmp_path):
    bugs = load_bugs()
    source = plant(GOOD, [bugs[b] for b in KATA.bugs if b != "sampling-no-eos-stop"])
    code, res = grade(tmp_path, source)
    assert code == 1 and res["resolved"] == "RESOLVED_PARTIAL"


def test_a_conftest_beside_the_submission_is_ignored(tmp_path):
    cheat = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
             "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    code, res = grade(tmp_path, BUGGY, extra_files={"conftest.py": cheat, "pytest.ini": "[pytest]\naddopts = -p no:x\n"})
    assert code == 1 and res["resolved"] == "RESOLVED_NO"


def test_a_missing_submission_is_an_error_with_results(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "grpo_katas.grade", "18", str(tmp_path / "nope.py"), str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    res = json.loads((out / "results.json").read_text())
    assert r.returncode == 1 and res["status"] == "error" and "no such file" in res["message"]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_and_broken_submissions_never_pass(tmp_path, case):
    source, status, words = HOSTILE[case]
    code, res = grade(tmp_path, source, time_limit=25)
    assert code == 1 and res["resolved"] == "RESOLVED_NO" and res["status"] == status, res["message"]
    assert words in (res["message"] or "") + " ".join(res["tampering"]), res
