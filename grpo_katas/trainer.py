"""`make train`: the reference GRPO loop as a trainer you would run.

    python -m grpo_katas.trainer [--task sum] [--steps 200] [--device auto|cpu|cuda] [--set beta=0.1 ...]
                                 [--out runs/x] [--resume] [--compile] [--nproc 2]
    torchrun --nproc_per_node 2 -m grpo_katas.trainer ...    (what --nproc 2 runs)

Data-parallel under torchrun (gloo on the CPU, NCCL on CUDA, one GPU per rank): every rank draws its own
prompts and samples its own groups (seed + rank), computes advantages on them, and updates through
DistributedDataParallel; the reference is never wrapped or stepped. Rank 0 alone prints, writes metrics and
checkpoints (the reward it logs is the mean over ranks); a checkpoint records every rank's generators, and
resuming it needs the same number of ranks.

It drives the contract functions of solutions/grpo.py (generate, grpo_step: the code the checks judge, loaded
from that file, not copied) and adds what a run needs around them: the device (CUDA when there is one), bf16
autocast on CUDA (log-softmax stays in float32 inside the reference), the lab model's KV cache for sampling,
an optional torch.compile, atomic checkpoints with exact resume, metrics as JSON lines, and a live display.
Its settings are a runs.RunConfig, the same as `make run`'s, and its steps are the reference train()'s steps.
The Trainer class logs plain dicts; rich is used only by main(), at the edge.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from grpo_katas import REFERENCE
from grpo_katas.curves import PLOT_HINT, plot_png, summarize
from grpo_katas.loader import load_target
from grpo_katas.runs import (MODEL_HELP, PRACTICE_GRPO, ConfigError, RunConfig, build, frozen_reference, grpo_config,
                             parse_overrides, resolve_device)
from lab import ModelConfig


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Trainer:
    """The reference's train() taken apart, so that a run can be checkpointed and resumed between steps."""

    def __init__(self, run: RunConfig, out: Path | None = None):
        self.grpo = load_target(REFERENCE)
        self.run = run
        self.cfg = grpo_config(self.grpo, run)
        self.rank, self.world, self.device = join_ranks(resolve_device(run.device))
        self.out = out
        self.policy, self.task = build(run, self.device)
        self.ref = frozen_reference(self.policy)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=self.cfg.lr)
        self.prompt_gen = torch.Generator().manual_seed(run.seed + self.rank)
        self.sample_gen = torch.Generator(device=self.device).manual_seed(run.seed + self.rank)
        self.step = 0
        learner = self.policy
        if self.world > 1:  # gradients averaged over the ranks; the reference stays a local copy
            from torch.nn.parallel import DistributedDataParallel
            learner = DistributedDataParallel(self.policy, device_ids=[self.device.index] if self.device.index
                                              is not None else None)
        self.scorer = torch.compile(learner) if run.compile else learner
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if self.device.type == "cuda" \
            else contextlib.nullcontext

    def config(self) -> dict:
        return {"run": dataclasses.asdict(self.run), "grpo": dataclasses.asdict(self.cfg), "device": str(self.device)}

    def train_step(self) -> dict:
        """One step: B prompts, G completions each (KV-cached sampling), rewards, one grpo_step."""
        t0 = time.perf_counter()
        prompt_ids, prompt_mask = self.task.sample_prompts(self.run.batch_size, self.prompt_gen)  # (B, P)
        with self.autocast():
            rollout = self.grpo.generate(self.policy, prompt_ids.to(self.device), prompt_mask.to(self.device),
                                         self.cfg, eos_id=self.task.eos_id, pad_id=self.task.pad_id,
                                         generator=self.sample_gen)
        rewards = self.task.reward(rollout).to(self.device)                                   # (N,)
        with self.autocast():
            stats = self.grpo.grpo_step(self.scorer, self.ref, self.optimizer, rollout, rewards, self.cfg)
        self.step += 1
        seconds = time.perf_counter() - t0
        reward_mean, reward_max, tokens = rewards.mean(), rewards.max(), rollout.completion_mask.sum()
        if self.world > 1:  # what rank 0 logs covers every rank
            import torch.distributed as dist
            reward_mean, tokens = (x.float().clone() for x in (reward_mean, tokens))
            dist.all_reduce(reward_mean)
            dist.all_reduce(tokens)
            reward_mean = reward_mean / self.world
            dist.all_reduce(reward_max, op=dist.ReduceOp.MAX)
        tokens = int(tokens)
        return {"step": self.step, "reward_mean": reward_mean.item(), "reward_max": reward_max.item(),
                **stats, "tokens": tokens, "tokens_per_s": tokens / seconds, "seconds": seconds}

    def generators(self) -> dict:
        """This rank's random state: what differs between ranks."""
        return {"prompt_gen": self.prompt_gen.get_state(), "sample_gen": self.sample_gen.get_state().cpu(),
                "torch_rng": torch.get_rng_state()}

    def state(self) -> dict:
        """The run's state, every rank's generators included (a collective: every rank calls it)."""
        ranks = [self.generators()]
        if self.world > 1:  # the states are byte tensors of one size on every rank: gather them as tensors
            import torch.distributed as dist
            mine = self.generators()
            gathered = {}
            for key, t in mine.items():
                t = t.to(self.device) if self.device.type == "cuda" else t
                parts = [torch.empty_like(t) for _ in range(self.world)]
                dist.all_gather(parts, t)
                gathered[key] = [p.cpu() for p in parts]
            ranks = [{key: gathered[key][r] for key in mine} for r in range(self.world)]
        return {"step": self.step, "config": self.config(), "world": self.world, "policy": self.policy.state_dict(),
                "ref": self.ref.state_dict(), "optimizer": self.optimizer.state_dict(), "ranks": ranks}

    def load(self, state: dict) -> None:
        world = state.get("world", 1)
        if world != self.world:
            raise ValueError(f"the checkpoint was written by {world} rank(s) and this run has {self.world}: resume "
                             f"it with --nproc {world} (each rank's sampling continues from its own state)")
        self.policy.load_state_dict(state["policy"])
        self.ref.load_state_dict(state["ref"])
        self.optimizer.load_state_dict(state["optimizer"])
        mine = state["ranks"][self.rank]
        self.prompt_gen.set_state(mine["prompt_gen"])
        self.sample_gen.set_state(mine["sample_gen"].to(self.sample_gen.device))
        torch.set_rng_state(mine["torch_rng"])
        self.step = state["step"]

    def checkpoint(self) -> None:
        state = self.state()
        if self.rank == 0:
            save_atomic(state, self.out / "checkpoint.pt")

    @classmethod
    def resume(cls, out: Path, steps: int | None = None) -> "Trainer":
        path = out / "checkpoint.pt"
        try:
            state = torch.load(path, weights_only=False)
            saved = state["config"]
        except Exception as exc:  # torch says "PytorchStreamReader failed ..." and the like; say what to do
            raise ValueError(f"{path} cannot be read ({type(exc).__name__}): it is damaged or truncated; "
                             f"delete it to start the run afresh, or resume from a copy of a good one") from None
        run = RunConfig.from_dict({**saved["run"], "grpo": saved["grpo"],
                                   **({"steps": steps} if steps is not None else {})})
        trainer = cls(run, out)
        trainer.load(state)
        if trainer.rank == 0:
            keep_metrics(out / "metrics.jsonl", trainer.step)
        return trainer

    def fit(self, on_step=lambda stats: None) -> list:
        """Train up to run.steps, writing metrics and checkpoints under out when there is one."""
        history = []
        writes = self.out is not None and self.rank == 0
        if writes:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps(self.config(), indent=1))
        while self.step < self.run.steps:
            stats = self.train_step()
            history.append(stats)
            if writes:
                with open(self.out / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(stats) + "\n")
            if self.out is not None and (self.step % self.run.checkpoint_every == 0 or self.step == self.run.steps):
                self.checkpoint()
            on_step(stats)
        return history


def join_ranks(device: torch.device) -> tuple:
    """(rank, world size, this rank's device): under torchrun, the process group joined here (NCCL on CUDA, each
    rank its own GPU; gloo on the CPU); otherwise (0, 1, device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def keep_metrics(path: Path, upto: int) -> None:
    """Drop metric lines written after the checkpoint, so a resumed run neither loses nor repeats a step."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l and json.loads(l)["step"] <= upto]
        path.write_text("".join(l + "\n" for l in lines))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grpo_katas.trainer",
                                description="train the reference GRPO loop on a lab task, with a live display")
    practice = " ".join(f"{k}={v}" for k, v in PRACTICE_GRPO.items())
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("model", "grpo"):
            continue
        if f.type in (bool, "bool"):
            p.add_argument(flag, action="store_true", default=None, help=f.metadata["help"])
        else:
            p.add_argument(flag, type=type(f.default), default=None, help=f.metadata["help"])
    for name, text in MODEL_HELP.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=text)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"GRPOConfig overrides on top of the practice defaults ({practice}), e.g. beta=0.1 "
                        "lr=3e-3: to see what a setting does to the curves; unknown keys are rejected")
    p.add_argument("--out", type=Path, default=None,
                   help="a folder for config.json, metrics.jsonl, curve.png and checkpoint.pt: give one to keep a "
                        "run, plot it later or resume it")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out exactly where its checkpoint left it (--steps sets a new "
                        "target): after a crash, or to train longer")
    return p


def flag_error(exc: ConfigError) -> str:
    """A setting's error in the words of the flag that sets it: `--steps must be at least 1, got -5`."""
    if exc.setting in {f.name for f in dataclasses.fields(RunConfig)} - {"model", "grpo"}:
        return f"--{exc.setting.replace('_', '-')} {exc.problem}"
    return str(exc)


def launch_ranks(nproc: int, argv: list) -> int:
    """Run this same command as `nproc` ranks under torchrun (its standalone rendezvous on this machine)."""
    import subprocess
    rest, skip = [], False  # the ranks learn their number from torchrun (WORLD_SIZE), not from --nproc
    for word in argv:
        if skip or word.startswith("--nproc="):
            skip = False
            continue
        skip = word == "--nproc"
        if not skip:
            rest.append(word)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "grpo_katas.trainer", *rest]
    return subprocess.call(cmd, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})


def main(argv=None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    a = parser().parse_args(argv)
    if (a.nproc or 1) > 1 and "WORLD_SIZE" not in os.environ:  # become torchrun's ranks
        return launch_ranks(a.nproc, sys.argv[1:] if argv is None else list(argv))
    if "WORLD_SIZE" in os.environ:
        a.nproc = int(os.environ["WORLD_SIZE"])
    console = Console(highlight=False, quiet=int(os.environ.get("RANK", "0")) != 0)  # rank 0 speaks for all
    try:
        if a.resume:
            if a.out is None or not (a.out / "checkpoint.pt").exists():
                raise ValueError("--resume needs --out pointing at a run with a checkpoint.pt")
            trainer = Trainer.resume(a.out, a.steps)
            console.print(f"resuming {a.out} at step {trainer.step} of {trainer.run.steps}")
        else:
            given = {f.name: getattr(a, f.name) for f in dataclasses.fields(RunConfig)
                     if f.name not in ("model", "grpo") and getattr(a, f.name) is not None}
            model = {k: getattr(a, k) for k in MODEL_HELP if getattr(a, k) is not None}
            grpo = parse_overrides(a.set, load_target(REFERENCE).GRPOConfig)
            run = RunConfig(**given, model=ModelConfig(**model), grpo=grpo)
            trainer = Trainer(run, a.out)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {escape(flag_error(exc))}")
        return 2
    except (ValueError, TypeError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    run = trainer.run
    console.print(f"training on {trainer.device}: task {run.task}, {run.steps} steps, B={run.batch_size}, "
                  f"G={trainer.cfg.group_size}, model "
                  + (escape(run.hf_model) if run.hf_model else f"{run.model.n_layer}x{run.model.d_model}"))
    cols = [TextColumn("step {task.completed:.0f}/{task.total:.0f}"), BarColumn(),
            TextColumn("{task.fields[line]}"), TimeRemainingColumn()]
    start = time.perf_counter()
    with Progress(*cols, console=console) as progress:
        bar = progress.add_task("train", total=run.steps, completed=trainer.step, line="")

        def show(s):
            line = (f"reward {s['reward_mean']:.3f} (max {s['reward_max']:.2f}) | kl {s['kl']:.4f} | "
                    f"loss {s['loss']:+.4f} | clip {s['clip_frac']:.2f} | {s['tokens_per_s']:,.0f} tok/s")
            progress.update(bar, completed=s["step"], line=line)
            if s["step"] % max(1, run.steps // 10) == 0:
                progress.console.print(f"step {s['step']:4d} | {line}")

        history = trainer.fit(show)
    if not history:
        console.print("nothing to do: the run is already at its last step")
        return 0
    s = summarize(history, target=run.target_reward)
    console.print(f"reward {s.first:.3f} -> {s.last:.3f} (mean of the first and last 5 steps) in "
                  f"{time.perf_counter() - start:.1f} s; "
                  + (f"5-step mean reached {run.target_reward} at step {s.reached}" if s.reached else
                     f"5-step mean never reached {run.target_reward}"))
    if trainer.out is not None:
        drawn = plot_png({"reference": history}, trainer.out / "curve.png", f"make train: {run.task}")
        console.print(f"written to {trainer.out}: config.json, metrics.jsonl, checkpoint.pt"
                      + (", curve.png" if drawn else f" ({escape(PLOT_HINT)})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
