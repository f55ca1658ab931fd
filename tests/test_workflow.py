"""The example grading workflow's shell steps, run with a stand-in for make. Run: pytest tests/test_workflow.py"""
import os
import subprocess
import textwrap

from grpo_katas import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "grade.yml"

FAKE_MAKE = """#!/bin/sh
# make grade N=.. SUBMISSION=.. OUT=..: kata 8 fails its checks, kata 99 does not exist (no summary)
for a; do case $a in N=*) n=${a#N=};; OUT=*) out=${a#OUT=};; esac; done
[ "$n" = 99 ] && { echo "error: there is no kata 99"; exit 2; }
mkdir -p "$out" && echo "kata $n graded" > "$out/summary.md"
[ "$n" = 8 ] && exit 1
exit 0
"""


def step_script(name: str) -> str:
    """The `run: |` block of the workflow step called `name`."""
    lines = WORKFLOW.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == f"- name: {name}")
    run = next(i for i in range(start, len(lines)) if lines[i].strip() == "run: |")
    indent = len(lines[run]) - len(lines[run].lstrip())
    block = []
    for line in lines[run + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    return textwrap.dedent("\n".join(block))


def test_the_set_up_leaves_the_makefiles_stamp():
    assert "touch .venv/.installed" in step_script("set up (CPU torch is enough to grade)")


def test_every_submission_folder_is_graded_or_reported_and_the_job_fails_at_the_end(tmp_path):
    for n in ["7", "8", "abc", "99", "12", "empty"]:
        (tmp_path / "pr" / "submissions" / n).mkdir(parents=True)
        if n != "empty":
            (tmp_path / "pr" / "submissions" / n / "grpo.py").write_text("")
    (tmp_path / "pr" / "submissions" / "13").mkdir()  # a kata number without a file
    # what the grader must never be handed: links to its own files (the file's, or the folder's), a FIFO, a big file
    (tmp_path / "grader" / "solutions").mkdir(parents=True)
    (tmp_path / "grader" / "solutions" / "grpo.py").write_text("the reference")
    links = tmp_path / "pr" / "submissions"
    for n in ("20", "21", "22", "23"):
        (links / n).mkdir()
    (links / "20" / "grpo.py").symlink_to("../../../grader/solutions/grpo.py")
    (links / "21" / "grpo.py").symlink_to("/proc/self/mem")
    os.mkfifo(links / "22" / "grpo.py")
    (links / "23" / "grpo.py").write_text("#" * (2**20 + 1))
    (links / "24").symlink_to("../../grader/solutions", target_is_directory=True)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "make").write_text(FAKE_MAKE)
    (tmp_path / "bin" / "make").chmod(0o755)
    summary = tmp_path / "summary.md"
    # GitHub runs a step as `bash -e {0}`: a failing command outside a condition ends the step
    r = subprocess.run(["bash", "-e", "-c", step_script("grade each submission")], cwd=tmp_path / "grader",
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GITHUB_STEP_SUMMARY": str(summary)})
    text = summary.read_text()
    assert r.returncode == 1, r.stdout + r.stderr
    assert all(f"kata {n} graded" in text for n in ["7", "8", "12"]), text
    assert "submissions/abc: not graded" in text and "submissions/empty: not graded" in text
    assert "submissions/99: not graded" in text and "submissions/13: not graded, no grpo.py" in text
    for n in ("20", "21", "22", "24"):
        assert f"kata {n} graded" not in text and f"submissions/{n}: not graded, grpo.py is not a regular" in text
    assert "kata 23 graded" not in text and "submissions/23: not graded, grpo.py is larger than 1 MiB" in text


def test_a_folder_name_reaches_the_log_and_the_summary_only_as_safe_characters(tmp_path):
    """A pull request's folder name once went raw into ::error:: and the step summary: a line break then ::warning::
    (or ::add-mask::, ::stop-commands::) is a workflow command, <img src=x> is markup."""
    evil = "x\n::error::forged <img src=x>"
    (tmp_path / "pr" / "submissions" / evil).mkdir(parents=True)
    (tmp_path / "grader").mkdir()
    summary = tmp_path / "summary.md"
    r = subprocess.run(["bash", "-e", "-c", step_script("grade each submission")], cwd=tmp_path / "grader",
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1
    lines = (r.stdout + r.stderr + summary.read_text()).splitlines()
    assert [line for line in lines if line.startswith("::")] == [
        "::error::submissions/x???error??forged??img?src?x?: the folder must be named by a kata number, e.g. submissions/7"]
    assert "<" not in summary.read_text() and "forged" in summary.read_text()


def test_the_workflow_that_grades_is_the_base_branch_s_with_a_read_only_token():
    text = WORKFLOW.read_text()
    assert "\n  pull_request_target:\n" in text and "\n  pull_request:\n" not in text
    assert "permissions:\n      contents: read" in text and "secrets." not in text
    assert "ref: ${{ github.event.pull_request.base.sha }}" in text and "persist-credentials: false" in text
