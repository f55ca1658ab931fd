"""Drive the practice CLI in a subprocess, as a user would."""
import json
import signal
import subprocess
import sys

ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}


def cli(repo, *args, stdin=subprocess.DEVNULL):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.cli", *args], cwd=repo, capture_output=True, text=True,
                       stdin=stdin, timeout=300, env=ENV)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r.returncode, r.stdout + r.stderr


def interruptible(args, repo):
    """The CLI started as a user starts it in a terminal, for a test that presses Ctrl-C (SIGINT) on it. A run of the
    tests started with SIGINT ignored (a background job, nohup) would pass that on, and Python then never raises
    KeyboardInterrupt: the child is given the default disposition, as a terminal's foreground job has."""
    return subprocess.Popen([sys.executable, "-m", "grpo_katas.cli", *args], cwd=repo, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


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
