"""Mock rounds, the interviewer's sheet, scorecards and the candidate bundle. Run: pytest tests/test_mock.py"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest

from grpo_katas.catalogue.katas import find_kata
from tests.cli_helpers import ENV, cli, interruptible, make, n_checks, on_a_terminal


def start_round(repo, *args):
    proc = interruptible(["mock", *args], repo)
    seen, deadline = "", time.time() + 60
    while "time is up" not in seen and time.time() < deadline:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, seen + out


@pytest.mark.slow
def test_a_round_counts_down_with_nudges_and_ends_in_a_scorecard(repo):
    code, out = start_round(repo, "7", "--minutes", "0.05")
    assert code == 0 and "half time" in out and "time is up" in out and "Traceback" not in out
    code, out = cli(repo, "mock", "8")
    assert code == 2 and "in progress" in out
    time.sleep(3)  # off the clock: Ctrl-C stopped it
    code, out = start_round(repo)  # resumed: the clock starts again, time is up at once
    assert code == 0 and "resuming the round" in out
    time.sleep(2)  # off the clock again
    code, out = cli(repo, "mock-end")
    assert code == 0 and "bugs fixed: 0 of 1" in out
    cards = sorted((repo / "work" / "rounds").glob("*.json"))
    card = json.loads(cards[0].read_text())
    assert card["kata"] == "7" and card["checks"]["total"] == n_checks() + 1  # and the brief's run, as make check
    assert set(card["rubric"]) >= {"hypothesis", "fix"}
    spans = [(datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds() for a, b in card["clock"]]
    wall = (datetime.fromisoformat(card["ended"]) - datetime.fromisoformat(card["started"])).total_seconds()
    assert len(spans) == 2 and abs(card["seconds_used"] - sum(spans)) <= 1 and card["seconds_used"] <= wall - 3
    code, out = cli(repo, "mock-end")
    assert code == 2 and "no mock round" in out


@pytest.mark.slow
def test_scorecards_never_overwrite_each_other(repo):
    for _ in range(2):
        start_round(repo, "1", "--minutes", "0.02")
        assert cli(repo, "mock-end")[0] == 0
    assert len(list((repo / "work" / "rounds").glob("*.md"))) == 2


@pytest.mark.slow
def test_a_round_that_fixed_every_bug_is_judged_as_make_check_judges_and_solves_the_kata(repo):
    from grpo_katas.catalogue.katas import CODEBASES
    from tests.cli_helpers import copy_of
    start_round(repo, "1", "--minutes", "0.02")
    copy_of(repo, 1).write_text(CODEBASES[find_kata(1).codebase].path.read_text())
    code, out = cli(repo, "mock-end")
    card = json.loads(sorted((repo / "work" / "rounds").glob("*.json"))[0].read_text())
    assert code == 0 and card["checks"]["passed"] == card["checks"]["total"] == n_checks() + 1, out
    assert "Solved" in out and json.loads((repo / "work" / "state.json").read_text())["katas"]["1"].get("solved")


def test_a_round_picks_an_unsolved_kata_of_the_tier(repo):
    code, out = start_round(repo, "--tier", "interview", "--minutes", "0.02")
    state = json.loads((repo / "work" / "state.json").read_text())
    assert code == 0 and find_kata(state["round"]["kata"]).tier == "interview"


def test_the_interviewers_sheet_names_the_bugs_and_the_rubric(repo):
    code, out = cli(repo, "mock-notes", "18")
    assert code == 0 and "adv-tiled-groups" in out and "root cause" in out and "hint 3" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bundle_runs_on_its_own_shows_what_its_brief_says_and_holds_no_answers(repo, tmp_path):
    from grpo_katas.catalogue.symptoms import run_loop
    out_dir = tmp_path / "bundle"
    code, out = cli(repo, "bundle", "7", str(out_dir))
    assert code == 0
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    lab = [f"lab/{f.name}" for f in (repo / "lab").glob("*.py")]
    assert files == sorted(["BRIEF.md", "README.md", "grpo.py", "run.py", *lab]) and "lab/model.py" in lab
    text = " ".join((out_dir / f).read_text() for f in files)
    assert "train-ref-is-policy" not in text and "make check" not in text and "python run.py" in text
    where = subprocess.run([sys.executable, "-c", "import lab; print(lab.__file__)"], cwd=out_dir, env=ENV,
                           capture_output=True, text=True, timeout=60).stdout
    assert str(out_dir) in where
    run = subprocess.run([sys.executable, "run.py"], cwd=out_dir, env=ENV, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and re.search(r"^step +40 \| loss ", run.stdout, re.MULTILINE), run.stderr
    # the run the brief describes, as make run makes it: its reward over the last 5 steps is the brief's 0.80
    kata = find_kata(7)
    history = run_loop(kata.loop, kata.run).history
    first5, last5 = (sum(h["reward_mean"] for h in part) / 5 for part in (history[:5], history[-5:]))
    assert f"reward_mean {first5:.4g} -> {last5:.4g}," in run.stdout and f"{last5:.2f}" == "0.80"
    assert cli(repo, "bundle", "7", str(out_dir))[0] == 2  # never overwrites


@pytest.mark.timeout(300)
def test_a_data_parallel_bundle_runs_on_two_ranks(repo, tmp_path):
    code, _ = cli(repo, "bundle", "34", str(tmp_path / "b"))
    run = subprocess.run([sys.executable, "run.py", "--steps", "2"], cwd=tmp_path / "b", env=ENV,
                         capture_output=True, text=True, timeout=240)
    assert code == 0 and run.returncode == 0 and "step   2 | rank 1 | loss" in run.stdout, run.stderr


def test_a_time_box_that_is_not_a_positive_number_is_refused_in_one_line(repo):
    for minutes in ("-5", "0", "nan"):
        code, out = cli(repo, "mock", "7", "--minutes", minutes)
        assert code == 2 and len(out.strip().splitlines()) == 1 and "must be a number above 0" in out, out
    assert not (repo / "work" / "state.json").exists()


def test_grading_without_a_submission_is_a_usage_error(repo):
    code, out = make(repo, "grade", "N=7", "OUT=graded")
    assert code == 1 and out.strip().startswith("error: SUBMISSION is required") and not (repo / "graded").exists()


def test_catalogue_text_in_brackets_is_shown_as_written(repo):
    tiled = "[p1, p2, p1, p2]"  # sampling-tiled-groups' text, planted in kata 14
    code, out = cli(repo, "mock-notes", "14")
    assert code == 0 and tiled in out
    code, out = cli(repo, "solution", "14", "--force")
    assert code == 0 and tiled in out


def test_a_bundle_folder_that_cannot_be_written_is_one_line(repo, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out = cli(repo, "bundle", "7", str(blocker / "bundle"))  # a folder inside a file: never writable
    assert code == 2 and out.startswith("error: cannot write the bundle") and "Not a directory" in out
    code, out = cli(repo, "bundle", "7", str(blocker))
    assert code == 2 and "not an empty folder" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_bundle_inside_a_read_only_folder_is_one_line(repo, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, out = cli(repo, "bundle", "7", str(locked / "bundle"))
    assert code == 2 and "cannot write the bundle" in out and "Permission denied" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grading_on_a_terminal_says_it_has_begun_before_the_checks_run(repo, tmp_path):
    code, text = on_a_terminal(repo, ["7", "katas/07-flat-kl/grpo.py", str(tmp_path)], module="grpo_katas.judge.grade")
    assert code == 1 and text.index("grading katas/07-flat-kl/grpo.py against kata 7") < text.index("RESOLVED_NO")


def test_a_second_grading_into_the_same_out_keeps_the_first_reports(repo):
    """The reports already in OUT move to OUT/previous-<time>/ (as the grader says), never replaced."""
    out = repo / "graded"
    first = subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", "7", "no-such-file.py", str(out), "--seed", "1"],
                           cwd=repo, capture_output=True, text=True, timeout=120, env=ENV)
    assert first.returncode == 1 and not list(out.glob("previous-*"))
    before = {name: (out / name).read_bytes() for name in ("results.json", "junit.xml", "summary.md")}
    second = subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", "7", "no-such-file.py", str(out), "--seed", "2"],
                            cwd=repo, capture_output=True, text=True, timeout=120, env=ENV)
    kept = list(out.glob("previous-*"))
    assert second.returncode == 1 and len(kept) == 1 and f"moved to {kept[0]}/" in second.stderr
    assert {name: (kept[0] / name).read_bytes() for name in before} == before
    assert json.loads((out / "results.json").read_text())["seed"] == 2


@pytest.mark.timeout(120)
def test_the_countdown_stopped_with_ctrl_c_typed_in_a_terminal_exits_0_through_make(repo):
    from tests.cli_helpers import fake_venv
    fake_venv(repo)
    code, out = on_a_terminal(repo, [], command=["make", "mock", "N=7", "MINUTES=0.02"], until="time is up",
                              keys="\x03")
    assert code == 0 and "clock stopped" in out and "make:" not in out, out
