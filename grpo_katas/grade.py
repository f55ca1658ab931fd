"""Grade one submitted file against a kata: results.json (exercism v3 plus a SWE-bench section), junit.xml and
summary.md, written to OUT.

    python -m grpo_katas.grade N SUBMISSION OUT [--time-limit 600] [--memory-gb 8] [--sandbox auto]
    make grade N=7 SUBMISSION=path/to/grpo.py OUT=dir

This process is the judge: it runs the checks, the oracle and the report writer, and never imports the
submission. A copy of the submission is imported by a worker process inside a bubblewrap sandbox (its own
filesystem view with no repository, no checks and no output folder; no network; its own PID namespace; memory
and CPU limits), and every contract call a check makes runs there. Only data comes back; every comparison and
verdict is made here, and OUT is written here only. Where bubblewrap cannot run, the worker is a plain process
and results.json says so (`sandbox`); `--sandbox bubblewrap` refuses to grade without it.

A check passes only on evidence: each of its draws ran and passed. A contract call that raises, hangs (over its
CPU budget, or idle too long) or crashes the worker fails its checks with a message; later calls of a function
that hung fail at once. The time limit bounds the whole grading. The exit status is 0 only when the kata is
resolved in full; 2 for a usage error (an unknown kata, an OUT that cannot be written).
"""
import argparse
import json
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from grpo_katas import matrix
from grpo_katas.catalogue import CatalogueError, CheckId, fail_to_pass, find_kata, load_bugs

RESOLVED = {"full": "RESOLVED_FULL", "partial": "RESOLVED_PARTIAL", "no": "RESOLVED_NO"}


class UsageError(Exception):
    """A mistake in how the grader was called (not the submission's fault): one line, exit status 2."""


def judge(submission: Path, time_limit: float, memory_gb: float, sandbox: str) -> tuple:
    """(matrix.Run, seconds) for a private copy of the submission; messages name the submission, not the copy."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-grade-") as tmp:
        copy = Path(tmp) / "grpo.py"
        shutil.copyfile(submission, copy)
        run = matrix.run([copy], [0], sandbox=sandbox, memory_gb=memory_gb, time_limit=time_limit)
    name = lambda text: text.replace(str(copy), str(submission))
    run.load_errors = {k: name(m) for k, m in run.load_errors.items()}
    run.events = [name(e) for e in run.events]
    for by_check in run.verdicts[0].values():
        for v in by_check.values():
            v.message = name(v.message)
    return run, time.perf_counter() - start


def why_no_verdict(run: matrix.Run) -> str | None:
    """Why the run gives no verdict on the checks (status error), or None."""
    if 0 in run.load_errors:
        return f"the submission cannot be imported: {run.load_errors[0]}"
    if run.exit_code not in (0, 1):
        return f"the checks did not run (pytest exit status {run.exit_code})"
    if not run.of(0, 0):
        return "no check ran"
    return None


def build_results(kata, bugs, run: matrix.Run, error: str | None, submission: Path, seconds: float) -> dict:
    f2p = fail_to_pass(kata, bugs)
    task_of = {}
    for b in kata.bugs:
        for c in bugs[b].checks:
            task_of.setdefault(c, b)
    verdicts = {} if error else run.of(0, 0)
    tests = []
    for check in sorted(verdicts):
        v = verdicts[check]
        entry = {"name": str(check), "status": "pass" if v.passed else "fail", "message": v.message or None}
        if check in task_of:
            entry["task_id"] = task_of[check]
        tests.append(entry)
    passed = {c for c, v in verdicts.items() if v.passed}
    others = set(verdicts) - f2p
    swe = {"FAIL_TO_PASS": {"success": names(f2p & passed), "failure": names(f2p - passed)},
           "PASS_TO_PASS": {"success": names(others & passed), "failure": names(others - passed)}}
    if error or not tests:
        resolved = "no"
    elif not swe["FAIL_TO_PASS"]["failure"] and not swe["PASS_TO_PASS"]["failure"]:
        resolved = "full"
    elif swe["FAIL_TO_PASS"]["success"] and not swe["PASS_TO_PASS"]["failure"]:
        resolved = "partial"
    else:
        resolved = "no"
    if error:
        status, message = "error", error
    elif resolved == "full":
        status, message = "pass", None
    else:
        status = "fail"
        message = (f"{len(passed)} of {len(tests)} checks pass; {len(swe['FAIL_TO_PASS']['failure'])} of the kata's "
                   f"{len(f2p)} target checks still fail")
        if swe["PASS_TO_PASS"]["failure"]:
            message += f", and {len(swe['PASS_TO_PASS']['failure'])} check(s) that passed before now fail"
    return {"version": 3, "status": status, "message": message, "tests": tests,
            "kata": {"number": kata.number, "name": kata.name, "bugs": list(kata.bugs)},
            "submission": str(submission), "resolved": RESOLVED[resolved], "tests_status": swe,
            "sandbox": run.sandbox, "events": run.events, "duration_s": round(seconds, 2)}


def names(checks) -> list:
    return [str(c) for c in sorted(checks)]


def write_junit(results: dict, path: Path) -> None:
    suite = ET.Element("testsuite", name=f"grpo-katas {results['kata']['name']}",
                       tests=str(max(1, len(results["tests"]))),
                       failures=str(sum(t["status"] == "fail" for t in results["tests"])),
                       errors=str(int(results["status"] == "error")), time=str(results["duration_s"]))
    if results["status"] == "error" or not results["tests"]:
        case = ET.SubElement(suite, "testcase", classname="grading", name="grading")
        ET.SubElement(case, "error", message=results["message"] or "error").text = results["message"]
    for t in results["tests"]:
        check = CheckId.parse(t["name"])
        case = ET.SubElement(suite, "testcase", classname=check.component, name=check.name)
        if t["status"] == "fail":
            ET.SubElement(case, "failure", message=(t["message"] or "")[:1000]).text = t["message"]
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, not rewritten."""
    return (text or "").replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def summary_markdown(results: dict) -> str:
    swe = results["tests_status"]
    lines = [f"## grpo-katas: kata {results['kata']['number']} ({results['kata']['name']})", "",
             f"**{results['resolved']}**, status `{results['status']}`"
             + (f": {results['message']}" if results["message"] else ""), "",
             f"- target checks (FAIL_TO_PASS): {len(swe['FAIL_TO_PASS']['success'])} of "
             f"{len(swe['FAIL_TO_PASS']['success']) + len(swe['FAIL_TO_PASS']['failure'])} pass",
             f"- other checks (PASS_TO_PASS): {len(swe['PASS_TO_PASS']['success'])} of "
             f"{len(swe['PASS_TO_PASS']['success']) + len(swe['PASS_TO_PASS']['failure'])} pass",
             f"- graded in {results['duration_s']} s; sandbox: {results['sandbox']}", ""]
    failing = [t for t in results["tests"] if t["status"] == "fail"]
    if failing:
        lines += ["| check | symptom |", "|---|---|"]
        lines += [f"| `{t['name']}` | {cell(t['message'])} |" for t in failing]
    return "\n".join(lines) + "\n"


def prepare_out(out) -> Path:
    if out in (None, ""):
        raise UsageError("OUT is required: the folder for results.json, junit.xml and summary.md "
                         "(make grade N=.. SUBMISSION=.. OUT=dir)")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror or exc}") from None
    return out


def grade(number, submission, out, time_limit=600.0, memory_gb=8.0, sandbox="auto") -> int:
    from grpo_katas import drills
    try:
        kata = drills.load(number) if drills.is_drill(number) else find_kata(number)
    except CatalogueError as exc:
        raise UsageError(str(exc)) from None
    if submission in (None, ""):
        raise UsageError("SUBMISSION is required: the file to grade (make grade N=.. SUBMISSION=path/to/grpo.py OUT=dir)")
    out, submission, bugs = prepare_out(out), Path(submission), load_bugs()
    if not submission.is_file():
        run = matrix.Run(1, [{}], {}, "none", [])
        results = build_results(kata, bugs, run, f"{submission}: no such file", submission, 0.0)
    else:
        if sys.stderr.isatty():  # the checks take a while, and print nothing until they are done
            print(f"grading {submission} against kata {kata.key}: the checks, in a sandbox ...", file=sys.stderr)
        try:
            run, seconds = judge(submission, time_limit, memory_gb, sandbox)
        except RuntimeError as exc:  # --sandbox bubblewrap where it cannot run
            raise UsageError(str(exc)) from None
        results = build_results(kata, bugs, run, why_no_verdict(run), submission, seconds)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_junit(results, out / "junit.xml")
    (out / "summary.md").write_text(summary_markdown(results))
    print(f"kata {kata.key}: {results['resolved']} ({results['status']})"
          + (f": {results['message']}" if results["message"] else "") + f"; results in {out}/results.json")
    return 0 if results["resolved"] == RESOLVED["full"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", help="the kata number the submission fixes, or a drill's (d3)")
    p.add_argument("submission", nargs="?", default=None, help="the submitted file (a fixed copy of the kata's grpo.py)")
    p.add_argument("out", nargs="?", default=None, help="folder for results.json, junit.xml and summary.md")
    p.add_argument("--time-limit", type=float, default=600.0,
                   help="wall-clock seconds for the whole grading; calls after it fail (default 600)")
    p.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit of the worker (default 8)")
    p.add_argument("--sandbox", choices=["auto", "bubblewrap", "process"], default="auto",
                   help="auto: bubblewrap where it can run, else a plain process (said in results.json); "
                        "bubblewrap: refuse to grade without it")
    a = p.parse_args(argv)
    try:
        return grade(a.n, a.submission, a.out, a.time_limit, a.memory_gb, a.sandbox)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
