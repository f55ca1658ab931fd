"""Grade one submitted file against a kata: results.json (exercism v3 plus a SWE-bench section), junit.xml and
summary.md, written to OUT.

    python -m grpo_katas.judge.grade N SUBMISSION OUT [--time-limit 600] [--memory-gb 8] [--sandbox process] [--seed S]
    make grade N=7 SUBMISSION=path/to/grpo.py OUT=dir

Three processes, and the submission runs in the last alone. This one draws the seed, watches the clock and
writes OUT. The judge (`python -m grpo_katas.judge.matrix`, its child) runs the checks and the oracle and never imports
the submission. A copy of the submission is imported by a worker process inside a bubblewrap sandbox (its own
filesystem view with no repository, no checks and no output folder; no capability; no network; its own PID
namespace; memory, CPU and file-size limits), and every contract call a check makes runs there. So does the brief's
run (run::brief_symptoms_gone): the copy trained as `make run` trains it, each step's numbers sent back, and each
symptom of the kata's brief required gone against the healthy codebase's run (grpo_katas/judge/brief.py). Only
data comes back; every comparison and verdict is made in the judge, and OUT is written here only.

A plain-process worker is no sandbox (it can read and write what you can, and signal the grader), so grading
refuses to run without bubblewrap unless `--sandbox process` asks for exactly that; results.json records the mode.

A check passes only on evidence: each of its draws ran and passed. A contract call that raises, hangs (over its
CPU budget, or idle too long) or crashes the worker fails its checks with a message; later calls of a function
that hung fail at once. The time limit bounds the whole grading, the judge's own work included: the judge is
killed GRACE_S seconds after it, and the grading is then an error. Each grading draws a fresh seed for the
checks' inputs (recorded in results.json; `--seed` replays one). Whatever the submission's messages hold,
results.json, junit.xml and summary.md are written and valid: every text in them is cut to a length and cleaned
of what UTF-8 or XML cannot carry. The exit status is 0 only when the kata is resolved in full; 2 for a usage
error (an unknown kata, an OUT that cannot be written, no sandbox).

The submission is read once, and only as a regular file of its own: a symbolic link (even to a regular file), a
folder, a FIFO, a socket or a device is refused without being opened, and so is a file larger than
MAX_SUBMISSION_BYTES (at most that many bytes and one more are ever read, so /proc/self/pagemap cannot fill a
disk). The copy the judge imports is those bytes; nothing else of the host's files is read on the submission's
behalf, so no host file's text can reach a report. Whatever the submission is or does, once OUT is ready the
grading ends with all three reports written; only the caller's mistakes (the kata, OUT, the sandbox) are usage
errors without them.
"""
import argparse
import json
import os
import re
import resource
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

from grpo_katas import ROOT
from grpo_katas.catalogue.katas import (RUN_CHECK, CatalogueError, CheckId, fail_to_pass, find_kata, fixed_bug_ids,
                                        load_bugs)
from grpo_katas.judge import matrix
from grpo_katas.judge import sandbox as sandboxes


RESOLVED = {"full": "RESOLVED_FULL", "partial": "RESOLVED_PARTIAL", "no": "RESOLVED_NO"}
GRACE_S = 6                      # the judge may run this long past the time limit before it is killed
REPORT_BYTES = 8 * 2**20         # the judge's verdicts file is refused beyond this
EVENTS = 20                      # worker events kept in results.json
MAX_SUBMISSION_BYTES = 2**20     # a kata's loop is 10 to 40 kB; a larger file is refused unread
JUDGE_MEMORY_GB = 4.0            # the judge's own address space (it peaks near 0.7 GiB grading kata 1)
KINDS = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
# what neither UTF-8 nor XML 1.0 can carry: lone surrogates, U+FFFE/F
UNWRITABLE = re.compile("[\ud800-\udfff\ufffe\uffff]")
# what a reader must see rather than have act, by Unicode category: control characters (C0 with tab, line feed and
# return, DEL, C1), format characters (the bidi overrides and isolates, zero widths, the tag characters), and the line
# and paragraph separators
INVISIBLE = ("Cc", "Cf", "Zl", "Zp")


def invisible(c: str) -> bool:
    return unicodedata.category(c) in INVISIBLE


def shown(text: str) -> str:
    """text with each invisible character as its escape (\n, \x1b, \u202e): one line that draws nothing."""
    return "".join(ascii(c)[1:-1] if invisible(c) else c for c in text)


class UsageError(Exception):
    """A mistake in how the grader was called (not the submission's fault): one line, exit status 2."""


class Refused(Exception):
    """A submission that is not graded (not a regular file, too large, unreadable): the message names the path and
    why, and never quotes the file."""


def read_submission(path: Path, limit: int = MAX_SUBMISSION_BYTES) -> bytes:
    """The submission's bytes, when it is a regular file of at most `limit` bytes. It is looked at before it is
    opened (a FIFO or a device is never opened), opened without following a link and without blocking, and the
    opened file is checked again (a path swapped in between is refused); at most limit + 1 bytes are read."""
    try:
        seen = os.lstat(path)
    except FileNotFoundError:
        raise Refused(f"{path}: no such file") from None
    except OSError as exc:
        raise Refused(f"{path}: cannot be looked at ({exc.strerror or exc})") from None
    refuse_kind(path, seen.st_mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"{path}: cannot be opened ({exc.strerror or exc})") from None
    try:
        opened = os.fstat(fd)
        refuse_kind(path, opened.st_mode)
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            raise Refused(f"{path}: replaced by another file while it was opened")
        data = read_at_most(fd, limit + 1)
    except OSError as exc:
        raise Refused(f"{path}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Refused(f"{path}: larger than {limit:,} bytes (a kata's loop is under 50 kB): not graded")
    return data


def refuse_kind(path: Path, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise Refused(f"{path}: a symbolic link, not a regular file: a submission is graded as a file of its own, "
                      f"never through a link (copy the file it points to)")
    if not stat.S_ISREG(mode):
        kind = next((kind for test, kind in KINDS if test(mode)), "a special file")
        raise Refused(f"{path}: {kind}, not a regular file: a submission is graded as a file of its own")


def read_at_most(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 2**20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def judge(submission: Path, kata, time_limit: float, memory_gb: float, sandbox: str, seed: int) -> tuple:
    """(matrix.Run, why it gives no verdict or None, seconds) for a private copy of the submission, judged in a
    child process that is killed GRACE_S seconds after the time limit whatever it is doing, and whose address
    space is limited to JUDGE_MEMORY_GB (a reply the wire lets through cannot take the machine's memory with it);
    messages name the submission, not the copy. The copy is made inside the clock; a submission that is refused
    gives no run."""
    start, judge_memory_gb = time.monotonic(), JUDGE_MEMORY_GB
    try:
        source = read_submission(submission)
    except Refused as exc:
        return matrix.Run(3, [{}], {}, "none (not graded)", []), str(exc), time.monotonic() - start
    with tempfile.TemporaryDirectory(prefix="grpo-grade-") as tmp:
        copy, verdicts, log = Path(tmp) / "grpo.py", Path(tmp) / "verdicts.json", Path(tmp) / "judge.log"
        copy.write_bytes(source)
        cmd = judge_command(copy, verdicts, seed, sandbox, memory_gb, start + time_limit, kata.key)
        try:
            with open(log, "wb") as err:  # TMPDIR: what the judge leaves behind when it is killed goes with tmp
                proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err, env={**os.environ, "TMPDIR": tmp}, start_new_session=True,
                                        preexec_fn=lambda: limit_address_space(judge_memory_gb))
        except OSError as exc:
            return no_run(), f"the judge could not start ({exc.strerror or exc})", time.monotonic() - start
        try:
            proc.wait(timeout=max(0.0, start + time_limit + GRACE_S - time.monotonic()))
            run, problem = read_verdicts(verdicts, proc.returncode, log)
            if problem:
                problem += f" (the judge runs under a limit of {judge_memory_gb:g} GiB of address space)"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker goes with it (it dies with its parent)
            proc.wait()
            run, problem = no_run(), f"the grading did not finish within its time limit ({time_limit:g} s)"
        except BaseException:  # Ctrl-C: the judge, in a session of its own, never saw it; it goes too
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    name = lambda text: text.replace(str(copy), str(submission))
    run.load_errors = {k: name(m) for k, m in run.load_errors.items()}
    run.events = [name(e) for e in run.events]
    for by_check in run.verdicts[0].values():
        for v in by_check.values():
            v.message = name(v.message)
    return run, problem or why_no_verdict(run, seed), time.monotonic() - start


def limit_address_space(gb: float) -> None:
    """The soft limit only: the judge's children (the sandboxes) set their own, up to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = int(gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (size if hard == resource.RLIM_INFINITY else min(size, hard), hard))


def judge_command(copy: Path, verdicts: Path, seed: int, sandbox: str, memory_gb: float, deadline: float,
                  kata_key: str) -> list:
    """The judge's command line: the checks and the brief's run on the copy, its verdicts written to `verdicts`."""
    return [sys.executable, "-m", "grpo_katas.judge.matrix", f"--seed={seed}", "--out", str(verdicts), f"--kata={kata_key}",
            f"--sandbox={sandbox}", f"--memory-gb={memory_gb}", f"--deadline={deadline}", str(copy)]


def read_verdicts(path: Path, status: int, log: Path) -> tuple:
    """(the judge's run, None), or (an empty run, why the judge gave none)."""
    try:
        if path.stat().st_size > REPORT_BYTES:
            raise ValueError(f"a verdicts file of {path.stat().st_size} bytes")
        return matrix.from_report(json.loads(path.read_text())), None
    except Exception as exc:  # absent, cut short by a kill, or not a report: the judge gave no verdicts
        tail = log.read_bytes()[-500:].decode("utf-8", "replace").strip() if log.exists() else ""
        return no_run(), f"the judge failed (exit status {status}; {exc}): {tail}"


def no_run() -> matrix.Run:
    return matrix.Run(3, [{}], {}, "unknown", [])


def why_no_verdict(run: matrix.Run, seed: int) -> str | None:
    """Why the run gives no verdict on the checks (status error), or None."""
    if 0 in run.load_errors:
        return f"the submission cannot be imported: {run.load_errors[0]}"
    if run.exit_code not in (0, 1):
        return f"the checks did not run (pytest exit status {run.exit_code})"
    if not run.of(0, seed):
        return "no check ran"
    return None


def build_results(kata, bugs, run: matrix.Run, error: str | None, submission: Path, seconds: float,
                  seed: int) -> dict:
    f2p = fail_to_pass(kata, bugs) | ({RUN_CHECK} if kata.symptoms else set())  # the brief's run: its symptoms
    task_of = {RUN_CHECK: kata.bugs[0]} if len(kata.bugs) == 1 else {}  # the run is the brief's: its bugs' together
    for b in kata.bugs:
        for c in bugs[b].checks:
            task_of.setdefault(c, b)
    verdicts = {} if error else run.of(0, seed)
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
    # partial: a bug fixed whole, every check of its own passing (for a kata of one bug, its brief's run among them)
    fixed = fixed_bug_ids(kata, bugs, verdicts)
    if error or not tests:
        resolved = "no"
    elif not swe["FAIL_TO_PASS"]["failure"] and not swe["PASS_TO_PASS"]["failure"]:
        resolved = "full"
    elif fixed and not swe["PASS_TO_PASS"]["failure"]:
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
    return writable({"version": 3, "status": status, "message": message, "tests": tests,
                     "kata": {"number": kata.number, "name": kata.name, "bugs": list(kata.bugs)},
                     "submission": str(submission), "resolved": RESOLVED[resolved], "tests_status": swe,
                     "sandbox": run.sandbox, "events": run.events[:EVENTS], "seed": seed,
                     "duration_s": round(seconds, 2)})


def writable(value, limit: int = matrix.MESSAGE_CHARS):
    """value with every string cut to `limit` characters, cleaned of what UTF-8 or XML 1.0 cannot carry (replaced by
    U+FFFD), and on one line with every control and format character shown as its escape (shown), so that
    results.json, junit.xml and summary.md always encode and parse, and what a submission made a check say can
    neither start a line (a heading, a workflow command) nor reorder or hide what follows it."""
    if isinstance(value, str):
        if len(value) > limit:
            value = f"{value[:limit]}... ({len(value)} characters)"
        return shown(UNWRITABLE.sub("\ufffd", value))
    if isinstance(value, list):
        return [writable(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: writable(v, limit) for k, v in value.items()}
    return value


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
    """Text for Markdown, in a table cell or a line: HTML shown as text, and every character Markdown reads as markup
    escaped, so that a message (already one line: writable) can neither draw on the page, link, nor end its cell."""
    text = (text or "").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_{}\[\]()#+!|~-])", r"\\\1", text)


def summary_markdown(results: dict) -> str:
    swe = results["tests_status"]
    lines = [f"## grpo-katas: kata {results['kata']['number']} ({results['kata']['name']})", "",
             f"**{results['resolved']}**, status `{results['status']}`"
             + (f": {cell(results['message'])}" if results["message"] else ""), "",
             f"- target checks (FAIL_TO_PASS): {len(swe['FAIL_TO_PASS']['success'])} of "
             f"{len(swe['FAIL_TO_PASS']['success']) + len(swe['FAIL_TO_PASS']['failure'])} pass",
             f"- other checks (PASS_TO_PASS): {len(swe['PASS_TO_PASS']['success'])} of "
             f"{len(swe['PASS_TO_PASS']['success']) + len(swe['PASS_TO_PASS']['failure'])} pass",
             f"- graded in {results['duration_s']} s at seed {results['seed']} (`--seed {results['seed']}` replays "
             f"it); sandbox: {results['sandbox']}", ""]
    failing = [t for t in results["tests"] if t["status"] == "fail"]
    if failing:
        lines += ["| check | symptom |", "|---|---|"]
        lines += [f"| `{t['name']}` | {cell(t['message'])} |" for t in failing]
    return "\n".join(lines) + "\n"


REPORTS = ("results.json", "junit.xml", "summary.md")


def prepare_out(out) -> Path:
    """OUT, made and writable, with the reports of a grading before moved to OUT/previous-<time>/ (said on stderr):
    a second grading into the same OUT never replaces the first's reports."""
    if out in (None, ""):
        raise UsageError("OUT is required: the folder for results.json, junit.xml and summary.md "
                         "(make grade N=.. SUBMISSION=.. OUT=dir)")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
        kept = keep_previous(out)
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror or exc}") from None
    if kept:
        print(f"the reports already in {out} are moved to {kept}/", file=sys.stderr)
    return out


def keep_previous(out: Path) -> Path | None:
    """Move the reports in `out` to a new out/previous-<date>-<time>[-k]/, and return it (None when there were none)."""
    there = [out / name for name in REPORTS if (out / name).exists()]
    if not there:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, k = out / f"previous-{stamp}", 2
    while folder.exists():
        folder, k = out / f"previous-{stamp}-{k}", k + 1
    folder.mkdir()
    for path in there:
        os.replace(path, folder / path.name)
    return folder


def check_sandbox(mode: str) -> None:
    """Grading runs someone else's code: without bubblewrap it is refused, unless a plain process is asked for."""
    if mode == "process":
        return
    try:
        sandboxes.resolve("bubblewrap")
    except RuntimeError as exc:
        raise UsageError(f"{exc}. A submission graded in a plain process can read and write what you can, use the "
                         f"network and stop the grader: install bubblewrap (make bubblewrap), or pass "
                         f"--sandbox process to grade it that way anyway") from None


def grade(number, submission, out, time_limit=600.0, memory_gb=8.0, sandbox="bubblewrap", seed=None) -> int:
    from grpo_katas.catalogue import drawn
    try:
        kata = drawn.load(number) if drawn.is_drill(number) else find_kata(number)
    except CatalogueError as exc:
        raise UsageError(str(exc)) from None
    if submission in (None, ""):
        raise UsageError("SUBMISSION is required: the file to grade (make grade N=.. SUBMISSION=path/to/grpo.py OUT=dir)")
    out, refused, bugs = prepare_out(out), refused_name(submission), load_bugs()
    seed = secrets.randbelow(2**31) if seed is None else seed  # a fresh seed: no check's inputs known in advance
    if refused:  # graded as nothing, its reports written, and said in one line
        results = build_results(kata, bugs, no_run(), f"not graded: the submission's path {refused}",
                                Path(ascii(submission)), 0.0, seed)
        write_reports(results, out)
        print(f"error: SUBMISSION {ascii(submission)} {refused}; the reports ({results['resolved']}) are in {out}",
              file=sys.stderr)
        return 2
    submission = Path(submission)
    if os.path.lexists(submission):  # a submission that is not there is graded as such, sandbox or not
        check_sandbox(sandbox)
    results = graded(kata, bugs, submission, time_limit, memory_gb, sandbox, seed)
    write_reports(results, out)
    print(f"kata {kata.key}: {results['resolved']} ({results['status']})"
          + (f": {results['message']}" if results["message"] else "") + f"; seed {seed}; results in "
          f"{out}/results.json")
    return 0 if results["resolved"] == RESOLVED["full"] else 1


def refused_name(path: str) -> str | None:
    """Why a submission's path is refused before anything reads it (a path that begins with - would be an option to
    the tools it passes through; a control character can forge a line in a report or a terminal), or None."""
    if path.startswith("-"):
        return "begins with -"
    bad = next((c for c in path if invisible(c)), None)
    return None if bad is None else f"holds the control character U+{ord(bad):04X}"


def graded(kata, bugs, submission: Path, time_limit, memory_gb, sandbox, seed) -> dict:
    """The results of grading the submission: whatever it is, whatever fails on the way, a verdict."""
    try:
        if sys.stderr.isatty():  # the checks take a while, and print nothing until they are done
            print(f"grading {submission} against kata {kata.key}: the checks, in a sandbox ...", file=sys.stderr)
        run, problem, seconds = judge(submission, kata, time_limit, memory_gb, sandbox, seed)
        return build_results(kata, bugs, run, problem, submission, seconds, seed)
    except Exception as exc:  # a defect of the grader or of this machine: still a verdict, never a traceback
        problem = f"the grader failed ({type(exc).__name__}: {str(exc)[:300]})"
        return build_results(kata, bugs, no_run(), problem, submission, 0.0, seed)


def write_reports(results: dict, out: Path) -> None:
    """results.json, junit.xml and summary.md, each written whole or not at all (a temporary file, then renamed);
    an OUT that cannot take them is the caller's to fix."""
    junit = out / ".junit.xml.tmp"
    try:
        write_junit(results, junit)
        for name, text in (("results.json", json.dumps(results, indent=1, ensure_ascii=False)),
                           ("summary.md", summary_markdown(results))):
            (out / f".{name}.tmp").write_text(text, encoding="utf-8")
        for name in ("junit.xml", "summary.md", "results.json"):
            os.replace(out / f".{name}.tmp", out / name)
    except OSError as exc:
        raise UsageError(f"cannot write the reports to {out}: {exc.strerror or exc}") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", help="the kata number the submission fixes, or a drill's (d3)")
    p.add_argument("submission", nargs="?", default=None, help="the submitted file (a fixed copy of the kata's grpo.py)")
    p.add_argument("out", nargs="?", default=None, help="folder for results.json, junit.xml and summary.md")
    p.add_argument("--time-limit", type=float, default=600.0,
                   help="wall-clock seconds for the whole grading; calls after it fail (default 600)")
    p.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit of the worker (default 8)")
    p.add_argument("--sandbox", choices=["bubblewrap", "process"], default="bubblewrap",
                   help="bubblewrap (the default): refuse to grade where it cannot run; process: grade in a plain "
                        "process, which can read and write your files and stop the grader (trusted code only)")
    p.add_argument("--seed", type=int, default=None,
                   help="the checks' seed: replay a grading (results.json records it; default: a fresh one)")
    a = p.parse_args(argv)
    sys.stdout.reconfigure(errors="backslashreplace")  # a message in a terminal that cannot show it
    try:
        return grade(a.n, a.submission, a.out, a.time_limit, a.memory_gb, a.sandbox, a.seed)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
