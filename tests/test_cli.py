"""The practice CLI, driven in subprocesses on a temporary copy of the repository. Run: pytest tests/test_cli.py"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from grpo_katas import ROOT
from grpo_katas.catalogue.katas import CODEBASES, find_kata, load_katas
from tests.cli_helpers import ENV, cli, copy_of, interruptible, make, n_checks, on_a_terminal, ours_raised, plain, state


def test_start_then_resume_never_overwrites(repo):
    code, out = cli(repo, "kata", "1")
    assert code == 0 and "work/01-" in out and "time box" in out
    copy_of(repo).write_text(copy_of(repo).read_text() + "\n# my notes\n")
    code, out = cli(repo, "kata", "1")
    assert code == 0 and "Resuming" in out
    assert copy_of(repo).read_text().endswith("# my notes\n")
    assert "started" in state(repo)["katas"]["1"]


def test_a_copy_started_before_the_kata_was_renamed_is_still_yours(repo):
    cli(repo, "kata", "1")
    (repo / "work" / "01-kl-creep").rename(repo / "work" / "01-an-older-name")
    copy = repo / "work" / "01-an-older-name" / "grpo.py"
    copy.write_text(copy.read_text() + "\n# my notes\n")
    code, out = cli(repo, "kata", "1")
    assert code == 0 and "Resuming" in out and "work/01-an-older-name" in out
    assert not (repo / "work" / "01-kl-creep").exists() and copy.read_text().endswith("# my notes\n")


@pytest.mark.timeout(180)  # two runs of the checks; the plugin's 60 s per item is meant for one check
def test_check_fails_on_the_kata_and_passes_with_the_reference(repo):
    import json
    cli(repo, "kata", "1")
    code, out = cli(repo, "check", "1", "--format", "json")
    assert code == 1 and json.loads(out)["solved"] is False and json.loads(out)["bugs"] == {"planted": 1, "fixed": 0}
    cli(repo, "hint", "1")
    shutil.copyfile(repo / "solutions" / "grpo.py", copy_of(repo))
    code, out = cli(repo, "check", "1")
    assert code == 0 and "1 of 1 bugs fixed" in out and "Solved" in out and "1 hint(s)" in out
    assert state(repo)["katas"]["1"]["solved"]
    cli(repo, "hint", "1")  # read after solving: not counted against the kata
    code, out = cli(repo, "list")
    assert code == 0 and "solved" in out and f"1/{len(load_katas())} solved" in out
    assert row(out, 1).split()[-1] == "1" and state(repo)["katas"]["1"]["hints"] == 2
    before = row(out, 1).split()
    cli(repo, "reset", "1", "--yes")  # the file starts over; the record stays: solved, its time and hints
    code, out = cli(repo, "list")
    assert row(out, 1).split()[-3:-1] == before[-3:-1] and "solved" in row(out, 1) and f"1/{len(load_katas())} solved" in out


def row(table: str, n) -> str:
    """Kata n's row in `make list`'s table."""
    return next(l for l in table.splitlines() if re.match(rf"\s*{n}\s", l))


def test_hints_come_in_order_and_are_remembered(repo):
    ladder = [cli(repo, "hint", "2")[1] for _ in range(4)]
    assert ["hint 1 of 3" in ladder[0], "hint 2 of 3" in ladder[1], "hint 3 of 3" in ladder[2]] == [True] * 3
    assert "hint 3 of 3" in ladder[3] and state(repo)["katas"]["2"]["hints"] == 3


def test_solution_is_refused_before_solving_and_a_forced_reveal_is_recorded(repo):
    code, out = cli(repo, "solution", "1")
    assert code == 2 and "not solved yet" in out
    code, out = cli(repo, "solution", "1", "--force")
    assert code == 0 and "kl-sign-flipped" in out and str(CODEBASES[find_kata(1).codebase].path.relative_to(ROOT)) in out
    assert state(repo)["katas"]["1"]["revealed_unsolved"]
    cli(repo, "kata", "1")
    code, out = cli(repo, "list")
    assert "in progress*" in row(out, 1) and "*" not in row(out, 2)
    assert "* the solution revealed before it was solved" in out


def test_reset_asks_then_keeps_a_backup(repo):
    cli(repo, "kata", "1")
    copy_of(repo).write_text("my work\n")
    code, out = cli(repo, "reset", "1")
    assert code == 2 and "--yes" in out and copy_of(repo).read_text() == "my work\n"
    code, out = cli(repo, "reset", "1", "--yes")
    assert code == 0
    backups = list(copy_of(repo).parent.glob("backups/*.py"))
    assert [b.read_text() for b in backups] == ["my work\n"]
    assert copy_of(repo).read_text() == next(repo.glob("katas/01-*/grpo.py")).read_text()


@pytest.mark.parametrize("args, expected", [
    (["kata", "99"], "there is no kata 99; valid: 1, 2"),
    (["kata", "three"], "N must be a kata number"),
    (["kata"], "which kata?"),
    (["check", "4"], "no working copy of kata 4"),
])
def test_bad_input_is_one_clear_line(repo, args, expected):
    code, out = cli(repo, *args)
    assert code == 2 and expected in out


def test_a_deleted_kata_file_says_how_to_restore_it(repo):
    next(repo.glob("katas/05-*/grpo.py")).unlink()
    code, out = cli(repo, "kata", "5")
    assert code == 2 and "missing" in out and "make katas" in out


def test_a_syntax_error_in_the_working_copy_names_file_and_line(repo):
    cli(repo, "kata", "1")
    copy_of(repo).write_text(copy_of(repo).read_text() + "\ndef broken(:\n")
    code, out = cli(repo, "check", "1")
    assert code == 2 and "SyntaxError" in out and "grpo.py:" in out


def test_a_corrupt_state_file_is_set_aside_and_work_is_kept(repo):
    cli(repo, "kata", "1")
    copy_of(repo).write_text("my work\n")
    (repo / "work" / "state.json").write_text("{not json")
    code, out = cli(repo, "list")
    assert code == 0 and "set aside" in out
    assert list((repo / "work").glob("state.json.corrupt-*")) and copy_of(repo).read_text() == "my work\n"


def test_run_shows_a_crash_as_the_candidates_own_error_with_their_traceback(repo):
    cli(repo, "kata", "9")
    code, out = cli(repo, "run", "9", "--steps", "12")
    assert code == 1 and "your loop raised RuntimeError at" in out and "grpo.py:" in out
    trace = out[out.index("Traceback (most recent call last)"):]
    assert f'File "{copy_of(repo, 9)}", line' in trace.splitlines()[1] and "probability tensor" in trace


@pytest.mark.slow
def test_watch_checks_on_start_and_stops_cleanly_on_ctrl_c(repo):
    import signal
    import time
    cli(repo, "kata", "1")
    proc = interruptible(["watch", "1", "--interval", "0.2"], repo)
    deadline = time.time() + 120
    seen = ""
    while "bugs fixed" not in seen and time.time() < deadline:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "0 of 1 bugs fixed" in seen and proc.returncode == 0 and "Traceback" not in seen + out


@pytest.mark.slow
def test_run_takes_config_overrides_and_rejects_unknown_keys_and_bad_values(repo):
    cli(repo, "kata", "1")
    code, out = cli(repo, "run", "1", "--steps", "2", "--set", "beta=0.5")
    assert code == 0 and re.search(r"^2 ", out, re.MULTILINE)  # the table has a row for step 2
    said = next(line for line in out.splitlines() if line.startswith("sum task, seed 0, 2 steps, the lab model "
                                                                        "(2x64) on cpu; GRPOConfig: "))
    assert said.split("GRPOConfig: ", 1)[1].startswith("the file's defaults but ") and {
        "max_new_tokens=6", "num_iterations=2", "beta=0.5"} <= set(said.split()), said  # the practice settings, SET
    code, out = cli(repo, "run", "1", "--steps", "2", "--set", "betta=0.5")
    assert code == 2 and out.startswith("error: cannot run work/01-kl-creep/grpo.py: unknown setting 'betta'")
    code, out = cli(repo, "run", "1", "--steps", "2", "--set", "loss_type=xyz")  # the loop's own validation says no
    assert code == 2 and out.startswith("error: cannot run work/01-kl-creep/grpo.py: its GRPOConfig refuses --set "
                                        "loss_type='xyz'") and "Traceback" not in out
    code, out = cli(repo, "run", "1", "--steps", "2", "--set", "max_new_tokens=0")
    assert code == 2 and out.strip() == ("error: --set max_new_tokens must be from 1 to 48 (the lab model holds 64 "
                                         "positions; prompts take up to 16), got 0")


def test_run_draws_beside_the_healthy_run_each_metric_the_brief_cites(repo):
    cli(repo, "kata", "17")  # its brief is about adv_std, which is not one of the curves every run draws
    code, out = cli(repo, "run", "17", "--steps", "2")
    curves = out[out.index("curves, first -> last"):]
    assert code == 0 and [line.split()[0] for line in curves.splitlines()[2::2][:4]] == ["reward", "KL", "grad", "adv"]


def raising_in_train(repo, statement: str) -> None:
    """Kata 2's working copy, started, with `statement` run first thing in its train()."""
    cli(repo, "kata", "2")
    loop, start = copy_of(repo, 2), '    """Reference = frozen deepcopy'
    assert loop.read_text().count(start) == 1, "kata 2's train() no longer starts with its docstring"
    loop.write_text(loop.read_text().replace(start, f"    {statement}\n{start}"))


def test_a_crash_message_with_brackets_is_shown_verbatim(repo):
    raising_in_train(repo, 'raise ValueError("bad [/shape] in [grpo_x]")')
    code, out = cli(repo, "run", "2", "--steps", "1")
    assert code == 1 and "bad [/shape] in [grpo_x]" in out


@pytest.mark.timeout(120)
def test_a_crash_whose_event_is_longer_than_a_printed_line_ends_the_run(repo):
    # the crash event, traceback and all, is one line of JSON; a cut one would never be answered
    raising_in_train(repo, 'raise ValueError("long " + "x" * 5000)')
    code, out = cli(repo, "run", "2", "--steps", "1")
    assert code == 1 and "ValueError: long" in out


def make_targets() -> list:
    """The targets the Makefile names for users (its TARGETS)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(r"^TARGETS := (.*)$", text, re.MULTILINE)[1].split()


def test_every_command_and_flag_says_what_it_does_and_make_help_lists_every_target():
    from grpo_katas.practice import cli as practice
    from grpo_katas.training import train as trainer
    code, out = cli(ROOT, "--help")
    assert code == 0 and all(name in out for name in practice.COMMANDS)
    sub = next(a for a in practice.parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert len(command.description) > 60 and all(a.help for a in command._actions), name
    assert all(len(a.help) > 20 for a in trainer.parser()._actions), "a trainer flag without help"
    make = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert [t for t in make_targets() if t != "help" and f"make {t}" not in make] == []


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_run_refuses_a_step_count_below_one(repo, steps):
    cli(repo, "kata", "1")
    code, out = cli(repo, "run", "1", "--steps", steps)
    assert code == 2 and out.strip() == f"error: --steps must be at least 1, got {steps}"


@pytest.mark.parametrize("args", [["check", "N="], ["check"]])
def test_make_check_without_a_kata_or_a_target_says_which_kata_instead_of_checking_the_reference(repo, args):
    code, out = make(repo, *args)
    assert code == 1 and "which kata?" in out and "TARGET=" in out and "passed" not in out, out


@pytest.mark.parametrize("text", ['{"katas": {"1": []}}', '{"katas": {"1": {"hints": "two"}}}',
                                  '{"katas": {}, "round": {"kata": 7}}', '[1, 2]'])
def test_a_state_file_of_the_wrong_shape_is_set_aside(repo, text):
    cli(repo, "kata", "1")
    (repo / "work" / "state.json").write_text(text)
    code, out = cli(repo, "list")
    assert code == 0 and "set aside" in out and "not started" in out
    assert [p.read_text() for p in (repo / "work").glob("state.json.corrupt-*")] == [text]


def test_a_state_file_that_cannot_be_written_is_one_line_and_leaves_no_temporary_file(repo):
    import resource
    cli(repo, "kata", "1")
    before = (repo / "work" / "state.json").read_text()

    def small_files():  # every write past 40 bytes fails (EFBIG), as on a full disk; stdout is a pipe
        resource.setrlimit(resource.RLIMIT_FSIZE, (40, 40))
    r = subprocess.run([sys.executable, "-m", "grpo_katas.practice.cli", "hint", "1"], cwd=repo, capture_output=True,
                       text=True, timeout=120, env=ENV, preexec_fn=small_files)
    assert r.returncode == 2 and r.stdout.startswith("error: cannot save your progress") and not r.stderr
    assert sorted(p.name for p in (repo / "work").iterdir()) == [".state.lock", "01-kl-creep", "state.json"]
    assert (repo / "work" / "state.json").read_text() == before


@pytest.mark.slow
@pytest.mark.timeout(180)  # four training runs in fresh processes
def test_run_shows_every_metric_then_the_curves_beside_the_reference_which_is_cached(repo):
    cli(repo, "kata", "1")
    code, out = cli(repo, "run", "1", "--steps", "3")
    header = next(l for l in out.splitlines() if "reward" in l and "step" in l)
    assert code == 0 and all(h in header for h in ["max", "kl", "loss", "clip", "gnorm", "adv std", "len", "s/step"])
    assert "kata 1 (yours)" in out and "healthy (the same code, no bugs)" in out
    curves = {m[1]: m[0] for m in re.finditer(r"^ +(reward|KL|grad norm)  .*$", out, re.MULTILINE)}
    assert set(curves) == {"reward", "KL", "grad norm"}
    assert all(sum(c in "▁▂▃▄▅▆▇█" for c in line) == 6 for line in curves.values())  # 3 steps, yours and the reference
    assert "healthy:" in out and "(cached)" not in out
    assert len(list((repo / "work" / "cache").glob("reference-run-*.json"))) == 1
    code, out = cli(repo, "run", "1", "--steps", "3")
    assert code == 0 and "(cached)" in out


QUIET_LOOP = '''
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8
    max_new_tokens: int = 8
    num_iterations: int = 1


def train(policy, task, cfg, *, steps, batch_size, seed):  # no log=: the runner gets the list at the end
    return [{"reward_mean": 0.1 * i, "kl": math.nan if i == 2 else 0.01, "loss": 1.0, "ratio_dev": 0.5}
            for i in range(steps)]
'''


def test_run_shows_only_the_columns_a_loop_reports_and_marks_values_that_are_not_finite(repo):
    cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(QUIET_LOOP)
    code, out = cli(repo, "run", "2", "--steps", "4")
    header = next(l for l in out.splitlines() if "reward" in l and "step" in l)
    assert code == 0 and "|r-1|" in header and "s/step" in header and "gnorm" not in header and "clip" not in header
    kl = re.search(r"^ +KL  .*$", out, re.MULTILINE)[0]
    grad = re.search(r"^ +grad norm  .*$", out, re.MULTILINE)[0]
    assert "×" in kl and "not reported" in grad


def test_a_data_parallel_run_is_a_row_per_rank_not_a_column_per_rank():
    from grpo_katas.practice.render import run_table
    rows = [{"step": s, "reward_mean": 0.1 * s, "kl": 0.0, "reward_mean@1": 0.2 * s, "kl@1": 0.01} for s in (1, 2)]
    table = run_table(rows, "two ranks", width=80).renderables[-1]
    assert [c.header for c in table.columns] == ["step", "rank", "reward", "kl"] and table.row_count == 4
    assert list(table.columns[1].cells) == ["0", "1", "0", "1"] and list(table.columns[2].cells)[1] == "0.200"


def test_a_data_parallel_run_is_compared_by_its_mean_over_ranks_whichever_a_loop_logs():
    """A loop that logs the mean over ranks on every rank and one that logs each rank's own compare as the same
    quantity: the mean over ranks (rank 0's own reward differs from the mean, 0.4 against 0.5)."""
    from grpo_katas.practice.render import over_ranks
    from grpo_katas.training.curves import summarize
    global_mean = [{"step": s, "reward_mean": 0.5, "reward_mean@1": 0.5, "kl": 0.1, "kl@1": 0.3} for s in (1, 2)]
    own = [{"step": s, "reward_mean": 0.4, "reward_mean@1": 0.6, "kl": 0.2, "kl@1": 0.2} for s in (1, 2)]
    assert summarize(over_ranks(global_mean)).last == summarize(over_ranks(own)).last == pytest.approx(0.5)
    assert summarize(over_ranks(own), "kl").last == pytest.approx(0.2) and over_ranks(own)[0]["step"] == 1


ROW = {"step": 40, "reward_mean": 0.123, "reward_max": 1.0, "kl": 12.3456, "loss": -0.0123, "clip_frac": 0.12,
       "grad_norm": 123.45, "adv_std": 0.94, "completion_len": 5.1, "ratio_dev": 0.006, "seconds": 1.16, "dt": 1.15}


@pytest.mark.parametrize("width", [80, 64, 48, 30])
def test_the_run_table_fits_the_terminal_with_the_briefs_columns_first_and_names_what_it_drops(width):
    """Columns are dropped whole, never cut, the ones the brief cites last; the loop's own step time (the script
    codebase's dt) never makes a second time column."""
    from rich.console import Console

    from grpo_katas.practice.render import run_table
    from grpo_katas.training.curves import RUN_COLUMNS
    console = Console(width=width, record=True)
    console.print(run_table([ROW], "kata 14: work/14-timid-updates/grpo.py", width=width, cited=("adv_std", "kl")))
    lines = console.export_text().splitlines()
    header = next(l for l in lines if l.startswith("step"))
    assert "…" not in "".join(lines) and max(map(len, lines)) <= width and "dt" not in header.split()
    assert "adv std" in header and "kl" in header.split() and "12.3456" in "".join(lines)
    dropped = [h for k, h, _ in RUN_COLUMNS if k in ROW and h not in header]
    note = " ".join(lines[1:lines.index(header)])
    assert (width == 80) == (not dropped) and all(h in note for h in dropped) and "dt" not in note


PRINTING_LOOP = '''
import sys
from dataclasses import dataclass

print("imported")


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8
    max_new_tokens: int = 8
    num_iterations: int = 1


def train(policy, task, cfg, *, steps, batch_size, seed, log):
    for step in range(1, steps + 1):
        print(f"to stdout at step {step}")
        print(f"to stderr at step {step}", file=sys.stderr)
        print('{"event": "done", "steps": 0}')  # the runner's words, printed by the loop: output like any other
        for i in range(500):
            print(f"hot {step}.{i}")
        log({"reward_mean": 0.1 * step, "kl": 0.0, "loss": 1.0})
'''


def test_run_shows_what_the_loop_prints_by_step_capped_with_all_of_it_in_run_log(repo):
    cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(PRINTING_LOOP)
    code, out = cli(repo, "run", "2", "--steps", "3")
    assert code == 0 and re.search(r"^3 +0.300 ", out, re.MULTILINE), out  # the events came through whole
    for step in (1, 2, 3):
        assert f"{step:>4} │ to stdout at step {step}" in out and f"{step:>4} │ to stderr at step {step}" in out
        assert f'{step:>4} │ {{"event": "done", "steps": 0}}' in out
        assert re.search(rf"… 48\d more lines in step {step} \(all in work/02-reward-slide/run.log\)", out)
    assert "   1 │ imported" in out and len(out.splitlines()) < 120
    log = (copy_of(repo, 2).parent / "run.log").read_text()
    assert "hot 3.499" in log and "to stderr at step 3" in log


@pytest.mark.plot
def test_run_writes_curves_it_cannot_save_as_one_line_after_the_run(repo):
    pytest.importorskip("matplotlib")
    cli(repo, "kata", "2")
    (copy_of(repo, 2).parent / "run.png").mkdir()  # what stands where run.png goes cannot be written, even as root
    code, out = cli(repo, "run", "2", "--steps", "2")
    assert code == 0 and "cannot write work/02-reward-slide/run.png" in out and "healthy:" in out


def test_check_on_any_file_prints_the_component_table_never_the_checks_source(repo):
    code, out = make(repo, "check", "TARGET=katas/07-flat-kl/grpo.py")
    assert code == 1 and "component" in out and "training" in out, out
    assert out.strip().splitlines()[-1] == f"{n_checks() - 1} of {n_checks()} checks pass"  # the last line: ours
    assert "checks/test_" not in out and "assert " not in out and "def test" not in out
    code, out = make(repo, "check", "TARGET=katas")
    assert code == 1 and out.strip() == "error: katas: a folder, not a file"


@pytest.mark.parametrize("force", ["no", "0", "false"])
def test_force_no_means_no(repo, force):
    code, out = make(repo, "solution", "N=1", f"FORCE={force}")
    assert code == 1 and "not solved yet" in out and "kl-sign-flipped" not in out
    assert not (repo / "work" / "state.json").exists()  # nothing recorded
    code, out = make(repo, "solution", "N=1", "FORCE=maybe")
    assert code == 1 and len(out.strip().splitlines()) == 1 and "'maybe'" in out


def test_yes_no_means_no(repo):
    cli(repo, "kata", "1")
    copy_of(repo).write_text("my work\n")
    code, out = make(repo, "reset", "N=1", "YES=no")
    assert code == 1 and "asks for confirmation" in out and copy_of(repo).read_text() == "my work\n"


def test_a_working_copy_that_is_a_folder_is_one_line_and_reset_keeps_it(repo):
    (repo / "work" / "01-kl-creep" / "grpo.py").mkdir(parents=True)
    (repo / "work" / "01-kl-creep" / "grpo.py" / "notes.txt").write_text("mine")
    for command in ("check", "run", "kata"):
        code, out = cli(repo, command, "1")
        assert code == 2 and "work/01-kl-creep/grpo.py is a folder, not your working copy" in out, out
    code, out = cli(repo, "reset", "1", "--yes")
    assert code == 0 and copy_of(repo).is_file()
    kept = list((repo / "work" / "01-kl-creep" / "backups").glob("*/notes.txt"))
    assert [k.read_text() for k in kept] == ["mine"]


def test_a_work_folder_that_cannot_be_written_is_one_line(repo):
    (repo / "work").write_text("")  # a file where work/ should be: no user can write into it, root included
    for args in (["kata", "1"], ["hint", "1"], ["reset", "1", "--yes"], ["list"]):
        code, out = cli(repo, *args)
        assert code == 2 and out.startswith("error: cannot ") and len(out.strip().splitlines()) == 1, (args, out)


def test_a_kata_folder_that_cannot_be_written_is_one_line(repo):
    (repo / "work").mkdir()
    (repo / "work" / "01-kl-creep").write_text("")
    for args in (["kata", "1"], ["reset", "1", "--yes"]):
        code, out = cli(repo, *args)
        assert code == 2 and out.startswith("error: cannot write work/01-kl-creep"), (args, out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_work_folder_is_one_line(repo):
    (repo / "work").mkdir(mode=0o555)
    code, out = cli(repo, "kata", "1")
    assert code == 2 and "Permission denied" in out and len(out.strip().splitlines()) == 1


def test_a_start_time_that_is_not_a_time_is_set_aside_and_two_in_one_second_are_both_kept(repo):
    cli(repo, "kata", "1")
    texts = ['{"katas": {"1": {"hints": 0, "started": "yesterday"}}}', '{"katas": {"1": {"hints": 0, '
             '"started": "2024-01-01T00:00:00"}}}']  # the second has no timezone
    for text in texts:
        (repo / "work" / "state.json").write_text(text)
        code, out = cli(repo, "list")
        assert code == 0 and "set aside" in out
    assert sorted(p.read_text() for p in (repo / "work").glob("state.json.corrupt-*")) == sorted(texts)


def test_two_commands_changing_progress_at_once_lose_nothing(repo):
    """Each change is made on the state as it is under the lock: 2 x 40 changes at once give 80."""
    script = ("from grpo_katas.practice import progress\n"
              "for _ in range(40):\n"
              "    with progress.update() as s:\n"
              "        s['katas'].setdefault('1', {'hints': 0})['hints'] += 1\n")
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=repo, env=ENV) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert state(repo)["katas"]["1"]["hints"] == 80


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hints_taken_while_a_check_runs_are_kept(repo):
    cli(repo, "kata", "1")
    shutil.copyfile(repo / "solutions" / "grpo.py", copy_of(repo))
    check = subprocess.Popen([sys.executable, "-m", "grpo_katas.practice.cli", "check", "1"], cwd=repo, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(3):
        assert cli(repo, "hint", "1")[0] == 0
    out, _ = check.communicate(timeout=170)
    record = state(repo)["katas"]["1"]
    assert check.returncode == 0 and "Solved" in out and record["hints"] == 3 and record["solved"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_checks_show_progress_on_a_terminal_and_ctrl_c_is_an_interruption_not_a_failure(repo):
    """A spinner while the checks run, though pytest holds the process's stdout while it runs them."""
    cli(repo, "kata", "1")
    code, text = on_a_terminal(repo, ["check", "1"])
    assert code == 1 and "the hidden checks on work/01-kl-creep/grpo.py" in text and "component" in text
    assert text.index("the hidden checks on") < text.index("component")
    code, text = on_a_terminal(repo, ["check", "1"], until="the hidden checks on")
    assert code == 130 and "interrupted; nothing was recorded" in text and not ours_raised(text), text


@pytest.mark.parametrize("columns", [80, 50])
def test_a_long_command_s_spinner_and_seconds_show_at_any_width(repo, columns):
    """At 80 columns the checks' line was cut before its spinner and seconds: a user saw one still line for 13 s."""
    code = ("import time\nfrom grpo_katas.practice import render\n"
            "with render.busy('the hidden checks on ' + 'work/a-long-path/' * 8 + 'grpo.py'):\n    time.sleep(2.5)\n")
    status, text = on_a_terminal(repo, [], command=[sys.executable, "-c", code], columns=columns,
                                 env={"COLUMNS": str(columns)})
    lines = [line for line in plain(text).splitlines() if "the hidden checks" in line]
    assert status == 0 and lines and max(map(len, lines)) <= columns, lines
    assert any("0:00:02 the hidden checks on work/" in line for line in lines), lines


APPLIED = {  # each value reaches the command single-quoted, as typed; a target's own values after --
    "kata": {"N": "-- '7'"},
    "next": {"TIER": "--tier '7'", "CODEBASE": "--codebase '7'"},
    "run": {"N": "-- '7'", "STEPS": "--steps '7'", "SET": "--set '7'", "NPROC": "--nproc '7'",
            "MODEL": "--hf-model '7'", "TASK": "--task '7'", "SEED": "--seed '7'", "DEVICE": "--device '7'",
            "BUDGET": "--budget '7'"},
    "check": {"N": "-- '7'", "TARGET": "--target '7'", "SEED": "--seed '7'", "ALL": "--all='7'",
              "COMPONENT": "--component '7'", "FORMAT": "--format '7'"},
    "watch": {"N": "-- '7'", "SEED": "--seed '7'", "ALL": "--all='7'", "COMPONENT": "--component '7'"},
    "hint": {"N": "hint -- '7'"},
    "solution": {"N": "-- '7'", "FORCE": "--force='7'"},
    "reset": {"N": "-- '7'", "YES": "--yes='7'"},
    "list": {"TIER": "--tier '7'", "CODEBASE": "--codebase '7'"},
    "drill": {"TIER": "--tier '7'", "BUGS": "--bugs '7'", "CODEBASE": "--codebase '7'", "SEED": "--seed '7'"},
    "mock": {"N": "-- '7'", "TIER": "--tier '7'", "MINUTES": "--minutes '7'"},
    "mock-notes": {"N": "mock-notes -- '7'"},
    "bundle": {"N": "bundle -- '7'", "OUT": "'7'"},
    "grade": {"N": "-- '7'", "SUBMISSION": "'7'", "OUT": "'7'", "SEED": "--seed '7'"},
    "train": {"TASK": "--task '7'", "STEPS": "--steps '7'", "DEVICE": "--device '7'", "SET": "--set '7'",
              "OUT": "--out '7'", "RESUME": "--resume='7'", "COMPILE": "--compile='7'", "NPROC": "--nproc '7'",
              "MODEL": "--hf-model '7'", "CHECKPOINTING": "--gradient-checkpointing='7'", "SEED": "--seed '7'",
              "EVAL_EVERY": "--eval-every '7'", "SAMPLES": "--samples '7'"},
    "bench": {"DEVICE": "--device '7'", "MODEL": "--hf-model '7'"},
    "gpu-check": {"MODEL": "--hf-model '7'"},
    "verify": {"FRESH": None},  # FRESH=1 adds --fresh; any other value is the default, a full-but-reusing proof
}


def make_variables() -> list:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(r"^VARIABLES := (.*)$", text, re.MULTILINE)[1].split()


def test_every_setting_a_target_takes_reaches_its_command(repo):
    """make -n prints each target's command: every setting it takes is there, as its flag."""
    assert set(APPLIED) <= set(make_targets()) and {v for t in APPLIED.values() for v in t} <= set(make_variables())
    for target, settings in APPLIED.items():
        for var, flag in settings.items():
            r = subprocess.run(["make", "-n", "-o", ".venv/.installed", target, f"{var}=7"], cwd=repo,
                               capture_output=True, text=True, timeout=60, env=ENV)
            assert r.returncode == 0 and (flag is None or flag in r.stdout), (target, var, r.stdout + r.stderr)
    r = subprocess.run(["make", "-n", "-o", ".venv/.installed", "verify", "FRESH=1"], cwd=repo, capture_output=True,
                       text=True, timeout=60, env=ENV)
    assert "--fresh" in r.stdout


def test_every_setting_a_target_does_not_take_is_refused_in_one_line(repo):
    """Each target x setting pair that is not applied (APPLIED) is refused by make, naming both, before the command
    runs (make check MODEL=... once judged the lab model without a word); run side by side, a few at a time."""
    from tests.cli_helpers import fake_venv
    fake_venv(repo)
    pairs = [(t, v) for t in make_targets() for v in make_variables() if v not in APPLIED.get(t, {})]
    assert len(pairs) > 500 and ("check", "MODEL") in pairs and ("stats", "N") in pairs
    for i in range(0, len(pairs), 16):
        procs = [(t, v, subprocess.Popen(["make", "-s", t, f"{v}=7"], cwd=repo, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, env=ENV, stdin=subprocess.DEVNULL))
                 for t, v in pairs[i:i + 16]]
        for t, v, proc in procs:
            out = proc.communicate(timeout=60)[0]
            assert proc.returncode == 1 and out.startswith(f"error: make {t} does not take {v}=: ") \
                and len(out.strip().splitlines()) == 1, (t, v, out)
    assert not (repo / "work").exists()  # nothing ran
    code, out = make(repo, "check", "N=14", "MODEL=runs/tiny-llama")
    assert code == 1 and "the checks judge your functions on the lab model" in out


def test_any_other_variable_on_make_s_command_line_is_refused_naming_the_setting_it_is_a_near_miss_of(repo):
    """STEP=2, seed=5, FOO=1: make once ran 40 steps, judged seed 0 and started the kata without a word. Each is
    refused in one line before anything runs (no Python is started: well under a second), and so are N= with
    TARGET= and a FRESH= that is no yes or no."""
    from tests.cli_helpers import fake_venv
    fake_venv(repo)
    cases = [(("run", "N=1", "STEP=2"), "make run does not take STEP=: did you mean STEPS=? it takes N STEPS"),
             (("check", "N=1", "seed=5"), "make check does not take seed=: did you mean SEED=?"),
             (("run", "N=1", "stepss=3"), "make run does not take stepss=: did you mean STEPS=?"),
             (("list", "tier=x"), "make list does not take tier=: did you mean TIER=?"),
             (("kata", "N=3", "FOO=1"), "make kata does not take FOO=: it takes N ("),
             (("kata", "N=3", "A'B=1"), "make kata does not take A'B=: it takes N ("),
             (("check", "N=3", "TARGET=solutions/grpo.py"), "make check takes N= (your copy of a kata) or TARGET="),
             (("verify", "FRESH=maybe"), "takes yes or no (1 or 0), got 'maybe'")]
    for args, words in cases:
        start = time.monotonic()
        r = subprocess.run(["make", "-s", *args], cwd=repo, capture_output=True, text=True, timeout=60, env=ENV)
        seconds, out = time.monotonic() - start, r.stdout + r.stderr
        assert r.returncode == 1 and words in out and len(out.strip().splitlines()) == 1, (args, out)
        assert seconds < (5 if args[0] == "verify" else 2), (args, seconds)  # verify's refusal is Python's own
    assert not (repo / "work").exists()  # nothing ran
    make(repo, "kata", "N=1")  # a bad value: in the words of the setting typed, never of the CLI's flag
    for args, words in [(("run", "N=1", "STEPS=0"), "error: STEPS=: must be at least 1, got 0"),
                        (("run", "N=1", "SEED=123456789012345678901234"), "error: SEED=: must be a whole number"),
                        (("mock", "N=1", "MINUTES=-3"), "error: MINUTES=: must be a number above 0")]:
        code, out = make(repo, *args)
        assert code == 1 and out.strip().startswith(words) and "--" not in out, (args, out)


def test_a_target_that_does_not_exist_is_one_line_even_where_a_folder_has_its_name(repo):
    (repo / "runs").mkdir()
    for flags in (("-s",), ()):
        code, out = make(repo, "runs", flags=flags)  # a typo of `make run`; make took runs/ to be up to date
        assert code == 1 and out.strip() == "error: there is no target 'runs'; make help lists them", out


def test_make_help_fits_80_columns_and_names_every_setting():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert max(map(len, out.splitlines())) <= 80
    assert [v for v in make_variables() if f"{v}=" not in out] == []


def test_ctrl_c_and_a_declined_reset_end_with_the_commands_own_line_not_makes(repo):
    from tests.cli_helpers import fake_venv
    fake_venv(repo)
    cli(repo, "kata", "1")
    code, out = on_a_terminal(repo, [], command=["make", "reset", "N=1"], until="[y/N]", keys="n\n")
    assert code == 1 and out.strip().splitlines()[-1] == "nothing changed" and "make:" not in out, out
    code, out = on_a_terminal(repo, [], command=["make", "check", "N=1"], until="the hidden checks on")
    assert code == -2 and "interrupted" in out and "make:" not in out and "Interrupt" not in out, out  # 130


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_watch_stopped_with_ctrl_c_typed_in_a_terminal_exits_0_through_make(repo):
    """The terminal would send SIGINT to make too, which then ends with 130 whatever watch says; watch reads Ctrl-C
    as a key instead, so make exits 0 as docs/practice.md says."""
    from tests.cli_helpers import fake_venv
    fake_venv(repo)
    cli(repo, "kata", "1")
    code, out = on_a_terminal(repo, [], command=["make", "watch", "N=1"], until="bugs fixed", keys="\x03")
    assert code == 0 and "0 of 1 bugs fixed" in out and "make:" not in out and "Traceback" not in out, out


@pytest.mark.parametrize("key", ["\x03", "q"])
def test_watch_stops_mid_check_within_a_second_and_says_so(repo, key):
    """q waited for the check to end, and Ctrl-C stopped it without a word."""
    cli(repo, "kata", "1")
    started = time.monotonic()
    code, out = on_a_terminal(repo, ["watch", "1"], until="the hidden checks on", keys=key)
    assert code == 0 and time.monotonic() - started < 10, out  # the checks and the brief's run alone take longer
    assert plain(out).strip().splitlines()[-1] == ("stopped watching kata 1; a check cut short records nothing; "
                                                   "`make watch N=1` takes it up again")


@pytest.mark.slow
def test_run_takes_the_seed_and_device_given_and_its_header_says_so(repo):
    import torch
    cli(repo, "kata", "1")
    code, out = cli(repo, "run", "1", "--steps", "1", "--seed", "3")
    assert code == 0 and re.search(r"^sum task, seed 3, 1 steps, the lab model \(2x64\) on cpu; ", out, re.M), out
    if not torch.cuda.is_available():
        code, out = cli(repo, "run", "1", "--steps", "1", "--device", "cuda")
        assert code == 2 and out.strip() == "error: --device cuda asked for, but torch sees no CUDA device", out
    if not torch.backends.mps.is_available():
        code, out = cli(repo, "run", "1", "--steps", "1", "--device", "mps")
        assert code == 2 and out.strip().startswith("error: --device mps asked for, but torch sees no Apple GPU"), out


HANGING_LOOP = '''
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8
    max_new_tokens: int = 8
    num_iterations: int = 1


def spin(step):
    while True:
        step += 1


def wait(step):
    time.sleep(1000)


def train(policy, task, cfg, *, steps, batch_size, seed, log):
    for step in range(1, steps + 1):
        if step == 2:
            STUCK(step)
        log({"reward_mean": 0.1 * step, "kl": 0.0, "loss": 1.0})
'''


@pytest.mark.parametrize("stuck, why", [("spin", r"it used [34] CPU-seconds"), ("wait", r"it used no CPU for [34] s")])
def test_a_loop_that_hangs_is_stopped_by_its_budget_and_shows_where_it_was(repo, stuck, why):
    cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(HANGING_LOOP.replace("STUCK", stuck))
    code, out = cli(repo, "run", "2", "--steps", "3", "--budget", "3")
    lines = {"spin": ("step += 1", "while True:"), "wait": ("time.sleep(1000)",)}[stuck]  # a spin stops on either
    assert code == 1 and re.search(f"your loop was stopped in step 2: {why}", out) and "BUDGET=3" in out, out
    stack = out[out.index("Stack of your loop"):]
    assert f'File "work/02-reward-slide/grpo.py", line' in stack and f"in {stuck}" in stack
    assert any(line in stack for line in lines), stack
    assert "healthy:" in out  # the steps before the hang, beside the healthy run


@pytest.mark.timeout(180)
def test_a_long_step_shows_it_is_alive_and_ctrl_c_says_where_the_loop_was(repo):
    cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(HANGING_LOOP.replace("STUCK", "spin"))
    code, out = on_a_terminal(repo, ["run", "2", "--steps", "3"], until="CPU-s, at grpo.py:")
    out = plain(out)
    assert re.search(r"step 2: \d+ s so far, [\d.]+ of 60 CPU-s, at grpo.py:1[45] in spin", out), out
    assert code == 130 and re.search(r"interrupted; your loop was at work/02-reward-slide/grpo.py:1[45]", out), out
    assert "step += 1" in out or "while True:" in out


@pytest.mark.slow
def test_a_runs_log_keeps_the_one_before(repo):
    cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(PRINTING_LOOP)
    log = copy_of(repo, 2).parent / "run.log"
    assert cli(repo, "run", "2", "--steps", "1")[0] == 0 and "hot 1.499" in log.read_text()
    hanging = HANGING_LOOP.replace("STUCK", "spin").replace("import time", "import time\nprint('mine')")
    copy_of(repo, 2).write_text(hanging)
    cli(repo, "run", "2", "--steps", "3", "--budget", "2")  # a run that does not finish
    assert log.read_text().strip() == "mine" and "hot 1.499" in log.with_name("run.log.1").read_text()


@pytest.mark.timeout(180)
def test_check_takes_a_seed_one_component_lists_every_failure_and_speaks_json(repo):
    import json
    cli(repo, "kata", "1")
    code, out = cli(repo, "check", "1", "--seed", "5", "--component", "kl", "--all")
    assert code == 1 and "kata 1: work/01-kl-creep/grpo.py, seed 5, kl only" in out, out
    rows = [line.split()[1] for line in out.splitlines() if line.startswith("│")]
    assert rows == ["kl"] and out.strip().splitlines()[-1] == "2 of 4 kl checks pass"  # the kl row alone
    listed = out[out.index("every failing check (2)"):]
    assert listed.count("kl::") == 2 and "expected" in listed  # each failing check with what it observed
    assert "bugs fixed" not in out and "solved" not in state(repo)["katas"]["1"]  # one component records nothing
    code, out = cli(repo, "check", "1", "--component", "kl", "--format", "json")
    report = json.loads(out)  # stdout holds the JSON alone
    assert code == 1 and report["schema"] == "grpo-katas/check/1" and report["kata"] == "1"
    assert (report["passed"], report["total"], report["component"], report["seed"]) == (2, 4, "kl", 0)
    assert report["components"] == [{"name": "kl", "passed": 2, "total": 4}] and report["bugs"] is None
    assert {c["id"].split("::")[0] for c in report["checks"]} == {"kl"} and all(
        set(c) == {"id", "component", "name", "passed", "message", "kind"} for c in report["checks"])
    code, out = cli(repo, "check", "1", "--component", "nope")
    assert code == 2 and "invalid choice: 'nope'" in out and len(out.strip().splitlines()) == 1


def test_a_reset_restores_the_file_and_keeps_the_record(repo):
    cli(repo, "kata", "3")
    for _ in range(2):
        cli(repo, "hint", "3")
    record = state(repo)["katas"]["3"]
    record.update(solved="2024-01-01T00:10:00+00:00", seconds=660.0, hints_before_solving=2)
    (repo / "work" / "state.json").write_text(__import__("json").dumps({"katas": {"3": record}}))
    copy_of(repo, 3).write_text("my fix\n")
    code, out = make(repo, "reset", "N=3", "YES=1")
    assert code == 0 and copy_of(repo, 3).read_text() == next(repo.glob("katas/03-*/grpo.py")).read_text()
    after = state(repo)["katas"]["3"]
    assert {k: after[k] for k in ("solved", "seconds", "hints", "hints_before_solving")} == \
        {"solved": record["solved"], "seconds": 660.0, "hints": 2, "hints_before_solving": 2} and after["resets"] == 1
    line = row(cli(repo, "list")[1], 3)
    assert "solved" in line and "11 min" in line and line.split()[-1] == "2"


def test_a_corrupt_state_file_is_kept_and_the_records_that_parse_are_recovered(repo):
    import json
    cli(repo, "kata", "1")
    cli(repo, "hint", "1")
    cli(repo, "kata", "2")
    text = (repo / "work" / "state.json").read_text()
    cut = text[:text.index('"2"') + 12]  # cut short inside kata 2's record, as a full disk or a crash leaves it
    (repo / "work" / "state.json").write_text(cut)
    code, out = cli(repo, "list")
    assert code == 0 and "set aside as state.json.corrupt-" in out
    assert "kept what could be read of it: 1 kata (1)" in out
    assert [p.read_text() for p in (repo / "work").glob("state.json.corrupt-*")] == [cut]  # kept, named
    assert "in progress" in row(out, 1) and row(out, 1).split()[-1] == "1"  # kata 1's hint survived
    assert state(repo)["katas"]["1"]["hints"] == 1 and "2" not in state(repo)["katas"]


def test_the_clock_counts_time_spent_and_a_pause_counts_at_most_the_idle_threshold():
    from datetime import datetime, timedelta, timezone

    from grpo_katas.practice import progress
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    record = {"hints": 0, "started": t0.isoformat()}
    for minutes in (3, 5, 65, 66):  # commands at 3 and 5 min, then back after an hour away, then a minute more
        progress.tick(record, t0 + timedelta(minutes=minutes))
    assert record["spent"] == (5 + 10 + 1) * 60 and progress.IDLE_SECONDS == 600  # the hour away counts as 10 min
    assert record["active_at"] == (t0 + timedelta(minutes=66)).isoformat()
    progress.tick(record, t0 + timedelta(minutes=60))  # a save older than the last command counts nothing
    assert record["spent"] == 16 * 60


def test_next_starts_the_first_kata_you_have_not_solved_by_tier_then_number(repo):
    import json
    code, out = cli(repo, "next")
    assert code == 0 and "kata 1: 01-kl-creep" in out and copy_of(repo, 1).exists()
    solved = {"hints": 0, "solved": "2024-01-01T00:00:00+00:00", "seconds": 60.0}
    (repo / "work" / "state.json").write_text(json.dumps({"katas": {"1": solved}}))
    code, out = cli(repo, "next")
    assert code == 0 and "kata 2: 02-reward-slide" in out and "Your working copy" in out
    code, out = cli(repo, "next")  # kata 2 is started, not solved: it is resumed
    assert code == 0 and "kata 2: 02-reward-slide" in out and "Resuming" in out
    code, out = make(repo, "next", "TIER=interview")
    assert code == 0 and "kata 18: 18-phone-screen-a" in out
    # the warm-ups solved, kata 24 is the last of them; the practice tier solved too, the frontier comes before 18
    for last_solved, then in [(8, "kata 24: 24-"), (17, "kata 25: 25-")]:
        done = {str(n): solved for n in [*range(1, last_solved + 1), 24] if n != 24 or last_solved > 8}
        (repo / "work" / "state.json").write_text(json.dumps({"katas": done}))
        code, out = cli(repo, "next")
        assert code == 0 and then in out, out[:300]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_watch_moves_on_to_the_next_kata_once_solved(repo):
    """Without a terminal there is no n to press: it starts the next unsolved kata and watches it."""
    import signal
    import time
    cli(repo, "kata", "1")
    shutil.copyfile(repo / "solutions" / "codebases" / "script.py", copy_of(repo))  # kata 1's codebase, healed
    proc = interruptible(["watch", "1", "--interval", "0.2"], repo)
    seen, deadline = "", time.time() + 200
    while "watching work/02-" not in seen and time.time() < deadline:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "Solved" in seen and "moving on to kata 2" in seen and "kata 2: 02-reward-slide" in seen, seen + out
    assert proc.returncode == 0 and copy_of(repo, 2).exists() and state(repo)["katas"]["1"]["solved"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_watch_on_a_terminal_offers_the_next_kata_and_n_starts_it(repo):
    cli(repo, "kata", "1")
    shutil.copyfile(repo / "solutions" / "codebases" / "script.py", copy_of(repo))
    code, out = on_a_terminal(repo, ["watch", "1"], until=["press n to start it", "watching work/02-"],
                              keys=["n", "\x03"])
    assert code == 0 and "next: kata 2, Reward slides from step one" in out and "kata 2: 02-reward-slide" in out
    assert "Solved" in out and copy_of(repo, 2).exists(), out


def made_drill(repo, number=1, solved=False):
    """A drill in work/drills/dN as `make drill` files it (its recipe sealed), without drawing and proving one."""
    import json

    from grpo_katas.practice.drills import seal
    folder = repo / "work" / "drills" / f"d{number}"
    folder.mkdir(parents=True)
    (folder / "grpo.py").write_text((repo / "solutions" / "codebases" / "core.py").read_text())
    (folder / "BRIEF.md").write_text(f"# Drill d{number}\n\nA run.\n\nRun it.\n")
    recipe = {"codebase": "core", "bugs": ["adv-no-eps", "kl-sign-flipped"], "seed": 3, "scheduled": False,
              "hints": ["a", "b", "c"]}
    (folder / "drill.json").write_text(json.dumps({"tier": "practice", "minutes": 25, "symptoms": [],
                                                   "made": "2024-01-01T00:00:00+00:00", "sealed": seal(recipe)}))
    if solved:
        (repo / "work" / "state.json").write_text(json.dumps({"katas": {f"d{number}": {
            "hints": 0, "solved": "2024-01-01T00:00:00+00:00", "seconds": 60.0}}}))


@pytest.mark.parametrize("width", [80, 120])
def test_the_list_has_codebase_and_bug_columns_drills_filters_and_fits_the_terminal(repo, width):
    made_drill(repo)
    code, out = cli(repo, "list", env={"COLUMNS": str(width)})
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) <= width and lines[0].split()[:6] == ["N", "kata", "tier", "codebase",
                                                                                    "bugs", "box"]
    assert row(out, 14).split()[-6:-3] == ["core", "2", "20"] and "d1" in out
    assert row(out, "d1").split()[3:6] == ["practice", "?", "2"]  # a drill's codebase is hidden until it is solved
    assert "time spent: from your commands and saves; a pause over 10 min counts as 10" in out  # how, said
    if width == 120:
        assert "The KL that would not stop" in out  # the whole title where there is room
    else:
        assert "…" in out and "A length that does not add up" not in out  # cut, never wrapped
        assert "The KL that would not stop" in out  # the time and hints columns, empty, leave it the room
    code, out = cli(repo, "list", "--tier", "interview", "--codebase", "core")
    numbers = [line.split()[0] for line in out.splitlines()[2:] if re.match(r"\s*\d+\s", line)]
    assert code == 0 and numbers == ["19", "21", "23", "33"] and "0/4 solved" in out
    assert "d1" not in cli(repo, "list", "--codebase", "core")[1]  # its codebase is not yours to know yet
    code, out = make(repo, "list", "TIER=expert")
    assert code == 1 and "invalid choice: 'expert'" in out and len(out.strip().splitlines()) == 1


def test_the_list_at_80_columns_keeps_every_number_and_status_after_reveals_and_hints(repo):
    """A reveal once made the status column so wide that the titles shrank to 5 characters and the kata numbers
    went; now a status adds a mark, said under the table, and only a title is ever cut."""
    for n in ("1", "14"):
        cli(repo, "solution", n, "--force")
        cli(repo, "kata", n)
    cli(repo, "hint", "13")
    code, out = cli(repo, "list", env={"COLUMNS": "80"})
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 80 and lines[0].split() == ["N", "kata", "tier", "codebase", "bugs",
                                                                             "box", "status", "time", "hints"]
    numbers = [line.split()[0] for line in lines if re.match(r"\s*(\d+|d\d+)\s", line)]
    assert numbers == [k.key for k in load_katas()], numbers
    assert re.search(r"core\s+2\s+20 min\s+in progress\*", row(out, 14)), row(out, 14)
    assert row(out, 13).split()[-1] == "1" and "* the solution revealed before it was solved" in out
    assert min(len(re.match(r"\s*\d+\s+(.*?)\s{2}", row(out, n))[1]) for n in (1, 14, 18)) >= 11


def test_a_solved_drill_shows_its_codebase_in_the_list(repo):
    made_drill(repo, solved=True)
    code, out = cli(repo, "list", "--codebase", "core")
    assert code == 0 and row(out, "d1").split()[3:5] == ["practice", "core"]


@pytest.mark.parametrize("width", [80, 120])
def test_stats_and_the_curves_fit_the_terminal_and_use_its_width(width):
    from rich.console import Console

    from grpo_katas.catalogue.katas import load_bugs
    from grpo_katas.practice import render
    render.console = Console(width=width, record=True, highlight=False)
    rows = [("logprobs-temperature-after-softmax", 3, 2 / 3, 412, "2024-01-09T00:00:00+00:00", 2),
            ("adv-no-eps", 1, 1.0, 60, "2024-01-02T00:00:00+00:00", 1)]
    render.stats_table(rows, load_bugs())
    history = [{"step": i, "reward_mean": 0.1 + 0.01 * i, "kl": 0.01 * i, "grad_norm": 0.3} for i in range(1, 41)]
    render.curves("kata 14", history, history, 40, None, which=render.curves_for(["adv_std"]))
    text = render.console.export_text()
    assert max(map(len, text.splitlines())) <= width
    assert "healthy (the same code, no bugs)" in text and "kata 14 (yours)" in text
    assert ("logprobs-temperature-after-softmax" in text) == (width == 120) and "adv-no-eps" in text
    sparkline = next(line for line in text.splitlines() if line.startswith("  reward")).split()[1]
    assert len(sparkline) == (32 if width == 80 else 40)  # as wide as the terminal allows, at most one per step


FAKE_PY = '''#!/bin/sh
# python3 -m venv DIR, as far as make setup needs it: a venv whose pip and python do nothing (pip fails with FAIL=pip)
mkdir -p "$3/bin" "$3/lib"
printf '#!/bin/sh\\n[ "$FAIL" = pip ] && { echo "pip: no such package" >&2; exit 1; }\\nexit 0\\n' > "$3/bin/pip"
printf '#!/bin/sh\\nexit 0\\n' > "$3/bin/python"
chmod +x "$3/bin/pip" "$3/bin/python"
'''


def test_make_setup_makes_the_venv_once_and_a_failure_is_its_own_line(repo, tmp_path):
    """Its steps run however make ends a target (they are marked to run in question mode too)."""
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    for env, code, installed in (({"FAIL": "pip"}, 1, False), ({}, 0, True)):
        r = subprocess.run(["make", "setup", f"PY={fake}"], cwd=repo, capture_output=True, text=True, timeout=120,
                           env={**ENV, **env})
        out = r.stdout + r.stderr
        assert r.returncode == code and (repo / ".venv" / ".installed").exists() == installed, out
        assert out.startswith("setting up .venv") and "make:" not in out, out
    r = subprocess.run(["make", "setup", f"PY={fake}"], cwd=repo, capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0 and r.stdout + r.stderr == (  # made once, and said so
        ".venv is up to date with pyproject.toml and constraints.txt; nothing to do\n")
