"""`make train`: the reference GRPO loop as a trainer you would run.

    python -m grpo_katas.training.train [--task sum] [--steps 200] [--device auto|cpu|cuda] [--set beta=0.1 ...]
                                 [--out runs/x] [--resume] [--compile] [--nproc 2] [--eval-every K] [--samples N]
    torchrun --nproc_per_node 2 -m grpo_katas.training.train ...    (what --nproc 2 runs)

Data-parallel under torchrun (gloo on the CPU, NCCL on CUDA, one GPU per rank): every rank draws its own
prompts and samples its own groups (seed + rank), computes advantages on them, and updates through
DistributedDataParallel; the reference is never wrapped or stepped. Rank 0 alone prints, writes metrics and
checkpoints (the reward it logs is the mean over ranks); a checkpoint records every rank's generators, and
resuming it needs the same number of ranks.

It drives the contract functions of solutions/grpo.py (generate, grpo_step: the code the checks judge, loaded
from that file, not copied) and adds what a run needs around them: the device (CUDA when there is one, a Mac's
GPU when asked for), bf16 autocast on a GPU (log-softmax stays in float32 inside the reference), the lab model's
KV cache for sampling, an optional torch.compile, atomic checkpoints with exact resume, metrics as JSON lines, and a live display.
Its settings are a runs.RunConfig, the same as `make run`'s, and its steps are the reference train()'s steps.
Around the steps, as TRL's GRPOTrainer reports a run: a held-out evaluation every K steps and at the end (the mean
reward on prompts of a stream no training step draws from, the same prompts each time, sampled at the run's
temperature with a generator of their own, so training is unchanged by it), a few completions in the log (and in
OUT/samples.jsonl), the metrics to TensorBoard (OUT/tensorboard) where tensorboard is installed, and, for a
Hugging Face model, the trained model and its tokenizer saved with save_pretrained in OUT/model (a folder MODEL=
takes again). The Trainer class logs plain dicts; rich is used only by main(), at the edge.
"""
import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_katas import REFERENCE, yes_or_no
from grpo_katas.training.curves import PLOT_HINT, plot_png, summarize
from grpo_katas.training.loader import load_target
from grpo_katas.training.runs import (MODEL_HELP, PRACTICE_GRPO, ConfigError, RunConfig, autocast, build,
                                      flag_words, frozen_reference, grpo_config, parse_overrides, resolve_device)
from lab import ModelConfig


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


EVAL_SEED = 1_000_003  # the held-out prompts' stream, apart from every training stream (seed + rank)


class Trainer:
    """The reference's train() taken apart, so that a run can be checkpointed and resumed between steps.

    How it reports (never what a step does, so a resumed run may change it): `eval_every` steps between held-out
    evaluations (0: none), on `eval_prompts` prompts; `samples` completions kept every `log_every` steps;
    `writer`, a TensorBoard SummaryWriter (or anything with add_scalar and close) for the metrics."""

    def __init__(self, run: RunConfig, out: Path | None = None, *, eval_every: int = 0, eval_prompts: int = 16,
                 samples: int = 0, log_every: int = 0, writer=None):
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
        self.step, self.stopped = 0, False
        self.eval_every, self.eval_prompts, self.writer = eval_every, eval_prompts, writer
        self.n_samples, self.log_every = samples, log_every or max(1, run.steps // 10)
        self.rollout, self.rewards, self.last_samples, self.sampled_at = None, None, [], 0
        learner = self.policy
        if self.world > 1:  # gradients averaged over the ranks; the reference stays a local copy
            from torch.nn.parallel import DistributedDataParallel
            learner = DistributedDataParallel(self.policy, device_ids=[self.device.index] if self.device.index
                                              is not None else None)
        self.scorer = torch.compile(learner) if run.compile else learner

    def config(self) -> dict:
        return {"run": dataclasses.asdict(self.run), "grpo": dataclasses.asdict(self.cfg), "device": str(self.device)}

    def train_step(self) -> dict:
        """One step: B prompts, G completions each (KV-cached sampling), rewards, one grpo_step."""
        t0 = time.perf_counter()
        prompt_ids, prompt_mask = self.task.sample_prompts(self.run.batch_size, self.prompt_gen)  # (B, P)
        with autocast(self.device):
            rollout = self.grpo.generate(self.policy, prompt_ids.to(self.device), prompt_mask.to(self.device),
                                         self.cfg, eos_id=self.task.eos_id, pad_id=self.task.pad_id,
                                         generator=self.sample_gen)
        rewards = self.task.reward(rollout).to(self.device)                                   # (N,)
        self.rollout, self.rewards = rollout, rewards  # for samples()
        with autocast(self.device):
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
    def resume(cls, out: Path, steps: int | None = None, state: dict | None = None) -> "Trainer":
        """The run in `out` from its checkpoint (`state`, when it is loaded already), with a new target of `steps`."""
        state = state or load_checkpoint(out / "checkpoint.pt")
        saved = state["config"]
        run = RunConfig.from_dict({**saved["run"], "grpo": saved["grpo"],
                                   **({"steps": steps} if steps is not None else {})})
        trainer = cls(run, out)
        trainer.load(state)
        if trainer.rank == 0:
            keep_metrics(out / "metrics.jsonl", trainer.step)
        return trainer

    def fit(self, on_step=lambda stats: None, stop=lambda: False) -> list:
        """Train up to run.steps, writing metrics and checkpoints under out when there is one. `stop()` is asked
        after each step (every rank must agree, so all ask); when it says so, the run checkpoints and returns. A
        step's stats hold eval_reward_mean on an evaluation step; samples.jsonl and the writer get what they take."""
        history = []
        writes = self.out is not None and self.rank == 0
        if writes:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(json.dumps(self.config(), indent=1))
        while self.step < self.run.steps:
            stats = self.train_step()
            self.stopped = self.agree(stop())
            last = self.step == self.run.steps or self.stopped
            if self.rank == 0 and self.eval_every and (self.step % self.eval_every == 0 or last):
                stats["eval_reward_mean"] = self.evaluate()
            if self.rank == 0 and self.n_samples and (self.step % self.log_every == 0 or last):
                self.last_samples, self.sampled_at = self.samples(self.n_samples), self.step
            history.append(stats)
            if writes:
                self.write(stats)
            if self.out is not None and (self.step % self.run.checkpoint_every == 0 or last):
                self.checkpoint()
            on_step(stats)
            if self.stopped:
                break
        if writes and history:
            self.save_model()
        if self.writer is not None:
            self.writer.close()
        return history

    def write(self, stats: dict) -> None:
        """A step's metrics to metrics.jsonl (and the writer), its samples to samples.jsonl."""
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(stats) + "\n")
        if self.last_samples and self.sampled_at == self.step:
            with open(self.out / "samples.jsonl", "a") as f:
                for sample in self.last_samples:
                    f.write(json.dumps({"step": self.step, **sample}) + "\n")
        if self.writer is not None:
            for key, value in stats.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    tag = "eval/reward_mean" if key == "eval_reward_mean" else f"train/{key}"
                    self.writer.add_scalar(tag, value, self.step)

    def evaluate(self) -> float:
        """The mean reward on held-out prompts: `eval_prompts` of them from a stream no training step draws from
        (EVAL_SEED + seed: the same prompts at every evaluation, so the numbers compare), group_size samples each
        at the run's temperature, with generators of their own, under no_grad; the training's state is untouched.
        (The lab tasks have few distinct prompts, so there held-out means another draw; the word problems are new
        problems.)"""
        prompt_gen = torch.Generator().manual_seed(EVAL_SEED + self.run.seed)
        sample_gen = torch.Generator(device=self.device).manual_seed(EVAL_SEED + self.run.seed)
        prompt_ids, prompt_mask = self.task.sample_prompts(self.eval_prompts, prompt_gen)   # (B, P)
        with torch.no_grad(), autocast(self.device):
            rollout = self.grpo.generate(self.policy, prompt_ids.to(self.device), prompt_mask.to(self.device),
                                         self.cfg, eos_id=self.task.eos_id, pad_id=self.task.pad_id,
                                         generator=sample_gen)
        return self.task.reward(rollout).float().mean().item()

    def samples(self, k: int) -> list:
        """The first completion of each of the last step's first k groups: {prompt, completion, reward}."""
        if self.rollout is None:
            return []
        out = []
        for row in range(0, min(k * self.cfg.group_size, self.rollout.input_ids.shape[0]), self.cfg.group_size):
            prompt, completion = texts(self.task, self.rollout, row)
            out.append({"prompt": prompt, "completion": completion, "reward": round(self.rewards[row].item(), 4)})
        return out

    def save_model(self) -> None:
        """A Hugging Face model and its tokenizer to out/model with save_pretrained (a new folder replaces the
        old one only once it is whole); the lab model has its checkpoint.pt."""
        model = getattr(self.policy, "model", None)
        if model is None or not hasattr(model, "save_pretrained"):
            return
        tmp, final = self.out / ".model-saving", self.out / "model"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        if getattr(self.policy, "tokenizer", None) is not None:
            self.policy.tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    def agree(self, flag: bool) -> bool:
        """True on every rank when any rank's flag is (one tiny all-reduce on several ranks)."""
        if self.world == 1:
            return flag
        import torch.distributed as dist
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


def texts(task, rollout, row: int) -> tuple:
    """(prompt, completion) of one rollout row as text: through a text task's tokenizer, else the lab's characters
    ($ for EOS); the completion up to its first EOS."""
    P = rollout.prompt_len
    prompt = [t for t in rollout.input_ids[row, :P].tolist() if t != task.pad_id]
    completion = rollout.input_ids[row, P:].tolist()
    if task.eos_id in completion:
        completion = completion[:completion.index(task.eos_id) + 1]
    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is not None:
        return (tokenizer.decode(prompt, skip_special_tokens=True).strip(),
                tokenizer.decode(completion, skip_special_tokens=True).strip())
    from lab.tasks import decode
    return decode(prompt), decode(completion)


def load_checkpoint(path: Path) -> dict:
    try:
        state = torch.load(path, weights_only=False)
        state["config"]["run"], state["config"]["grpo"]  # a checkpoint of another shape is as good as damaged
        return state
    except Exception as exc:  # torch says "PytorchStreamReader failed ..." and the like; say what to do
        raise ValueError(f"{path} cannot be read ({type(exc).__name__}): it is damaged or truncated, so this run "
                         f"cannot be resumed; put a good copy of it in its place and resume again, or start the run "
                         f"afresh: move the folder aside (mv {path.parent} {path.parent}.damaged) and run without "
                         f"--resume (RESUME=)") from None


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


def read_metrics(path: Path) -> list:
    """The steps metrics.jsonl holds, in order; a line that is not a step's JSON is named in a ValueError."""
    out = []
    for i, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        try:
            out.append(json.loads(line))
            int(out[-1]["step"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}, line {i}, is not a step's metrics; the run's metrics are damaged") from None
    return out


def keep_metrics(path: Path, upto: int) -> None:
    """Drop metric lines written after the checkpoint, so a resumed run neither loses nor repeats a step."""
    if path.exists():
        path.write_text("".join(json.dumps(m) + "\n" for m in read_metrics(path) if m["step"] <= upto))


def check_out(out: Path, resume: bool) -> None:
    """Refuse an OUT that would lose a run or cannot hold one, in one line: a file, a folder that is not empty
    (unless resuming it), a folder that cannot be written."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (a new one, or a run's with --resume)")
    if resume:
        if not (out / "checkpoint.pt").is_file():
            raise ValueError(f"--resume needs --out pointing at a run with a checkpoint.pt; {out} has none")
    elif out.is_dir() and any(out.iterdir()):
        holds = sorted(p.name for p in out.iterdir() if p.name in ("checkpoint.pt", "metrics.jsonl", "config.json"))
        if holds and "checkpoint.pt" not in holds:
            raise ValueError(f"--out {out} holds a run with no checkpoint to resume ({', '.join(holds)}); give a new "
                             f"folder, or move this one aside (mv {out} {out}.old) to start again in it")
        raise ValueError(f"--out {out} is not empty" + (f" (it holds a run: {', '.join(holds)}); continue it with "
                                                        f"--resume (RESUME=1), or" if holds else ";")
                         + " give a new folder, so that nothing is overwritten")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be written: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} cannot be written: Permission denied")


def check_resume(a, saved: dict) -> None:
    """A resumed run continues as it was set up: a flag that would change it (--steps aside: a new target) is
    refused, naming what differs, rather than silently ignored."""
    run, grpo = saved["run"], saved["grpo"]
    differ = [f"--{k.replace('_', '-')} ({run[k]} in the run, {v} given)" for k, v in given_settings(a).items()
              if k not in ("steps", "nproc") and v != run.get(k)]
    differ += [f"--{k.replace('_', '-')} ({run['model'][k]} in the run, {v} given)" for k, v in given_model(a).items()
               if v != run["model"].get(k)]
    differ += [f"--set {k} ({grpo.get(k)} in the run, {v} given)" for k, v in
               parse_overrides(a.set, load_target(REFERENCE).GRPOConfig).items() if v != grpo.get(k)]
    if differ:
        raise ValueError(f"--resume continues {a.out} as it was set up; it cannot change {', '.join(differ)}: "
                         f"start a new run with another --out for that")


def given_settings(a) -> dict:
    return {f.name: getattr(a, f.name) for f in dataclasses.fields(RunConfig)
            if f.name not in ("model", "grpo") and getattr(a, f.name) is not None}


def given_model(a) -> dict:
    return {k: getattr(a, k) for k in MODEL_HELP if getattr(a, k) is not None}


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake in the flags as one line and exit status 2 (not the usage first)."""

    def error(self, message):
        self.exit(2, f"error: {message}; `{self.prog} --help` says more\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m grpo_katas.training.train",
               description="train the reference GRPO loop on a lab task, with a live display")
    practice = " ".join(f"{k}={v}" for k, v in PRACTICE_GRPO.items())
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("model", "grpo"):
            continue
        if f.type in (bool, "bool"):
            p.add_argument(flag, nargs="?", const=True, default=None, type=yes_or_no, metavar="YES",
                           help=f.metadata["help"] + " (--compile=no or 0 means no)")
        else:
            p.add_argument(flag, type=type(f.default), default=None, help=f.metadata["help"])
    for name, text in MODEL_HELP.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=text)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"GRPOConfig overrides on top of the practice defaults ({practice}), e.g. beta=0.1 "
                        "lr=3e-3: to see what a setting does to the curves; unknown keys are rejected")
    p.add_argument("--out", type=Path, default=None,
                   help="a new (or empty) folder for config.json, metrics.jsonl, curve.png and checkpoint.pt: give "
                        "one to keep a run, plot it later or resume it; a folder that holds anything is refused "
                        "unless --resume")
    p.add_argument("--resume", nargs="?", const=True, default=False, type=yes_or_no, metavar="YES",
                   help="continue the run in --out exactly where its checkpoint left it, as it was set up (--steps "
                        "sets a new target; other settings are refused): after a crash or Ctrl-C, or to train "
                        "longer (--resume=no or 0 means no)")
    p.add_argument("--eval-every", type=int, default=None, metavar="K",
                   help="steps between held-out evaluations, and one at the end: the mean reward on prompts no "
                        "training step draws (default: a tenth of the steps; 0: none), TRL's eval_steps")
    p.add_argument("--eval-prompts", type=int, default=16, metavar="B",
                   help="held-out prompts per evaluation, group_size samples each (default 16)")
    p.add_argument("--samples", type=int, default=2, metavar="N",
                   help="completions shown with each log line and kept in OUT/samples.jsonl (default 2; 0: none), "
                        "TRL's log_completions: to read what the model says, not only its reward")
    return p


STOP_FILE = "GRPO_KATAS_STOP_FILE"  # where launch_ranks asks its ranks to stop after their step


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
           "-m", "grpo_katas.training.train", *rest]
    # Ctrl-C reaches this process alone (torchrun gets a session of its own, and would report the signal with a
    # traceback): the first asks the ranks, through a file they look for after each step, to stop with a
    # checkpoint; a second ends torchrun and its ranks at once.
    stop = Path(tempfile.mkdtemp(prefix="grpo-train-")) / "stop"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), STOP_FILE: str(stop)}
    ranks = subprocess.Popen(cmd, env=env, start_new_session=True)
    interrupted = False
    try:
        while True:
            try:
                code = ranks.wait()
                return 130 if interrupted else code
            except KeyboardInterrupt:
                if interrupted:
                    os.killpg(ranks.pid, signal.SIGTERM)
                    continue
                interrupted = True
                stop.touch()
                print("stopping after this step, with a checkpoint (Ctrl-C again stops at once, without one)",
                      flush=True)
    finally:
        shutil.rmtree(stop.parent, ignore_errors=True)


def settings(a) -> tuple:
    """(the run the flags describe, None) for a new run, or (None, its checkpoint) for the run in --out resumed;
    ValueError says what is wrong. Nothing is made: torchrun's launcher asks this before it starts any rank."""
    if a.out is not None:
        check_out(a.out, a.resume)
    if a.resume:
        state = load_checkpoint(a.out / "checkpoint.pt")
        check_resume(a, state["config"])
        return None, state
    grpo = parse_overrides(a.set, load_target(REFERENCE).GRPOConfig)
    return RunConfig(**given_settings(a), model=ModelConfig(**given_model(a)), grpo=grpo), None


def setup(a) -> "Trainer":
    """The trainer the flags describe: a new run, or the run in --out resumed; ValueError says what is wrong."""
    run, state = settings(a)
    return Trainer(run, a.out) if state is None else Trainer.resume(a.out, a.steps, state)


def main(argv=None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    a = parser().parse_args(argv)
    launcher = (a.nproc or 1) > 1 and "WORLD_SIZE" not in os.environ  # this process becomes torchrun's ranks
    if "WORLD_SIZE" in os.environ:
        a.nproc = int(os.environ["WORLD_SIZE"])
    console = Console(highlight=False, quiet=int(os.environ.get("RANK", "0")) != 0)  # rank 0 speaks for all
    if a.resume and a.out is None:
        console.print("[red]error:[/] --resume needs --out pointing at a run with a checkpoint.pt")
        return 2
    for flag, value, low in (("--eval-every", a.eval_every, 0), ("--eval-prompts", a.eval_prompts, 1),
                             ("--samples", a.samples, 0)):
        if value is not None and value < low:
            console.print(f"[red]error:[/] {flag} must be at least {low}, got {value}", soft_wrap=True)
            return 2
    try:  # refused here, before torchrun starts: a rank's refusal came with torchrun's own 40-line traceback
        if launcher:
            settings(a)
        else:
            trainer = setup(a)
    except ConfigError as exc:
        console.print(f"[red]error:[/] {escape(flag_words(exc.setting, exc.problem))}", soft_wrap=True)
        return 2
    except (ValueError, TypeError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted before the first step; nothing was written")
        return 130
    if launcher:
        return launch_ranks(a.nproc, sys.argv[1:] if argv is None else list(argv))
    run = trainer.run
    console.print(("resuming {} at step {} of {}; ".format(a.out, trainer.step, run.steps) if a.resume else "")
                  + f"training on {trainer.device}: task {run.task}, {run.steps} steps, B={run.batch_size}, "
                  f"G={trainer.cfg.group_size}, model "
                  + (escape(run.hf_model) if run.hf_model else f"{run.model.n_layer}x{run.model.d_model}"))
    report_as(trainer, a, console)
    bar_width = max(5, min(20, console.width // 8))
    cols = [TextColumn("step {task.completed:.0f}/{task.total:.0f}"), BarColumn(bar_width=bar_width),
            TextColumn("{task.fields[line]}"), TimeRemainingColumn()]
    # what the line beside the bar may take: the width less the step count, the bar, the time left and the gaps
    room = console.width - len(f"step {run.steps}/{run.steps}") - bar_width - len("0:00:00") - 4
    start, asked = time.perf_counter(), []

    def on_ctrl_c(signum, frame):  # the first Ctrl-C ends the run after this step, checkpointed; a second at once
        if asked:
            raise KeyboardInterrupt
        asked.append(True)
        console.print("stopping after this step" + (", with a checkpoint" if trainer.out else "")
                      + " (Ctrl-C again stops at once, without one)")
    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        with Progress(*cols, console=console) as progress:
            bar = progress.add_task("train", total=run.steps, completed=trainer.step, line="")

            def show(s):
                progress.update(bar, completed=s["step"], line=status_line(s, room))
                if s["step"] % trainer.log_every == 0 or "eval_reward_mean" in s or s["step"] == run.steps:
                    for line in log_lines(s, trainer, console.width):
                        progress.console.print(line, markup=False)

            history = trainer.fit(show, stop=lambda: bool(asked) or os.path.exists(os.environ.get(STOP_FILE, "")))
    except KeyboardInterrupt:
        console.print(f"stopped at once during step {trainer.step + 1}" + left_behind(trainer.out))
        return 130
    return report(console, trainer, history, time.perf_counter() - start)


def report_as(trainer: "Trainer", a, console) -> None:
    """The reporting the flags ask for: evaluations, samples, and TensorBoard where OUT is given (or a note)."""
    trainer.eval_every = max(1, trainer.run.steps // 10) if a.eval_every is None else a.eval_every
    trainer.eval_prompts, trainer.n_samples = a.eval_prompts, a.samples
    if trainer.out is not None and trainer.rank == 0:
        trainer.writer, note = tensorboard_writer(trainer.out / "tensorboard")
        if note:
            console.print(note, style="dim", markup=False)


def tensorboard_writer(folder: Path) -> tuple:
    """(a SummaryWriter that logs to `folder`, None) where tensorboard is installed, else (None, a one-line note)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None, ("TensorBoard: not installed, so no event files (pip install tensorboard to have them); "
                      "metrics.jsonl holds the same numbers")
    return SummaryWriter(log_dir=str(folder)), None


# The fields of the line beside the progress bar, in the order they are dropped last to first when it is too wide.
STATUS_FIELDS = [("reward_mean", "reward {:.3f}"), ("kl", "kl {:.4f}"), ("loss", "loss {:+.4f}"),
                 ("reward_max", "max {:.2f}"), ("clip_frac", "clip {:.2f}"), ("tokens_per_s", "{:,.0f} tok/s")]


def status_line(s: dict, room: int) -> str:
    """A step's numbers in at most `room` characters: as many of STATUS_FIELDS, in order, as fit."""
    line = ""
    for key, form in STATUS_FIELDS:
        if key not in s:
            continue
        trial = (line + " | " if line else "") + form.format(s[key])
        if len(trial) > room:
            break
        line = trial
    return line


def log_lines(s: dict, trainer: "Trainer", width: int) -> list:
    """The lines a logged step prints, each within `width`: its numbers, the held-out reward on an evaluation
    step, and the completions sampled at it."""
    lines = [f"step {s['step']:4d} | " + status_line(s, width - 12)]
    if "eval_reward_mean" in s:
        lines.append(cut(f"           held-out reward {s['eval_reward_mean']:.3f} ({trainer.eval_prompts} prompts x "
                         f"{trainer.cfg.group_size})", width))
    if trainer.sampled_at == s["step"]:
        lines += [cut(f"           {x['prompt'][-40:]!r} -> {x['completion']!r} (reward {x['reward']:.2f})", width)
                  for x in trainer.last_samples]
    return lines


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def left_behind(out: Path | None) -> str:
    """What a run stopped at once leaves in its folder, said after "stopped at once during step N". A run that
    wrote neither a checkpoint nor a step's metrics has nothing to keep: its config.json goes, so that the folder
    (empty when the run started, or the run would not have started) takes the next run."""
    if out is None:
        return ""
    if (out / "checkpoint.pt").is_file():
        return f"; {out} keeps its last checkpoint: continue with RESUME=1"
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        return f"; {out} keeps the metrics of the steps before, but no checkpoint yet: give the next run a new OUT"
    for name in ("config.json", "metrics.jsonl"):
        (out / name).unlink(missing_ok=True)
    return f"; no step had finished, so {out} is left empty for the next run"


def report(console, trainer: "Trainer", history: list, seconds: float) -> int:
    """Where the reward went over the whole run (a resumed one included: metrics.jsonl holds every step), and
    curve.png of it; exit status 130 when Ctrl-C stopped the run."""
    from rich.markup import escape
    run, out = trainer.run, trainer.out
    if not history:
        console.print(f"nothing to do: the run is at its last step, {trainer.step} of {run.steps}; --steps (STEPS=) "
                      f"sets a new target")
        return 0
    if out is not None and trainer.rank == 0:
        history = read_metrics(out / "metrics.jsonl")
    s = summarize(history, target=run.target_reward)
    console.print(f"reward {s.first:.3f} -> {s.last:.3f} (mean of the first and last 5 steps of {history[-1]['step']}; "
                  f"{seconds:.1f} s this session); "
                  + (f"5-step mean reached {run.target_reward} at step {s.reached}" if s.reached else
                     f"5-step mean never reached {run.target_reward}"))
    evals = [(h["step"], h["eval_reward_mean"]) for h in history if "eval_reward_mean" in h]
    if evals:
        console.print(f"held-out reward {evals[0][1]:.3f} (step {evals[0][0]}) -> {evals[-1][1]:.3f} (step "
                      f"{evals[-1][0]}), {trainer.eval_prompts} prompts x {trainer.cfg.group_size} samples")
    if out is not None:
        drawn = plot_png({"reference": history}, out / "curve.png", f"make train: {run.task}")
        kept = [name for name in ("config.json", "metrics.jsonl", "samples.jsonl", "checkpoint.pt", "model/",
                                  "tensorboard/") if (out / name).exists()]
        console.print(f"written to {out}: {', '.join(kept)}" + (", curve.png" if drawn else f" ({escape(PLOT_HINT)})"))
    if trainer.stopped:
        console.print(f"stopped at step {trainer.step} of {run.steps}"
                      + (f"; continue with --out {out} --resume (make train OUT=... RESUME=1)" if out else ""))
        return 0 if STOP_FILE in os.environ else 130  # under launch_ranks, which says 130 for all of them
    return 0


if __name__ == "__main__":
    sys.exit(main())
