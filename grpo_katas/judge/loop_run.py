"""A loop file trained by grpo_katas.training.runner in a child process, watched from this one: what it prints, its events,
a step that takes long (where it is, from its stack), one over its budget stopped, Ctrl-C passed on, and the caps
its sandbox ran into. `make run` trains a candidate's copy with it, and the judge the brief's run, in the same run
sandbox (grpo_katas/judge/sandbox.py, start_run); a trusted codebase, or a real model, in a plain child."""
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_katas import ROOT


def python_env() -> dict:
    # torch's note that numpy is missing means nothing here; any other warning is the loop's to see
    return {**os.environ, "PYTHONWARNINGS": "ignore:Failed to initialize NumPy",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


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
    """A loop file trained by grpo_katas.training.runner in a fresh process. Iterate it for what happens, in order:
    ("output", line) for each line the loop prints (stdout and stderr, interleaved as a terminal shows them),
    ("event", dict) for each of the runner's events, which come on a pipe of their own, and ("alive", Alive) about
    once a second while a step takes longer than that. The runner waits for an answer on a third pipe after each
    event, sent once the output before it is read, so that every line comes before the event of the step it was
    printed in.

    With `sandbox` (a mode of grpo_katas.judge.sandbox: "bubblewrap" or "process"), the run is made in a run's
    sandbox under `limits`, as `make run` and the judge both make it (sandbox.start_run); the loop's path inside it
    is shown as its own in everything that comes out. Without, a plain child in the repository with this
    process's environment: a trusted codebase, or a real model that needs the hub, a GPU or its cache.

    A step has a budget (`budget`, seconds): a step that has used that much CPU time (its whole process tree), or
    none at all for that long (a sleep, a lock, ranks waiting on each other), is stopped, and the last event is
    {"event": "hung", "step", "cpu", "seconds", "idle", "stack"}, the stack being where the loop was (the runner
    dumps it with faulthandler on SIGUSR1). With `run_cpu`, so is a run whose process tree has used that much CPU
    time in all, and with `deadline` (time.monotonic()) one still running after it. Ctrl-C (SIGINT) ends the run
    the same way: the runner (which has it too, or is sent it in its sandbox's session) reports {"event":
    "interrupted", "where", "traceback"}; one that does not end within INTERRUPT_GRACE seconds is stopped, its stack
    taken, and a second Ctrl-C stops it at once. With `log`, everything the loop prints is written there as it came
    (up to LOG_BYTES; `log_full` says when that was reached); the log of the run before is kept as LOG.1.
    Afterwards `returncode` is set, `reached` names the caps of its sandbox's cgroup it ran into, and `last_output`
    holds the loop's last few lines."""
    LOG_BYTES = 20_000_000
    MAX_EVENT = 4_000_000  # an event line, a crash's traceback included (a RecursionError's is some 100 kB)
    MAX_STACK = 1_000_000  # a stack the runner dumps
    TICK = 1.0             # seconds between looks at a step that takes long
    INTERRUPT_GRACE = 3.0  # seconds the runner has to end after Ctrl-C before it is stopped

    def __init__(self, path: Path, runner_args: list, log: Path | None = None, budget: float = 60.0,
                 sandbox: str | None = None, limits=None, run_cpu: float | None = None,
                 deadline: float | None = None, cancelled=None):
        from grpo_katas.judge import sandbox as sandboxes
        self.path, self.runner_args = path, runner_args
        self.sandbox, self.limits = sandbox, limits or sandboxes.Limits()
        self.inside = sandboxes.run_path(sandbox, path) if sandbox else str(path)  # the path the loop runs from
        self.shown = {} if sandbox in (None, "process") else {  # paths inside the sandbox -> as the caller has them
            self.inside: str(path), f"{sandboxes.RUN_ROOT}/": f"{ROOT}/"}
        self.log, self.log_full, self.budget, self.run_cpu = log, False, budget, run_cpu
        self.deadline = deadline  # time.monotonic() past which the run is stopped
        self.cancelled = cancelled  # a threading.Event: set, the run is stopped (and Ctrl-C is not ours to catch)
        self.returncode = None
        self.reached = []  # the caps of its sandbox's cgroup the run ran into ("memory", "tasks")
        self.last_output = []
        self.interrupts, self.interrupted_at = 0, None

    def start(self, channels: tuple) -> tuple:
        """(process, a folder to remove afterwards or None) of the runner, given the channels' ends (events, acks,
        stacks) it writes, reads and writes."""
        from grpo_katas.judge import sandbox
        pipes = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if self.sandbox:
            return sandbox.start_run(self.sandbox, self.path, self.runner_args, channels, self.limits, **pipes)
        events, acks, stacks = channels
        env = {**python_env(), "PYTHONUNBUFFERED": "1"}  # a print reaches us before the step it belongs to ends
        return subprocess.Popen([sys.executable, "-m", "grpo_katas.training.runner", str(self.path), *self.runner_args,
                                 "--events-fd", str(events), "--ack-fd", str(acks), "--stack-fd", str(stacks)],
                                cwd=ROOT, env=env, pass_fds=channels, **pipes), None

    def __iter__(self):
        read_events, write_events = os.pipe()
        read_acks, write_acks = os.pipe()
        read_stacks, write_stacks = os.pipe()
        os.set_blocking(read_stacks, False)
        try:
            proc, folder = self.start((write_events, read_acks, write_stacks))
        except BaseException:
            for fd in (read_events, write_acks, read_stacks):
                os.close(fd)
            raise
        finally:
            for fd in (write_events, read_acks, write_stacks):
                os.close(fd)
        output = proc.stdout.fileno()
        lines = {output: Lines(), read_events: Lines(self.MAX_EVENT)}
        log = self.open_log()
        watch = StepWatch(proc.pid, self.budget)
        # Ctrl-C: the run ends, and says where (unless its caller stops it, maybe from a thread, where none is caught)
        previous = None if self.cancelled is not None else signal.signal(signal.SIGINT, self.on_interrupt)
        self.proc = proc
        next_look = time.monotonic() + self.TICK
        try:
            while lines:
                ready, _, _ = select.select(list(lines), [], [], self.TICK if read_events in lines else 0.5)
                if read_events in lines and time.monotonic() >= next_look:  # the step in progress, once a TICK
                    next_look = time.monotonic() + self.TICK
                    stopped = self.stop_if_stuck(proc, watch, read_stacks)
                    if stopped:
                        yield "event", stopped
                        break
                    if watch.long():
                        yield "alive", watch.alive(self.where(proc, read_stacks, watch))
                if not ready:  # once the runner is gone, what holds its output open is something the loop started
                    if read_events not in lines and proc.poll() is not None:
                        break
                    continue
                fd = output if output in ready else read_events  # what was printed before an event is read first
                data = os.read(fd, 65536)
                got = lines[fd].feed(data) if data else lines.pop(fd).close()
                if fd == output:
                    self.write_log(log, data)
                    got = [self.outside(line) for line in got]
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
                        watch.event(event)
                        yield "event", self.outside(event)
            self.returncode = proc.wait()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            if proc.poll() is None:  # the caller stopped early: the run stops with it
                stop_tree(proc)
            group = getattr(proc, "group", None)
            if group is not None:  # its cgroup: the caps it ran into, and what it left running
                self.reached = group.reached()
                group.close()
            proc.stdout.close()
            for fd in (read_events, write_acks, read_stacks):
                os.close(fd)
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
            if log:
                log.close()

    def outside(self, value):
        """An output line or an event as the caller knows the loop: its path inside the sandbox shown as its own."""
        if isinstance(value, dict):
            return {k: self.outside(v) if isinstance(v, str) else v for k, v in value.items()}
        for inside, outside in self.shown.items():
            value = value.replace(inside, outside)
        return value

    def on_interrupt(self, signum, frame) -> None:
        self.interrupts += 1
        self.interrupted_at = self.interrupted_at or time.monotonic()
        if self.sandbox and self.interrupts == 1:  # a session of its own: the terminal's Ctrl-C is not the runner's
            forward(self.proc, signal.SIGINT, self.sandbox)  # (else the runner, in our process group, has it too)

    def stop_if_stuck(self, proc, watch, stacks: int) -> dict | None:
        """The last event of a run that is stopped now (over its budget, or not ending after Ctrl-C), else None."""
        if self.interrupts and (self.interrupts > 1 or time.monotonic() - self.interrupted_at >= self.INTERRUPT_GRACE):
            if proc.poll() is None:
                stack = self.where(proc, stacks, watch, fresh=True)
                stop_tree(proc)
                return {"event": "interrupted", "step": watch.step + 1, "stack": self.outside(stack)}
        why = watch.over_budget()
        if self.run_cpu is not None and watch.total() >= self.run_cpu:
            why = f"the run used {watch.total():.0f} CPU-seconds in all, its budget"
        if self.deadline is not None and time.monotonic() > self.deadline:
            why = "the time limit ran out"
        if self.cancelled is not None and self.cancelled.is_set():
            why = "its verdict was decided without it"
        if why and proc.poll() is None:
            stack = self.where(proc, stacks, watch, fresh=True)
            cpu, seconds = watch.cpu(), watch.seconds()  # before the tree is gone
            stop_tree(proc)
            return {"event": "hung", "step": watch.step + 1, "why": why, "cpu": cpu, "seconds": seconds,
                    "budget": self.budget, "stack": self.outside(stack)}
        return None

    def where(self, proc, stacks: int, watch, fresh: bool = False) -> str:
        """The stack of the loop as faulthandler dumps it (the process of the tree whose stack holds the loop's
        file), taken at most every few seconds unless `fresh`."""
        if not fresh and time.monotonic() - watch.stack_at < 3 and watch.stack:
            return watch.stack
        watch.stack_at = time.monotonic()
        from grpo_katas.judge.sandbox import descendants
        for pid in descendants(proc.pid):
            # without /proc to ask, only the runner is known to catch the signal, once it has said anything
            text = dump_stack(pid, stacks, self.MAX_STACK, known=pid == proc.pid and watch.ready)
            if self.inside in text or (text and not watch.stack):
                watch.stack = self.outside(text)
                if self.inside in text:
                    break
        return watch.stack

    def open_log(self):
        try:
            if self.log and self.log.is_file() and self.log.stat().st_size:
                os.replace(self.log, self.log.with_name(self.log.name + ".1"))  # the run before keeps its log
            return open(self.log, "wb") if self.log else None
        except OSError:
            self.log = None  # an unwritable folder costs the log, not the run
            return None

    def write_log(self, log, data: bytes) -> None:
        if log and not self.log_full:
            room = self.LOG_BYTES - log.tell()
            log.write(data[:room])
            self.log_full = len(data) > room


def forward(proc, signum: int, mode: str) -> None:
    """Send signum to the runner and its ranks: in process mode their process group (the runner leads it); in
    bubblewrap, each process of the tree that handles it (not bubblewrap, which it would end)."""
    from grpo_katas.judge.sandbox import descendants
    if mode == "process":
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signum)
        return
    for pid in descendants(proc.pid):
        if catches(pid, signum):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)


@dataclass(frozen=True)
class Alive:
    """A step that is taking long, as the runner's process tree shows it."""
    step: int           # the step in progress (1-based)
    seconds: float      # wall seconds since the step began
    cpu: float          # CPU seconds the tree has used since then
    budget: float       # the step's budget (CPU seconds, and seconds without any CPU)
    stack: str          # where the loop is, as faulthandler dumps it ("" when it could not be had)


class StepWatch:
    """The clock of the step in progress: wall and CPU time since the runner's last event, and how long it has gone
    without using CPU."""
    LONG = 2.0  # a step is reported alive once it has taken this long

    def __init__(self, pid: int, budget: float):
        from grpo_katas.judge.sandbox import cpu_seconds
        self.pid, self.budget, self.cpu_of = pid, budget, cpu_seconds
        self.step, self.stack, self.stack_at = 0, "", 0.0
        self.ready = False  # the runner has sent an event: it set its stack's signal handler before its first
        self.started = time.monotonic()  # the model is built in the first step's time
        self.cpu0 = self.last_cpu = self.cpu_of(pid)
        self.busy_at = self.started

    def event(self, event: dict) -> None:
        self.ready = True
        if event.get("event") in ("step", "config"):
            self.step += event.get("event") == "step"
            self.started = self.busy_at = time.monotonic()
            self.cpu0 = self.last_cpu = self.cpu_of(self.pid)
            self.stack = ""

    def cpu(self) -> float:
        now = self.cpu_of(self.pid)
        if now > self.last_cpu + 0.01:
            self.last_cpu, self.busy_at = now, time.monotonic()
        return max(0.0, now - self.cpu0)

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def total(self) -> float:
        """CPU seconds of the run's process tree since it started."""
        return self.cpu_of(self.pid)

    def long(self) -> bool:
        return self.seconds() >= self.LONG

    def alive(self, stack: str) -> Alive:
        return Alive(self.step + 1, self.seconds(), self.cpu(), self.budget, stack)

    def over_budget(self) -> str | None:
        cpu = self.cpu()
        if cpu >= self.budget:
            return f"it used {cpu:.0f} CPU-seconds"
        idle = time.monotonic() - self.busy_at
        if idle >= self.budget:
            return f"it used no CPU for {idle:.0f} s (a sleep, a lock, or ranks waiting on each other)"
        return None


def dump_stack(pid: int, stacks: int, most: int, wait: float = 1.0, known: bool = False) -> str:
    """The Python stack of process `pid`, which registered faulthandler on SIGUSR1 to write to the pipe whose read
    end is `stacks` (non-blocking; the runner does): drain the pipe, signal, and read what comes until it settles
    (at most `most` bytes). A process that does not catch SIGUSR1 (the runner still importing torch, a process
    the loop started) is left alone: the signal would end it. Where /proc cannot tell, only a process `known` to
    catch it is signalled."""
    caught = catches(pid, signal.SIGUSR1)
    if not (caught or caught is None and known):
        return ""
    with contextlib.suppress(OSError):
        while os.read(stacks, 65536):
            pass
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return ""
    deadline, text = time.monotonic() + wait, b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stacks], [], [], 0.05)
        if not ready:
            if text:
                break  # written and settled
            continue
        with contextlib.suppress(OSError):
            chunk = os.read(stacks, 65536)
            text += chunk[:max(0, most - len(text))]
    return text.decode("utf-8", "replace")


def catches(pid: int, signum: int) -> bool | None:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/PID/status); None where there is no /proc
    to tell (macOS)."""
    from grpo_katas.judge.sandbox import LINUX
    if not LINUX:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (signum - 1) & 1)


def stop_tree(proc) -> None:
    """SIGKILL the runner and every process below it (the ranks of a data-parallel run)."""
    from grpo_katas.judge.sandbox import descendants
    for pid in reversed(descendants(proc.pid)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
