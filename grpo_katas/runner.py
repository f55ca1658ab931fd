"""Run a candidate's loop for a short training and stream what happens as JSON lines on stdout.

    python -m grpo_katas.runner FILE [--steps 30] [--temperature 1.0] [--num-iterations 2] [--set beta=0.5 ...]

Events: {"event": "step", ...stats}, {"event": "done", "steps": n}, {"event": "error", "message": ...}
(the file cannot be loaded) and {"event": "crash", "type", "message", "where", "code"} (the candidate's own
code raised). The practice CLI draws these; the runner itself never prints anything else to stdout.
"""
import argparse
import inspect
import json
import math
import sys
import traceback
from pathlib import Path

from grpo_katas.loader import TargetError, load_target
from grpo_katas.trainer import parse_overrides


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def plain(stats: dict) -> dict:
    """Stats as JSON-safe floats, whatever types the candidate's loop logged."""
    out = {}
    for k, v in stats.items():
        try:
            v = float(v)
            out[k] = v if math.isfinite(v) else str(v)
        except (TypeError, ValueError):
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
    parser.add_argument("file")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-iterations", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="GRPOConfig overrides")
    args = parser.parse_args(argv)
    path = Path(args.file).resolve()
    try:
        grpo = load_target(path)
    except TargetError as exc:
        emit("error", message=str(exc))
        return 2

    import torch
    from lab import ModelConfig, SumTask, TinyLM

    try:
        overrides = {"temperature": args.temperature, "num_iterations": args.num_iterations,
                     **parse_overrides(args.set, grpo.GRPOConfig)}
    except ValueError as exc:
        emit("error", message=str(exc))
        return 2
    try:
        torch.manual_seed(args.seed)
        cfg = grpo.GRPOConfig(**overrides)
        kwargs = {"steps": args.steps, "batch_size": 16, "seed": args.seed}
        if "log" in inspect.signature(grpo.train).parameters:
            kwargs["log"] = lambda stats: emit("step", **plain(stats))
            grpo.train(TinyLM(ModelConfig()), SumTask(), cfg, **kwargs)
        else:
            for i, stats in enumerate(grpo.train(TinyLM(ModelConfig()), SumTask(), cfg, **kwargs), 1):
                emit("step", **{"step": i, **plain(stats)})
    except BaseException as exc:  # the candidate's code: show it as their error, briefly
        where, code = crash_site(exc, path)
        emit("crash", type=type(exc).__name__, message=str(exc).splitlines()[0] if str(exc) else "",
             where=where, code=code)
        return 1
    emit("done", steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
