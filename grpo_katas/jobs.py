"""The practice CLI's jobs: the hidden checks on one file, and a loop file's short training run (the
reference's, for comparison, cached in work/cache/ by its settings and the code that makes it).

The candidate's code never runs in the CLI's process: the checks judge it in a sandboxed worker (the same judge
as CI), and a training run goes to a fresh interpreter, so a loop can hang, crash or print anything without
taking the CLI down with it. Neither draws anything: the CLI renders what they return.
"""
import contextlib
import hashlib
import json
import os
import select
import subprocess
import sys
from pathlib import Path

from grpo_katas import REFERENCE, ROOT, UserError
from grpo_katas.progress import read_cache, write_cache


def python_env() -> dict:
    # torch's note that numpy is missing means nothing here; any other warning is the loop's to see
    return {**os.environ, "PYTHONWARNINGS": "ignore:Failed to initialize NumPy",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def run_checks(path: Path, seed: int = 0, kata=None) -> dict:
    """{CheckId: Verdict} for one file, judged exactly as CI judges it: the checks run in this process, the file
    in a sandboxed worker process (grpo_katas/judge), and with a kata its brief's run (run::brief_symptoms_gone);
    raises UserError when it cannot be judged, and KeyboardInterrupt when Ctrl-C stopped the checks (pytest
    catches it and returns its status for it)."""
    import pytest

    from grpo_katas import matrix  # pytest and torch, imported only when checks run
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if not path.is_file():
        raise UserError(f"{shown}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    run = matrix.run([path], [seed], kata=kata)
    if run.exit_code == pytest.ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    if 0 in run.load_errors:
        raise UserError(f"cannot load {shown}: {run.load_errors[0]}")
    if not run.of(0, seed):
        raise UserError(f"the checks could not run on {shown} (pytest exit status {run.exit_code})")
    return run.of(0, seed)


def run_args(steps: int, seed: int, nproc: int, settings: list, hf_model: str = "", task: str | None = None) -> list:
    """The runner's arguments for a run (a kata's, and the healthy run beside it); a local model folder goes by
    its full path, since the runner starts in the repository root."""
    args = ["--steps", str(steps), "--seed", str(seed), "--nproc", str(nproc), "--set", *settings]
    if hf_model:
        model = Path(hf_model).expanduser()
        args = ["--hf-model", str(model.resolve()) if model.exists() else hf_model, *args]
    return ["--task", task, *args] if task else args


class Lines:
    """Bytes in, lines of text out, as a terminal would show them: split at newlines, a carriage return keeping
    only what follows it, undecodable bytes replaced, and a line longer than MAX_LINE cut (the rest of it dropped,
    so that a print with no newline in sight costs no memory)."""
    MAX_LINE = 2000

    def __init__(self, max_line: int = MAX_LINE):
        self.buf, self.dropping, self.max_line = b"", False, max_line

    def feed(self, data: bytes) -> list:
        out = []
        for i, piece in enumerate(data.split(b"\n")):
            if i:  # a newline ended the line before this piece
                if not self.dropping:
                    out.append(self.text(self.buf))
                self.buf, self.dropping = b"", False
            if not self.dropping:
                self.buf += piece
                if len(self.buf) > self.max_line:
                    out.append(self.text(self.buf[: self.max_line]) + " …")
                    self.buf, self.dropping = b"", True
        return out

    def close(self) -> list:
        return [self.text(self.buf)] if self.buf and not self.dropping else []

    @staticmethod
    def text(line: bytes) -> str:
        return next((part for part in reversed(line.decode("utf-8", "replace").split("\r")) if part), "")


class LoopRun:
    """A loop file trained by grpo_katas.runner in a fresh process. Iterate it for what happens, in order:
    ("output", line) for each line the loop prints (stdout and stderr, interleaved as a terminal shows them) and
    ("event", dict) for each of the runner's events, which come on a pipe of their own; the runner waits for an
    answer on a third pipe after each event, sent once the output before it is read, so that every line comes
    before the event of the step it was printed in. With `log`, everything the loop prints is also written there
    as it came (up to LOG_BYTES; `log_full` says when that was reached). Afterwards `returncode` is set;
    `last_output` holds the loop's last few lines."""
    LOG_BYTES = 20_000_000
    MAX_EVENT = 4_000_000  # an event line, a crash's traceback included (a RecursionError's is some 100 kB)

    def __init__(self, path: Path, runner_args: list, log: Path | None = None):
        self.cmd = [sys.executable, "-m", "grpo_katas.runner", str(path), *runner_args]
        self.log, self.log_full = log, False
        self.returncode = None
        self.last_output = []

    def __iter__(self):
        read_events, write_events = os.pipe()
        read_acks, write_acks = os.pipe()
        env = {**python_env(), "PYTHONUNBUFFERED": "1"}  # a print reaches us before the step it belongs to ends
        proc = subprocess.Popen([*self.cmd, "--events-fd", str(write_events), "--ack-fd", str(read_acks)],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(write_events, read_acks))
        os.close(write_events)
        os.close(read_acks)
        output = proc.stdout.fileno()
        lines = {output: Lines(), read_events: Lines(self.MAX_EVENT)}
        log = self.open_log()
        try:
            while lines:
                ready, _, _ = select.select(list(lines), [], [], None if read_events in lines else 0.5)
                if not ready:  # once the runner is gone, what holds its output open is something the loop started
                    if proc.poll() is not None:
                        break
                    continue
                fd = output if output in ready else read_events  # what was printed before an event is read first
                data = os.read(fd, 65536)
                got = lines[fd].feed(data) if data else lines.pop(fd).close()
                if fd == output:
                    self.write_log(log, data)
                    self.last_output = (self.last_output + got)[-5:]
                    yield from (("output", line) for line in got)
                    continue
                for line in got:  # every line is answered, an event or not: the runner waits for an answer to each
                    with contextlib.suppress(OSError):  # its output is read: the runner goes on while we draw
                        os.write(write_acks, b".")
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue  # not the runner's: something wrote to its channel
                    if isinstance(event, dict) and "event" in event:
                        yield "event", event
            self.returncode = proc.wait()
        finally:
            if proc.poll() is None:  # the caller stopped early (Ctrl-C): the run stops with it
                proc.kill()
                proc.wait()
            proc.stdout.close()
            os.close(read_events)
            os.close(write_acks)
            if log:
                log.close()

    def open_log(self):
        try:
            return open(self.log, "wb") if self.log else None
        except OSError:
            self.log = None  # an unwritable folder costs the log, not the run
            return None

    def write_log(self, log, data: bytes) -> None:
        if log and not self.log_full:
            room = self.LOG_BYTES - log.tell()
            log.write(data[:room])
            self.log_full = len(data) > room


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
    for kind, event in run:
        if kind == "event":
            last = event
            if event["event"] == "step":
                history.append(step_stats(event))
    if not last or last["event"] != "done":
        why = last.get("message") if last else " / ".join(run.last_output)
        return history, False, f"the healthy run did not finish with these settings: {why or 'no reason given'}"
    write_cache(name, {"args": runner_args, "code": code, "history": history})
    return history, False, None
