"""Run a loop file for a short training and stream what happens as JSON lines on stdout.

    python -m grpo_katas.runner FILE [--steps 30] [--seed 0] [--device cpu] [--set beta=0.5 ...]
                                     [--task sum] [--hf-model MODEL]

The run is runs.drive under a RunConfig with those settings: the same path for a candidate's loop and for the
reference it is compared with. Events: {"event": "step", ...stats} (with the seconds the step took),
{"event": "done", "steps": n}, {"event": "error", "message": ...} (the file cannot be loaded or the settings are
wrong; with "setting" and "problem" when RunConfig refused one) and {"event": "crash", "type", "message",
"where", "code"} (the loop's own code raised). The practice CLI draws these; the runner itself never prints
anything else to stdout.
"""
import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

from grpo_katas.loader import TargetError, load_target
from grpo_katas.runs import ConfigError, RunConfig, drive, drive_ranks, parse_overrides


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


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


def crash_site(exc: BaseException, path: Path) -> tuple:
    """(file:line, source line) of the deepest frame in the candidate's file, else of the deepest frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == path] or frames[-1:]
    if not mine:
        return str(path), ""
    f = mine[-1]
    return f"{f.filename}:{f.lineno}", (f.line or "").strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="run a GRPO loop briefly and stream its stats")
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
    args = parser.parse_args(argv)
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
    except ConfigError as exc:
        emit("error", message=str(exc), setting=exc.setting, problem=exc.problem)
        return 2
    except ValueError as exc:
        emit("error", message=str(exc))
        return 2
    try:
        if run.nproc > 1:
            drive_ranks(path, run, lambda stats: emit("step", **plain(stats)))
        else:
            drive(grpo, run, lambda stats: emit("step", **plain(stats)))
    except ConfigError as exc:  # building the run (a model that cannot load), before the loop's code runs
        emit("error", message=str(exc), setting=exc.setting, problem=exc.problem)
        return 2
    except BaseException as exc:  # the candidate's code: show it as their error, briefly
        where, code = crash_site(exc, path)
        emit("crash", type=type(exc).__name__, message=str(exc).splitlines()[0] if str(exc) else "",
             where=where, code=code)
        return 1
    emit("done", steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
