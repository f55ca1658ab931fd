"""The practice CLI's jobs: the hidden checks on one file, and a loop file's short training run (the
reference's, for comparison, cached in work/cache/ by its settings and the code that makes it).

The candidate's code never runs in the CLI's process: the checks judge it in a sandboxed worker (the same judge
as CI), and a training run goes to a fresh interpreter, so a loop can hang, crash or print anything without
taking the CLI down with it. Neither draws anything: the CLI renders what they return.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_katas import REFERENCE, ROOT, UserError
from grpo_katas.progress import read_cache, write_cache

def python_env() -> dict:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def run_checks(path: Path) -> dict:
    """{CheckId: Verdict} for one file, judged exactly as CI judges it: the checks run in this process, the file
    in a sandboxed worker process (grpo_katas/judge); raises UserError when it cannot be judged."""
    from grpo_katas import matrix  # pytest and torch, imported only when checks run
    run = matrix.run([path], [0])
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if 0 in run.load_errors:
        raise UserError(f"cannot load {shown}: {run.load_errors[0]}")
    if not run.of(0, 0):
        raise UserError(f"the checks could not run on {shown} (pytest exit status {run.exit_code})")
    return run.of(0, 0)


class LoopRun:
    """A loop file trained by grpo_katas.runner in a fresh process. Iterate it for the runner's events (the
    lines the loop prints itself are skipped); afterwards `returncode` and `last_error_line` (of its stderr) are set."""

    def __init__(self, path: Path, runner_args: list):
        self.cmd = [sys.executable, "-m", "grpo_katas.runner", str(path), *runner_args]
        self.returncode = None
        self.last_error_line = ""

    def __iter__(self):
        # stderr goes to a file, so a chatty loop can never fill a pipe and stall
        with tempfile.TemporaryFile("w+") as errors:
            proc = subprocess.Popen(self.cmd, cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, stderr=errors,
                                    text=True)
            for line in proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # the candidate printed something of their own
                if isinstance(event, dict) and "event" in event:
                    yield event
            self.returncode = proc.wait()
            errors.seek(0)
            self.last_error_line = next(iter(errors.read().strip().splitlines()[-1:]), "")


def step_stats(event: dict) -> dict:
    return {k: v for k, v in event.items() if k != "event"}


# What a healthy run depends on besides its settings and its codebase: change one and the cached run is made again.
RUN_CODE = [ROOT / "grpo_katas" / "runs.py", ROOT / "grpo_katas" / "runner.py", ROOT / "lab" / "model.py",
            ROOT / "lab" / "tasks.py", ROOT / "lab" / "hf.py", ROOT / "lab" / "text.py"]


def reference_run(runner_args: list, codebase: Path = REFERENCE) -> tuple:
    """(history, cached, problem) of a healthy codebase (by default the reference) driven by the runner with the
    same arguments as a kata's run: from work/cache/ when this run was made before with the same settings and
    code, else run now and stored. `problem` says why the run did not finish (then nothing is stored)."""
    code = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in [codebase, *RUN_CODE]}
    key = hashlib.sha256(json.dumps({"args": runner_args, "code": code}, sort_keys=True).encode()).hexdigest()
    name = f"reference-run-{key[:16]}"
    cached = read_cache(name)
    if isinstance(cached, dict) and isinstance(cached.get("history"), list):
        return cached["history"], True, None
    history, last = [], None
    run = LoopRun(codebase, runner_args)
    for event in run:
        last = event
        if event["event"] == "step":
            history.append(step_stats(event))
    if not last or last["event"] != "done":
        why = last.get("message") if last else run.last_error_line
        return history, False, f"the healthy run did not finish with these settings: {why or 'no reason given'}"
    write_cache(name, {"args": runner_args, "code": code, "history": history})
    return history, False, None
