"""Every hostile case of tests/test_grade.py graded as the suite grades it (a private copy of the repository, three
at a time, each with its own options), printed as a table: case, verdict, status, seconds against the time limit,
and what the results say. A report, not a test.

    .venv/bin/python -m tests.hostile_report
"""
import shutil
import tempfile
import time
from pathlib import Path

from tests.test_grade import grade_all, hostile, make_healthy_runs, private_copy, time_limit


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    repo, base = private_copy(tmp / "repo"), tmp / "out"
    base.mkdir()
    cases = hostile(repo, base / "escapes-and-rewrites-out")
    make_healthy_runs(repo, [c.kata for c in cases.values()])
    start = time.monotonic()
    graded = grade_all(repo, cases, base)
    print("| case | verdict | status | seconds / limit | what the results say |\n|---|---|---|---|---|")
    for name, (_, res, seconds) in graded.items():
        said = res.get("message") or next((t["message"] for t in res["tests"] if t.get("message")), "") \
            or "; ".join(res.get("events", []))
        said = " ".join(str(said).split())[:110].replace("|", "\\|")
        print(f"| {name} | {res['resolved']} | {res['status']} | {seconds:.1f} / {time_limit(cases[name].args):g} "
              f"| {said} |")
    print(f"\n{len(graded)} cases graded in {time.monotonic() - start:.0f} s, three at a time")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
