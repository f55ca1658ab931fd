"""Train grpo.py as the run in BRIEF.md was made, and print every stat it logs, step by step.

    python run.py                 # the run the brief describes
    python run.py --steps 80      # longer; --seed and --set beta=0.5 change it too

The run: the lab's sum task, 16 prompts a step, the lab model seeded with the run's seed and computing in float64
(in float32 the last bits of a sum differ from one CPU to another and 40 steps of sampling amplify them; in float64
they stay below the digits printed, so the brief's numbers come out on any machine), one torch thread, and
GRPOConfig with PRACTICE below, then the run's own settings. `python grpo.py` runs the file's own defaults instead.
"""
import argparse
import inspect
import os
import sys
import tempfile
import traceback

import grpo
import torch

from lab import ModelConfig, TinyLM, make_task


RUN = {"steps": 40, "seed": 0, "nproc": 1, "set": {}}  # the kata's run; the bundle writes it here
PRACTICE = {"num_iterations": 2, "max_new_tokens": 6}    # where the brief's runs differ from GRPOConfig's defaults


def typed(pairs: list) -> dict:
    """["beta=0.5"] -> {"beta": 0.5}, typed by GRPOConfig's defaults."""
    fields = {f.name: f.default for f in grpo.GRPOConfig.__dataclass_fields__.values()}
    out = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        if key not in fields:
            sys.exit(f"unknown setting {key!r}; valid: {', '.join(fields)}")
        default = fields[key]
        out[key] = None if raw.lower() == "none" else raw.lower() in ("1", "true") if isinstance(default, bool) \
            else type(default)(raw) if default is not None else float(raw)
    return out


def line(stats: dict, rank: int, nproc: int) -> str:
    cells = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items() if k != "step"]
    return f"step {stats.get('step', '?'):>3}" + (f" | rank {rank}" if nproc > 1 else "") + " | " + " | ".join(cells)


def train(rank: int, args) -> list:
    torch.manual_seed(args.seed)
    policy, task = TinyLM(ModelConfig(), dtype=torch.float64), make_task("sum")
    cfg = grpo.GRPOConfig(**{**PRACTICE, **RUN["set"], **typed(args.set)})
    history = []

    def log(stats):
        history.append({"step": len(history) + 1, **{k: float(v) for k, v in stats.items() if k != "step"
                                                     and isinstance(v, (int, float, torch.Tensor)) and not
                                                     (isinstance(v, torch.Tensor) and v.numel() != 1)}})
        print(line(history[-1], rank, args.nproc), flush=True)

    kwargs = {"steps": args.steps, "batch_size": 16, "seed": args.seed}
    if "log" in inspect.signature(grpo.train).parameters:
        grpo.train(policy, task, cfg, **kwargs, log=log)
    else:
        for stats in grpo.train(policy, task, cfg, **kwargs):
            log(stats)
    return history


def summary(history: list) -> str:
    def mean(rows, key):
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else float("nan")
    keys = [k for k in history[0] if k != "step"] if history else []
    return "first 5 steps -> last 5 steps: " + ", ".join(
        f"{k} {mean(history[:5], k):.4g} -> {mean(history[-5:], k):.4g}" for k in keys)


def on_ranks(args) -> int:
    """The run on args.nproc data-parallel ranks: processes forked here, joined in one gloo group on loopback."""
    import torch.distributed as dist
    store, pids = os.path.join(tempfile.mkdtemp(), "store"), []
    for rank in range(args.nproc):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
                dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.nproc)
                history = train(rank, args)
                print(f"rank {rank}: {summary(history)}", flush=True)
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    return max(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=RUN["steps"], help=f"training steps (default {RUN['steps']})")
    p.add_argument("--seed", type=int, default=RUN["seed"], help=f"seed of everything (default {RUN['seed']})")
    p.add_argument("--nproc", type=int, default=RUN["nproc"], help=f"data-parallel ranks (default {RUN['nproc']})")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="GRPOConfig settings, e.g. beta=0.5")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.nproc > 1:
        return on_ranks(args)
    print(summary(train(0, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
