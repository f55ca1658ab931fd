"""grpo-katas tooling, in packages by concern, each a floor above the one before (tests/test_house.py keeps it so):

    training/   a loop's run (the runner, its configuration) and the reference trainer, bench, gpu-check
    catalogue/  the katas and bugs as data, drills read back, symptoms and the recorded runs
    judge/      the checks against a file in a sandbox, the brief's run, grading
    proof/      `make verify`: that the checks bite, and the static rules
    practice/   the CLI: make kata, run, check, drill, mock ...

This file holds what every floor shares: where things are, a user's error, a yes-or-no, a child's CPU time.
"""
import os
import resource
import subprocess
import sys
import warnings
from pathlib import Path


# numpy is not a dependency; torch says so on import, once per process, and it means nothing here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "solutions" / "grpo.py"
KATAS = ROOT / "katas"
CHECKS = ROOT / "checks"
WORK = ROOT / "work"   # your copies, progress, drills and rounds (git-ignored)


def _interrupted(kind, value, tb, default=sys.excepthook):
    """A Ctrl-C that reaches the top of a command (during its start, while torch imports, before the command's own
    handler is in place) is an interruption, not a crash: one line, no traceback; Python still ends the process
    as SIGINT does (exit status 130 in a shell)."""
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return
    default(kind, value, tb)


sys.excepthook = _interrupted


class UserError(Exception):
    """Something the user can fix: the CLI shows it as one line and exits with status 2."""


def yes_or_no(text) -> bool:
    """A switch as a user types it (FORCE=, YES=, RESUME=, SET="flag=..."): 1, y, yes, true or on mean yes; 0, n,
    no, false or off mean no; anything else is a ValueError, so that FORCE=no never means yes."""
    word = str(text).strip().lower()
    if word not in ("1", "y", "yes", "true", "on", "0", "n", "no", "false", "off"):
        raise ValueError(f"takes yes or no (1 or 0), got {text!r}")
    return word in ("1", "y", "yes", "true", "on")


def run_counted(cmd: list, **popen) -> tuple:
    """(exit status, CPU-seconds) of a command run to its end: its own CPU time and that of every process it waited
    for (os.wait4's account of it alone), so that work shared out over several commands at once can be costed one
    command at a time. `popen` as subprocess.Popen takes it; no pipes (nothing reads them while it runs)."""
    proc = subprocess.Popen(cmd, **popen)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def children_cpu() -> float:
    """CPU-seconds of the children this process has reaped so far (what run_counted counts of one command)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
