"""Practice where there is no /proc and no bubblewrap (a Mac's path, issue 46), run here on Linux with the Linux-only
parts switched off (grpo_katas.judge.sandbox.LINUX): `ps` tells a run's process tree and the CPU time it has used, the
runner alone is asked for its stack (once it has said anything, it catches the signal), no address-space limit or
death signal is set, and the checks and the brief's run are made in a plain process.
Run: pytest tests/test_without_proc.py"""
import re
import shutil
import subprocess
import sys
import time

import pytest

from grpo_katas.judge import sandbox
from tests.cli_helpers import ENV, copy_of, on_a_terminal, ours_raised, plain
from tests.test_cli import HANGING_LOOP

# the CLI as a Mac runs it: the module's switch off before anything looks at it
AS_ON_A_MAC = ("import runpy; import grpo_katas.judge.sandbox as s; s.LINUX = False; "
               "runpy.run_module('grpo_katas.practice.cli', run_name='__main__', alter_sys=True)")
MAC_CLI = [sys.executable, "-c", AS_ON_A_MAC]


def mac_cli(repo, *args):
    r = subprocess.run([*MAC_CLI, *args], cwd=repo, capture_output=True, text=True, timeout=300, env=ENV)
    assert not ours_raised(r.stdout + r.stderr), r.stdout + r.stderr
    return r.returncode, r.stdout + r.stderr


TREE = """import os, time
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
if os.fork() == 0:
    spin(2.5)
    time.sleep(60)
spin(1.5)
print("ready", flush=True)
time.sleep(60)
"""


def test_ps_tells_a_tree_and_its_cpu_time_as_proc_does(monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.5)  # the child's spin ends too
        tree, cpu = sandbox.descendants(proc.pid), sandbox.cpu_seconds(proc.pid)
        monkeypatch.setattr(sandbox, "LINUX", False)
        assert sandbox.descendants(proc.pid) == tree and len(tree) == 2
        # procps prints whole seconds: each of the two processes' time is cut by up to one
        assert cpu - 2 <= sandbox.cpu_seconds(proc.pid) <= cpu and cpu >= 3.5, (cpu, sandbox.cpu_seconds(proc.pid))
    finally:
        sandbox.kill(proc)


@pytest.mark.parametrize("text, seconds", [("00:00:03", 3), ("1-02:03:04", 93784), ("3:04.50", 184.5),
                                           ("0:00.07", 0.07), ("12-00:00:00", 12 * 86400)])
def test_a_time_as_ps_prints_it_on_linux_or_macos(text, seconds):
    assert sandbox.clock_seconds(text) == pytest.approx(seconds)


@pytest.mark.slow
@pytest.mark.parametrize("stuck, why", [("spin", r"it used [3-5] CPU-seconds"), ("wait", r"it used no CPU for [3-5] s")])
def test_a_loop_that_hangs_is_stopped_by_its_budget_and_shows_where_it_was(repo, stuck, why):
    mac_cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(HANGING_LOOP.replace("STUCK", stuck))
    code, out = mac_cli(repo, "run", "2", "--steps", "3", "--budget", "3")
    assert code == 1 and re.search(f"your loop was stopped in step 2: {why}", out), out
    stack = out[out.index("Stack of your loop"):]
    assert 'File "work/02-reward-slide/grpo.py", line' in stack and f"in {stuck}" in stack, stack


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ctrl_c_says_where_the_loop_was(repo):
    mac_cli(repo, "kata", "2")
    copy_of(repo, 2).write_text(HANGING_LOOP.replace("STUCK", "spin"))
    code, out = on_a_terminal(repo, [], command=[*MAC_CLI, "run", "2", "--steps", "3"], until="CPU-s, at grpo.py:")
    out = plain(out)
    assert re.search(r"step 2: \d+ s so far, [\d.]+ of 60 CPU-s, at grpo.py:1[45] in spin", out), out
    assert code == 130 and re.search(r"interrupted; your loop was at work/02-reward-slide/grpo.py:1[45]", out), out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_fix_is_judged_solved_in_a_plain_process(repo):
    mac_cli(repo, "kata", "1")
    shutil.copyfile(repo / "solutions" / "grpo.py", copy_of(repo))
    code, out = mac_cli(repo, "check", "1")
    assert code == 0 and "1 of 1 bugs fixed" in out and "Solved" in out, out
