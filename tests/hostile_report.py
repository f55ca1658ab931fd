"""Every hostile case of tests/test_grade.py graded as the suite grades it (a private copy of the repository, three
at a time, each with its own options), printed as a table: case, verdict, status, seconds against the time limit,
and what the results say. A report, not a test.

    .venv/bin/python -m tests.hostile_report [--only CASE ...] [--user NAME --python PATH]

--only grades the cases named; --user grades as that user (run as root: `runuser -u NAME`) with the Python at PATH,
which that user can run and which has the repository's dependencies; the repository must be readable by them.
"""
import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from tests.test_grade import grade_all, hostile, make_healthy_runs, private_copy, time_limit


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=None, help="grade only these cases")
    p.add_argument("--user", default=None, help="grade as this user (needs root)")
    p.add_argument("--python", default=None, help="with --user: a Python that user can run, with torch and pytest")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    repo, base = private_copy(tmp / "repo"), tmp / "out"
    base.mkdir()
    cases = hostile(repo, base / "escapes-and-rewrites-out")
    if a.only:
        unknown = sorted(set(a.only) - set(cases))
        if unknown:
            p.error(f"no such case: {', '.join(unknown)}")
        cases = {name: cases[name] for name in a.only}
    make_healthy_runs(repo, [c.kata for c in cases.values()])
    if a.user and not a.python:
        p.error("--user needs --python: a Python that user can run")
    python = ("runuser", "-u", a.user, "--", a.python) if a.user else ()
    if a.user:
        for path in (tmp, *tmp.rglob("*")):
            if not path.is_symlink():
                os.chmod(path, os.stat(path).st_mode | 0o777 if path.is_dir() else os.stat(path).st_mode | 0o644)
    start = time.monotonic()
    graded = grade_all(repo, cases, base, python)
    who = a.user or ("root" if os.geteuid() == 0 else "this user")
    print("| case | verdict | status | seconds / limit | graded as | what the results say |\n|---|---|---|---|---|---|")
    for name, (_, res, seconds) in graded.items():
        said = res.get("message") or next((t["message"] for t in res["tests"] if t.get("message")), "") \
            or "; ".join(res.get("events", []))
        said = " ".join(str(said).split())[:110].replace("|", "\\|")
        print(f"| {name} | {res['resolved']} | {res['status']} | {seconds:.1f} / {time_limit(cases[name].args):g} "
              f"| {who} | {said} |")
    print(f"\n{len(graded)} cases graded in {time.monotonic() - start:.0f} s, three at a time")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
