"""Run a loop file for a short training and report what happens as JSON lines on a channel of its own.

    python -m grpo_katas.training.runner FILE [--steps 30] [--seed 0] [--device cpu] [--set beta=0.5 ...]
                                     [--task sum] [--hf-model MODEL] [--events-fd N] [--ack-fd M] [--stack-fd S]

The run is runs.drive under a RunConfig with those settings: the same path for a candidate's loop and for the
reference it is compared with. Stdout and stderr belong to the loop: whatever it prints is left there for the
caller to show. The runner's events go to file descriptor N (a pipe of the caller's: `make run` passes one), or
to stdout when none is given. With --ack-fd M the runner waits after each event until the caller answers on M,
which it does once it has read everything printed before the event: so the caller can tell which step each line
was printed in, though the two travel apart (the wait is not counted in the step's seconds). Events:
{"event": "config", "task", "seed", "steps", "nproc", "model", "device", "changed"} first (what the run is; changed:
each GRPOConfig field set otherwise than the file's defaults, as text), {"event": "step", ...stats} (with the
seconds the step took), {"event": "done", "steps": n}, {"event": "error", "message": ...} (the file cannot be
loaded or the settings are wrong, its own GRPOConfig's refusal of a --set included; with "setting" and "problem"
when RunConfig refused one), {"event": "crash", "type", "message", "where", "code", "traceback"} (the loop's own
code raised; the traceback starts at the first frame in the loop's file) and
{"event": "interrupted", "where", "code", "traceback"} (Ctrl-C: where the loop was). With --stack-fd S, SIGUSR1
makes the runner (and each data-parallel rank) write its Python stack to S (faulthandler: even a loop stuck in C
code answers), which is how the caller shows where a long step is and where a hung one was stopped. `make run` and
the judge start it in the same sandbox (grpo_katas/judge/sandbox.py, start_run).
"""
import argparse
import dataclasses
import faulthandler
import json
import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path

import torch

from grpo_katas.training.loader import TargetError, load_target
from grpo_katas.training.runs import (ConfigError, RankFailed, RunConfig, drive, drive_ranks, grpo_config,
                                      parse_overrides, resolve_device)


events, ack = sys.stdout, None  # the channel, and the caller's answers; main() sets them from the flags
waited = 0.0  # seconds spent waiting for the caller since the last step


def emit(event: str, **fields) -> None:
    global waited
    for stream in (sys.stdout, sys.stderr):  # what the loop printed before this event is in its pipe before it
        stream.flush()
    events.write(json.dumps({"event": event, **fields}) + "\n")
    events.flush()
    if ack is not None:
        start = time.perf_counter()
        os.read(ack, 1)  # the caller has read the output before this event (b"" when it is gone: go on)
        waited += time.perf_counter() - start


def step(stats: dict) -> None:
    """A step of a run in this process: its seconds, measured from the last step, less the wait for the caller."""
    global waited
    stats = plain(stats)
    if "seconds" in stats:
        stats["seconds"] = max(0.0, stats["seconds"] - waited)
    waited = 0.0
    emit("step", **stats)


def plain(stats: dict) -> dict:
    """Stats as floats, whatever types the candidate's loop logged (NaN and infinity stay: Python's json writes
    and reads them); values that are not numbers are dropped."""
    out = {}
    for k, v in stats.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):  # a string, None, a tensor of more than one element
            continue
    return out


def refused(grpo, run: RunConfig) -> str | None:
    """Why the loop file's GRPOConfig refuses the run's --set, where it takes the practice settings without it: a
    bad value given is the user's input, one line. A GRPOConfig that fails without it is the loop's own crash."""
    if not run.grpo:
        return None
    try:
        grpo_config(grpo, run)
        return None
    except Exception as exc:  # noqa: BLE001 (the loop's own validation: whatever it raises, it says why)
        try:
            grpo_config(grpo, dataclasses.replace(run, grpo={}))
        except Exception:  # noqa: BLE001
            return None
        given = " ".join(f"{k}={v!r}" for k, v in run.grpo.items())
        return f"its GRPOConfig refuses --set {given}: {type(exc).__name__}: {exc}"


def settings(grpo, run: RunConfig) -> dict:
    """What the run is, for its header: task, seed, steps, ranks, and each GRPOConfig field the run sets otherwise
    than the loop file's own defaults (the practice settings, then the run's overrides), as text."""
    cfg, default = grpo_config(grpo, run), grpo.GRPOConfig()
    changed = {f.name: repr(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
               if getattr(cfg, f.name) != getattr(default, f.name, None)}
    model = run.hf_model or f"the lab model ({run.model.n_layer}x{run.model.d_model})"
    return {"task": run.task, "seed": run.seed, "steps": run.steps, "nproc": run.nproc, "model": model,
            "device": str(resolve_device(run.device)), "changed": changed}


def their_traceback(exc: BaseException, path: Path) -> str:
    """The traceback as Python prints it, from the first frame in the loop's file on (the frames above it are
    the runner's); a data-parallel rank's is the rank's own."""
    if isinstance(exc, RankFailed):
        lines = exc.trace.splitlines(keepends=True)
        first = next((i for i, l in enumerate(lines) if l.startswith(f'  File "{path}"')), None)
        return "".join(lines[:1] + lines[first:]) if first is not None else exc.trace
    tb = exc.__traceback__
    while tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve() != path:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


FRAME = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+), in .*\n(?:    (?P<code>.*)\n)?', re.MULTILINE)


def crash_site(trace: str, path: Path) -> tuple:
    """(file:line, source line) of the deepest frame in the loop's file, else of the deepest frame."""
    frames = list(FRAME.finditer(trace))
    mine = [f for f in frames if Path(f["file"]).resolve() == path] or frames[-1:]
    if not mine:
        return str(path), ""
    f = mine[-1]
    return f"{f['file']}:{f['line']}", (f["code"] or "").strip()


def main(argv=None) -> int:
    global events, ack
    parser = argparse.ArgumentParser(description="run a GRPO loop briefly and report its stats as JSON events")
    parser.add_argument("file", help="a loop file implementing the contract (a kata, your copy, the reference)")
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30: a few seconds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model, prompts and sampling (default 0)")
    parser.add_argument("--device", default=None,
                        help="cpu (default: the lab model is too small for a GPU to help), cuda or auto (the default "
                             "with --hf-model)")
    parser.add_argument("--task", default="sum", help="the task (default sum); see RunConfig.task")
    parser.add_argument("--hf-model", default="",
                        help="a Hugging Face causal LM (hub name or local folder) instead of the lab model")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="GRPOConfig overrides on top of the practice defaults, typed by the file's GRPOConfig")
    parser.add_argument("--nproc", type=int, default=1,
                        help="data-parallel ranks (default 1): 2 runs the loop as two gloo processes; every rank's "
                             "stats are reported, rank r's as key@r")
    parser.add_argument("--events-fd", type=int, default=None,
                        help="the file descriptor to write events to (default: stdout, shared with the loop's prints)")
    parser.add_argument("--ack-fd", type=int, default=None,
                        help="a file descriptor to wait on after each event, for one byte from the caller")
    parser.add_argument("--stack-fd", type=int, default=None,
                        help="on SIGUSR1, write the Python stack to this file descriptor (the caller asks where a "
                             "long step is)")
    args = parser.parse_args(argv)
    if args.stack_fd is not None:
        faulthandler.register(signal.SIGUSR1, file=args.stack_fd, all_threads=True)
    if args.events_fd is not None:
        events = os.fdopen(args.events_fd, "w")
    ack = args.ack_fd
    torch.set_num_threads(1)  # the numbers a brief cites, on any machine: float sums differ with the thread count
    path = Path(args.file).resolve()
    try:
        grpo = load_target(path)
    except TargetError as exc:
        emit("error", message=str(exc))
        return 2
    try:
        run = RunConfig(steps=args.steps, seed=args.seed, nproc=args.nproc, task=args.task, hf_model=args.hf_model,
                        device=args.device or ("auto" if args.hf_model else "cpu"),
                        grpo=parse_overrides(args.set, grpo.GRPOConfig))
        resolve_device(run.device)  # cuda where torch sees none: refused before the run starts
    except ConfigError as exc:
        emit("error", message=str(exc), setting=exc.setting, problem=exc.problem)
        return 2
    except ValueError as exc:
        emit("error", message=str(exc))
        return 2
    why = refused(grpo, run)
    if why:
        emit("error", message=why)
        return 2
    try:
        emit("config", **settings(grpo, run))
        if run.nproc > 1:  # each rank times its own steps, never waiting for the caller
            drive_ranks(path, run, lambda stats: emit("step", **plain(stats)))
        else:
            drive(grpo, run, step)
    except ConfigError as exc:  # building the run (a model that cannot load), before the loop's code runs
        emit("error", message=str(exc), setting=exc.setting, problem=exc.problem)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: where the loop was, for the caller to say
        trace = their_traceback(exc, path)
        where, code = crash_site(trace, path)
        emit("interrupted", where=where, code=code, traceback=trace)
        return 130
    except BaseException as exc:  # the candidate's code: show it as their error, with their traceback
        trace = their_traceback(exc, path)
        where, code = crash_site(trace, path)
        emit("crash", type=type(exc).__name__, message=str(exc).splitlines()[0] if str(exc) else "",
             where=where, code=code, traceback=trace)
        return 1
    emit("done", steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
