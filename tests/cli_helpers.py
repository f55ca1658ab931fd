"""Drive the practice CLI, and make, in a subprocess, as a user would."""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys

def count_checks() -> int:
    """How many checks the judge runs: one per test function in checks/."""
    import ast
    from grpo_katas import ROOT
    return sum(isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
               for path in (ROOT / "checks").glob("test_*.py") for node in ast.parse(path.read_text()).body)


CHECKS = count_checks()
ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
OURS = re.compile(r'File "[^"]*/grpo_katas/')  # a traceback through the tooling: never acceptable


def ours_raised(text: str) -> bool:
    """Whether the output holds a traceback through this repository's own code. A loop's traceback (`make run`
    shows it, from the loop's own file on) is the candidate's to see; one through grpo_katas/ is a defect."""
    return bool(OURS.search(text)) or ("Traceback" in text and "your loop raised" not in text)


def cli(repo, *args, stdin=subprocess.DEVNULL, env=None):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.cli", *args], cwd=repo, capture_output=True, text=True,
                       stdin=stdin, timeout=300, env={**ENV, **(env or {})})
    assert not ours_raised(r.stdout + r.stderr), r.stdout + r.stderr
    return r.returncode, r.stdout + r.stderr


def make(repo, *args, timeout=300):
    """`make ARGS` in the repository copy, whose .venv is this interpreter (fake_venv). Make reports any failed
    command with a line of its own on stderr ("make: *** [Makefile:85: check] Error 1") and exit status 2; that
    line is make's, so it is left out of the output returned here."""
    if not (repo / ".venv" / ".installed").exists():
        fake_venv(repo)
    r = subprocess.run(["make", "-s", *args], cwd=repo, capture_output=True, text=True, timeout=timeout, env=ENV)
    out = "".join(l for l in (r.stdout + r.stderr).splitlines(keepends=True) if not l.startswith("make: *** "))
    assert not ours_raised(out), out
    return r.returncode, out


def default_sigint() -> None:
    """A child's Ctrl-C as a terminal's foreground job has it. A run of the tests started with SIGINT ignored (a
    background job, nohup) would pass that on, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interruptible(args, repo, module="grpo_katas.cli"):
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


def on_a_terminal(repo, args, until=None, module="grpo_katas.cli"):
    """Run the CLI (or `module`) with a pseudo-terminal for its stdin, stdout and stderr; with `until`, press
    Ctrl-C once that text shows. Returns (exit status, all it wrote)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=repo, env=ENV,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=default_sigint)
    os.close(slave)
    seen = b""
    while select.select([master], [], [], 120)[0]:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        seen += data
        if until and until.encode() in seen:
            os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the whole foreground group
            until = None
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, seen.decode(errors="replace")
