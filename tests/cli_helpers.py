"""Drive the practice CLI, and make, in a subprocess, as a user would."""
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from grpo_katas import ROOT

ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}


def n_checks() -> int:
    """How many checks there are (each a test function in checks/): the count a check table ends with."""
    from grpo_katas import CHECKS
    return sum(f.read_text().count("\ndef test_") for f in CHECKS.glob("test_*.py"))
OURS = re.compile(r'File "[^"]*/grpo_katas/')  # a traceback through the tooling: never acceptable


def ours_raised(text: str) -> bool:
    """Whether the output holds a traceback through this repository's own code. A loop's traceback (`make run`
    shows it, from the loop's own file on) is the candidate's to see; one through grpo_katas/ is a defect."""
    return bool(OURS.search(text)) or ("Traceback" in text and "your loop raised" not in text)


def cli(repo, *args, stdin=subprocess.DEVNULL, env=None):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.practice.cli", *args], cwd=repo, capture_output=True, text=True,
                       stdin=stdin, timeout=300, env={**ENV, **(env or {})})
    assert not ours_raised(r.stdout + r.stderr), r.stdout + r.stderr
    return r.returncode, r.stdout + r.stderr


def make(repo, *args, timeout=300, flags=("-s",)):
    """`make ARGS` in the repository copy, whose .venv is this interpreter (fake_venv). A command that fails ends
    with its own line and make adds none of its own ("make: *** [Makefile:85: check] Error 1" once did): the exit
    status through make is 0 or 1 (130 after Ctrl-C). `flags` are make's own (-s by default, as a user may not)."""
    if not (repo / ".venv" / ".installed").exists():
        fake_venv(repo)
    r = subprocess.run(["make", *flags, *args], cwd=repo, capture_output=True, text=True, timeout=timeout, env=ENV)
    out = r.stdout + r.stderr
    assert not ours_raised(out) and not re.search(r"^make(\[\d+\])?: ", out, re.MULTILINE), out
    return r.returncode, out


def default_sigint() -> None:
    """A child's Ctrl-C as a terminal's foreground job has it. A run of the tests started with SIGINT ignored (a
    background job, nohup) would pass that on, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interruptible(args, repo, module="grpo_katas.practice.cli"):
    """The CLI started as a user starts it in a terminal, for a test that presses Ctrl-C (SIGINT) on it."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=repo, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)


def copy_of(repo, n=1):
    return next((repo / "work").glob(f"{n:02d}-*/grpo.py"))


def state(repo):
    return json.loads((repo / "work" / "state.json").read_text())


def fake_venv(repo):
    """A .venv in the repository copy whose python is this one, stamped as installed, so make targets run there."""
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (repo / ".venv" / ".installed").touch()


def on_a_terminal(repo, args, until=None, module="grpo_katas.practice.cli", command=None, keys=None, columns=None,
                  env=None):
    """Run the CLI (or `module`, or the whole `command`: make ...) with a pseudo-terminal for its stdin, stdout and
    stderr, which is its controlling terminal (so that a typed Ctrl-C is SIGINT to its foreground group, as in a
    shell); with `until`, once that text shows, type `keys` ("\\x03" is Ctrl-C as typed) or, without keys, send
    SIGINT to the group; lists of both take turns (the second text is looked for after the first was answered).
    `columns` sets the terminal's width. Returns (exit status, all it wrote)."""
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))

    def child():
        default_sigint()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the new session's controlling terminal: ^C is SIGINT to its group
    proc = subprocess.Popen(command or [sys.executable, "-m", module, *args], cwd=repo, env={**ENV, **(env or {})},
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=child)
    os.close(slave)
    seen, mark = b"", 0
    steps = list(zip(until, keys)) if isinstance(until, list) else [(until, keys)] if until else []
    while select.select([master], [], [], 120)[0]:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        seen += data
        if steps and steps[0][0].encode() in seen[mark:]:
            text, typed = steps.pop(0)
            mark = seen.index(text.encode(), mark) + len(text)
            if typed is None:
                os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the whole foreground group
            else:
                os.write(master, typed.encode())
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace")


def plain(text: str) -> str:
    """Terminal output without its escape sequences, every line drawn kept (a live display's redraws included)."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def private_copy(root: Path, shared_runs: bool = False) -> Path:
    """The repository's tracked files copied to root: a hostile submission that gets out must not damage the
    real one. With shared_runs, its healthy runs are this repository's .cache/symptoms/ (the judge writes there,
    never a submission; a run's key is the bytes of the code it ran), so that a grading reads what another made."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, root / f)
    if shared_runs:
        shared = ROOT / ".cache" / "symptoms"
        shared.mkdir(parents=True, exist_ok=True)
        (root / ".cache").mkdir()
        (root / ".cache" / "symptoms").symlink_to(shared, target_is_directory=True)
    return root
