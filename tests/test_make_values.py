"""What a user types on make's command line reaches the CLI as typed: neither make nor the shell runs any of it, a
value that begins with - is a value (never an option), one with a line break is refused in one line, and make's
statuses live in a folder of its own, never under a name in a shared /tmp that another user could take first
(issue 41). Run: pytest tests/test_make_values.py"""
import json
import os
import subprocess

import pytest

from tests.cli_helpers import ENV, fake_venv, make

# each would run `touch MARK` in a shell, or in make, if a value were expanded anywhere on its way
RUNS_A_COMMAND = ["$(shell touch {mark})", "`touch {mark}`", "$$(touch {mark})", "$(touch {mark})",
                  "x'; touch {mark}; echo '"]


@pytest.mark.slow
@pytest.mark.parametrize("target, setting", [("kata", "N"), ("check", "TARGET"), ("grade", "SUBMISSION"),
                                             ("run", "SET")])
def test_no_value_typed_on_make_s_command_line_runs_a_command(repo, tmp_path, target, setting):
    mark = tmp_path / "ran"
    extra = {"grade": ["N=1", f"OUT={tmp_path / 'out'}"], "run": ["N=1"], "check": [], "kata": []}[target]
    for shape in RUNS_A_COMMAND:
        code, out = make(repo, target, f"{setting}={shape.format(mark=mark)}", *extra)
        assert code != 0 and not mark.exists(), (shape, out)


def test_a_submission_that_begins_with_a_dash_is_refused_with_its_reports_written(repo, tmp_path):
    out = tmp_path / "out"
    code, said = make(repo, "grade", "N=1", "SUBMISSION=-h", f"OUT={out}")
    assert code == 1 and "begins with -" in said and "usage:" not in said, said
    results = json.loads((out / "results.json").read_text())
    assert results["resolved"] == "RESOLVED_NO" and "begins with -" in results["message"]
    assert (out / "junit.xml").exists() and (out / "summary.md").exists()


def test_a_value_with_a_line_break_is_refused_by_its_name_in_one_line(repo, tmp_path):
    code, said = make(repo, "grade", "N=1", "SUBMISSION=a\nb.py", f"OUT={tmp_path}")
    assert code == 1 and said.strip() == "error: SUBMISSION= holds a line break: a setting is one line", said


def test_a_kata_number_that_looks_like_an_option_is_a_value(repo):
    code, said = make(repo, "kata", "N=-h")
    assert code == 1 and "N must be a kata number, got '-h'" in said and "usage:" not in said, said


@pytest.mark.slow
def test_make_keeps_its_statuses_in_a_folder_of_its_own_and_leaves_none_behind(repo, tmp_path):
    """The statuses once went to TMPDIR/grpo-katas-make-PID.TARGET: a FIFO there turned root's failure into exit 0,
    a link there overwrote a root-only file. Here a FIFO and a link wait under every such name for the next PIDs."""
    if not (repo / ".venv" / ".installed").exists():
        fake_venv(repo)
    shared = tmp_path / "tmp"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("kept")
    pid = os.getpid()
    for n in range(pid, pid + 200):
        os.mkfifo(shared / f"grpo-katas-make-{n}.kata")
        (shared / f"grpo-katas-make-{n}.list").symlink_to(victim)
    before = set(shared.iterdir())
    env = {**ENV, "TMPDIR": str(shared)}
    for args, expected in ((["kata", "N=99"], 1), (["list"], 0), (["kata", "N=1"], 0), (["nosuch"], 1)):
        r = subprocess.run(["make", "-s", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == expected, (args, r.stdout + r.stderr)
    assert set(shared.iterdir()) == before and victim.read_text() == "kept"
