"""Every hostile case of tests/test_grade.py graded as the suite grades it (a private copy of the repository, three
at a time), printed as a table: case, verdict, status, seconds and what the results say. A report, not a test.

    .venv/bin/python -m tests.hostile_report
"""
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.test_grade import ROOT, grade, hostile


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    repo, base = tmp / "repo", tmp / "out"
    for f in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split():
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    base.mkdir()
    cases = hostile(repo, base / "escapes-and-rewrites-out")
    start = time.monotonic()
    with ThreadPoolExecutor(3) as pool:
        graded = dict(pool.map(lambda name: (name, grade(repo, cases[name][0], base / name)), cases))
    print("| case | verdict | status | seconds | what the results say |\n|---|---|---|---|---|")
    for name, (_, res, seconds) in graded.items():
        said = res.get("message") or next((t["message"] for t in res["tests"] if t.get("message")), "") \
            or "; ".join(res.get("events", []))
        said = " ".join(str(said).split())[:110].replace("|", "\\|")
        print(f"| {name} | {res['resolved']} | {res['status']} | {seconds:.1f} | {said} |")
    print(f"\n{len(graded)} cases graded in {time.monotonic() - start:.0f} s, three at a time")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
