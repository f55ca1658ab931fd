"""Grade one submitted file against a kata: results.json (exercism v3 plus a SWE-bench section) and junit.xml.

    python -m grpo_katas.grade N SUBMISSION OUT [--time-limit 600] [--memory-gb 8]
    make grade N=7 SUBMISSION=path/to/grpo.py OUT=dir

The checks run in a fresh, isolated interpreter (python -I) from a pristine copy of checks/ and the repository's
conftest in a temporary folder; the submission is copied there alone, so a conftest.py or pytest.ini beside it
is never seen. That process gets a hard wall-clock limit, an address-space limit and its own process group, and
every check a pytest-timeout. The verdict comes from the run's structured report (a pytest plugin hook) and its
exit status, never from what the submission prints. Results are always written; the exit status is 0 only
when the kata is resolved in full.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from grpo_katas import CHECKS, REFERENCE, ROOT
from grpo_katas.catalogue import COMPONENTS, CatalogueError, fail_to_pass, find_kata, load_bugs

RESOLVED = {"full": "RESOLVED_FULL", "partial": "RESOLVED_PARTIAL", "no": "RESOLVED_NO"}


def limit_child(memory_gb: float, cpu_s: int):
    def apply():
        os.setsid()
        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_isolated(submission: Path, time_limit: int, memory_gb: float, check_timeout: int) -> dict:
    """Run the checks on a copy of the submission; returns what happened, never raises for the submission's sake."""
    with tempfile.TemporaryDirectory(prefix="grpo-grade-") as tmp:
        tmp = Path(tmp)
        shutil.copytree(CHECKS, tmp / "checks", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(ROOT / "conftest.py", tmp / "conftest.py")
        (tmp / "submission").mkdir()
        target = tmp / "submission" / "grpo.py"
        shutil.copyfile(submission, target)
        out = tmp / "report.json"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "OMP_NUM_THREADS": "2",
               "GRPO_KATAS_CHECK_TIMEOUT": str(check_timeout), "GRPO_KATAS_IMPORT_TIMEOUT": str(check_timeout)}
        cmd = [sys.executable, "-I", "-W", "ignore", "-m", "grpo_katas.matrix", "--seed", "0", "--out", str(out),
               "--checks", str(tmp / "checks"), "--forbid", str(REFERENCE.parent), "--forbid", str(ROOT / "katas"),
               str(target)]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=limit_child(memory_gb, 2 * time_limit))
        try:
            output, _ = proc.communicate(timeout=time_limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the submission left running
        except ProcessLookupError:
            pass
        report = None
        if out.exists():
            try:
                report = json.loads(out.read_text())
            except ValueError:
                report = None
        return {"returncode": proc.returncode, "timed_out": timed_out, "report": report,
                "output": output.decode(errors="replace")[-20000:], "seconds": time.perf_counter() - start}


def diagnose(run: dict, time_limit: int, memory_gb: float) -> str | None:
    """Why the run cannot be trusted as a verdict, or None when it can."""
    text, code, report = run["output"], run["returncode"], run["report"]
    if run["timed_out"]:
        return f"the submission did not finish within the {time_limit} s limit (a hang?)"
    if "cannot load the target" in text:
        line = next(l for l in text.splitlines() if "cannot load the target" in l)
        return line.replace("ERROR: ", "").replace(str(Path(tempfile.gettempdir())), "<tmp>").strip()
    if "MemoryError" in text or "std::bad_alloc" in text or "DefaultCPUAllocator: can't allocate" in text:
        return f"the submission ran out of memory (limit {memory_gb:g} GiB)"
    if code is not None and code < 0:
        return f"the checks' interpreter was killed by signal {-code} (a crash in native code or a resource limit)"
    if report is None:
        return f"the checks ended (exit status {code}) without writing their report: the submission exited early"
    if code not in (0, 1) or report.get("exit_code") != code:
        return f"the checks ended with exit status {code}, not a normal pytest outcome"
    results = report["results"][0] if report["results"] else {}
    if not results:
        return "no check ran"
    if (code == 0) != all(r["passed"] for r in results.values()):
        return "the report and the exit status disagree (tampering?)"
    return None


def build_results(kata, bugs, run, error, submission) -> dict:
    f2p = fail_to_pass(kata, bugs)
    task_of = {}
    for b in kata.bugs:
        for c in bugs[b].checks:
            task_of.setdefault(c, b)
    report = run["report"] or {}
    results = (report.get("results") or [{}])[0] if not error else {}
    tampered = report.get("tampered", []) + report.get("foreign", [])
    tests = []
    for check in sorted(results, key=lambda c: (COMPONENTS.index(c.split("::")[0]), c)):
        r = results[check]
        entry = {"name": check, "status": "pass" if r["passed"] else "fail", "message": r["message"] or None}
        if check in task_of:
            entry["task_id"] = task_of[check]
        tests.append(entry)
    passed = {t["name"] for t in tests if t["status"] == "pass"}
    all_checks = set(results)
    swe = {"FAIL_TO_PASS": {"success": sorted(f2p & passed), "failure": sorted(f2p - passed)},
           "PASS_TO_PASS": {"success": sorted((all_checks - f2p) & passed),
                            "failure": sorted((all_checks - f2p) - passed)}}
    if error or tampered or not tests:
        resolved = "no"
    elif not swe["FAIL_TO_PASS"]["failure"] and not swe["PASS_TO_PASS"]["failure"]:
        resolved = "full"
    elif swe["FAIL_TO_PASS"]["success"] and not swe["PASS_TO_PASS"]["failure"]:
        resolved = "partial"
    else:
        resolved = "no"
    if error:
        status, message = "error", error
    elif tampered:
        status, message = "fail", "tampering detected: " + "; ".join(tampered)
    elif resolved == "full":
        status, message = "pass", None
    else:
        status = "fail"
        message = f"{len(passed)} of {len(tests)} checks pass; {len(swe['FAIL_TO_PASS']['failure'])} of the kata's " \
                  f"{len(f2p)} target checks still fail"
    return {"version": 3, "status": status, "message": message, "tests": tests,
            "kata": {"number": kata.number, "name": kata.name, "bugs": list(kata.bugs)},
            "submission": str(submission), "resolved": RESOLVED[resolved], "tests_status": swe,
            "tampering": tampered, "duration_s": round(run["seconds"], 2)}


def write_junit(results: dict, path: Path) -> None:
    suite = ET.Element("testsuite", name=f"grpo-katas {results['kata']['name']}",
                       tests=str(max(1, len(results["tests"]))),
                       failures=str(sum(t["status"] == "fail" for t in results["tests"])),
                       errors=str(int(results["status"] == "error")), time=str(results["duration_s"]))
    if results["status"] == "error" or not results["tests"]:
        case = ET.SubElement(suite, "testcase", classname="grading", name="grading")
        ET.SubElement(case, "error", message=results["message"] or "error").text = results["message"]
    for t in results["tests"]:
        component, name = t["name"].split("::")
        case = ET.SubElement(suite, "testcase", classname=component, name=name)
        if t["status"] == "fail":
            ET.SubElement(case, "failure", message=(t["message"] or "")[:1000]).text = t["message"]
    if results["tampering"]:
        case = ET.SubElement(suite, "testcase", classname="grading", name="tamper_check")
        ET.SubElement(case, "failure", message="tampering detected").text = "\n".join(results["tampering"])
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def summary_markdown(results: dict) -> str:
    swe = results["tests_status"]
    lines = [f"## grpo-katas: kata {results['kata']['number']} ({results['kata']['name']})", "",
             f"**{results['resolved']}**, status `{results['status']}`"
             + (f": {results['message']}" if results["message"] else ""), "",
             f"- target checks (FAIL_TO_PASS): {len(swe['FAIL_TO_PASS']['success'])} of "
             f"{len(swe['FAIL_TO_PASS']['success']) + len(swe['FAIL_TO_PASS']['failure'])} pass",
             f"- other checks (PASS_TO_PASS): {len(swe['PASS_TO_PASS']['success'])} of "
             f"{len(swe['PASS_TO_PASS']['success']) + len(swe['PASS_TO_PASS']['failure'])} pass",
             f"- graded in {results['duration_s']} s", ""]
    failing = [t for t in results["tests"] if t["status"] == "fail"]
    if failing:
        lines += ["| check | symptom |", "|---|---|"]
        lines += [f"| `{t['name']}` | {(t['message'] or '').replace('|', '/')} |" for t in failing]
    return "\n".join(lines) + "\n"


def grade(number, submission, out, time_limit=600, memory_gb=8.0, check_timeout=60) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    submission = Path(submission)
    bugs = load_bugs()
    kata = find_kata(number)  # a CatalogueError here is the caller's mistake, not the submission's
    if not submission.is_file():
        run = {"returncode": None, "timed_out": False, "report": None, "output": "", "seconds": 0.0}
        results = build_results(kata, bugs, run, f"{submission}: no such file", submission)
    else:
        run = run_isolated(submission, time_limit, memory_gb, check_timeout)
        results = build_results(kata, bugs, run, diagnose(run, time_limit, memory_gb), submission)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_junit(results, out / "junit.xml")
    (out / "summary.md").write_text(summary_markdown(results))
    print(f"kata {kata.number}: {results['resolved']} ({results['status']})"
          + (f": {results['message']}" if results["message"] else "") + f"; results in {out}/results.json")
    return 0 if results["resolved"] == RESOLVED["full"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", help="the kata number")
    p.add_argument("submission")
    p.add_argument("out")
    p.add_argument("--time-limit", type=int, default=600, help="wall-clock seconds for the whole run")
    p.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit of the checks' process")
    p.add_argument("--check-timeout", type=int, default=60, help="seconds per check (and for the import)")
    a = p.parse_args(argv)
    try:
        return grade(a.n, a.submission, a.out, a.time_limit, a.memory_gb, a.check_timeout)
    except CatalogueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
