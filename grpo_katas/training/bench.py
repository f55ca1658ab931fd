"""`make bench`: the reference trainer's numbers on this machine, in one run, printed as a table.

1. Sampling 64 new tokens with the lab model's KV cache against full recomputation: tokens/s and the ratio.
2. Time for the default task's 5-step mean reward to go from its baseline to 0.9, for three seeds.
3. A per-step breakdown: sampling, log-probs (policy and reference), update.
4. The peak memory of one step (RSS high-water mark on the CPU, max_memory_allocated on CUDA).
5. Data parallel on the CPU: rollouts per second of the reference on 1 rank and on 2 gloo ranks (each rank its own
   batch), and the ratio.
6. The judge: a whole check run of the reference (`pytest checks --target solutions/grpo.py`, its sandboxed worker
   included) against a bare `python -c "import torch, pytest"`, both fresh processes, and the ratio.
Medians of repeated runs; nothing here is an assertion. Each stage reports its progress through a `tick(done,
total, note)` callable; main() draws it as a rich progress display, one bar per stage.

With --hf-model (make bench MODEL=...) stages 1-4 measure that Hugging Face model instead, on --task (stage 2 then
trains one seed for 20 steps and reports where the reward went); stages 5 and 6 are the lab's and are skipped.
"""
import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

from grpo_katas.training.curves import summarize
from grpo_katas.training.runs import RunConfig, lab_dtype
from grpo_katas.training.train import Trainer
from lab import ModelConfig, TinyLM


class NoCache(nn.Module):
    """The same model without make_cache(), so generate() recomputes the whole prefix for every token."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids, attention_mask)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def no_progress(done, total, note=""):
    pass


def timed(fn, device, repeats=3, tick=lambda: None):
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        tick()
    return statistics.median(times)


def bench_sampling(t: Trainer, new_tokens=64, repeats=3, tick=no_progress):
    grpo, device = t.grpo, t.device
    model = t.policy if t.run.hf_model else TinyLM(ModelConfig(max_len=new_tokens + 16), dtype=lab_dtype(device)).to(device)
    cfg = grpo.GRPOConfig(max_new_tokens=new_tokens)
    prompts, mask = t.task.sample_prompts(16, torch.Generator().manual_seed(0))
    prompts, mask = prompts.to(device), mask.to(device)

    def run(m):
        return lambda: grpo.generate(m, prompts, mask, cfg, eos_id=-1, pad_id=0)  # no EOS: all 64 tokens

    n_tokens = prompts.shape[0] * cfg.group_size * new_tokens
    done = iter(range(1, 2 * repeats + 1))
    cached = timed(run(model), device, repeats, lambda: tick(next(done), 2 * repeats, "KV cache"))
    full = timed(run(NoCache(model)), device, repeats, lambda: tick(next(done), 2 * repeats, "full recomputation"))
    return n_tokens / cached, n_tokens / full


def bench_time_to_target(device: str, seeds=(0, 1, 2), max_steps=400, tick=lambda seed: no_progress,
                         base: RunConfig | None = None):
    """For each seed, train until the 5-step mean reward reaches the target; tick(seed) gives that seed's
    progress callable. `base` is the run to start from (another model or task); the default is the lab's."""
    out = []
    for seed in seeds:
        seed_tick = tick(seed)
        t = Trainer(dataclasses.replace(base or RunConfig(), seed=seed, steps=max_steps, device=device))
        history, start, hit = [], time.perf_counter(), None
        while t.step < max_steps and hit is None:
            history.append(t.train_step())
            s = summarize(history, target=t.run.target_reward)
            hit = s.reached
            seed_tick(max_steps if hit else t.step, max_steps, f"5-step mean {s.last:.2f}")
        s = summarize(history)
        out.append((seed, hit, time.perf_counter() - start, s.first, s.last, len(history)))
    return out


def bench_breakdown(t: Trainer, steps=20, tick=no_progress):
    grpo, cfg, parts = t.grpo, t.cfg, {"sampling": [], "log-probs (policy + reference)": [], "update": []}
    for _ in range(steps):
        ids, mask = t.task.sample_prompts(t.run.batch_size, t.prompt_gen)
        ids, mask = ids.to(t.device), mask.to(t.device)
        sync(t.device)
        t0 = time.perf_counter()
        rollout = grpo.generate(t.policy, ids, mask, cfg, eos_id=t.task.eos_id, pad_id=t.task.pad_id,
                                generator=t.sample_gen)
        sync(t.device)
        t1 = time.perf_counter()
        args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, cfg.temperature)
        with torch.no_grad():
            grpo.token_logprobs(t.policy, *args)
            grpo.token_logprobs(t.ref, *args)
        sync(t.device)
        t2 = time.perf_counter()
        grpo.grpo_step(t.policy, t.ref, t.optimizer, rollout, t.task.reward(rollout).to(t.device), cfg)
        sync(t.device)
        t3 = time.perf_counter()
        parts["sampling"].append(t1 - t0)
        parts["log-probs (policy + reference)"].append(t2 - t1)
        parts["update"].append(max(0.0, (t3 - t2) - (t2 - t1)))  # grpo_step re-does the two no-grad passes
        tick(len(parts["update"]), steps)
    return {k: statistics.median(v) for k, v in parts.items()}


def peak_memory_of_a_step(t: Trainer) -> str:
    if t.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        t.train_step()
        return f"{torch.cuda.max_memory_allocated() / 2**20:.1f} MiB (CUDA, max allocated)"
    status = Path("/proc/self/status")
    clear = Path("/proc/self/clear_refs")
    if not status.exists():
        return "n/a (no /proc on this system)"
    def kib(field):
        return next(int(l.split()[1]) for l in status.read_text().splitlines() if l.startswith(field))
    before = kib("VmRSS:")
    try:
        clear.write_text("5")  # reset the high-water mark
    except OSError:
        pass
    t.train_step()
    peak = kib("VmHWM:")
    return (f"peak RSS {peak / 1024:.0f} MiB during the step, {(peak - before) / 1024:.1f} MiB above the "
            f"{before / 1024:.0f} MiB before it (CPU; torch reuses freed blocks)")


def bench_ranks(steps: int, tick=no_progress) -> dict:
    """{ranks: rollouts per second} of the reference's train on 1 and 2 gloo ranks (CPU), each rank its own batch."""
    from grpo_katas import REFERENCE
    from grpo_katas.training.loader import load_target
    from grpo_katas.training.runs import drive, drive_ranks
    out = {}
    for i, nproc in enumerate((1, 2)):
        run = RunConfig(steps=steps, device="cpu", nproc=nproc)
        start = time.perf_counter()
        history = drive_ranks(REFERENCE, run) if nproc > 1 else drive(load_target(REFERENCE), run)
        seconds = time.perf_counter() - start
        rows = run.batch_size * 8 * nproc  # group_size 8 by default, one batch per rank and step
        out[nproc] = rows * len(history) / seconds
        tick(i + 1, 2, f"{nproc} rank(s): {out[nproc]:,.0f} rollouts/s")
    return out


def bench_judge(repeats: int = 3, tick=no_progress) -> tuple:
    """(median seconds of a bare `import torch, pytest`, median seconds of a check run of the reference)."""
    import subprocess

    from grpo_katas import REFERENCE, ROOT
    commands = [[sys.executable, "-c", "import torch, pytest"],
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "checks", "--target", str(REFERENCE)]]
    medians = []
    for i, command in enumerate(commands):
        times = []
        for r in range(repeats):
            start = time.perf_counter()
            subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
            times.append(time.perf_counter() - start)
            tick(i * repeats + r + 1, 2 * repeats, f"{statistics.median(times):.1f} s")
        medians.append(statistics.median(times))
    return tuple(medians)


def main(argv=None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    p = argparse.ArgumentParser(prog="python -m grpo_katas.training.bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when there is one), cpu or cuda: measure the device you will train on")
    p.add_argument("--quick", action="store_true",
                   help="one seed and a few steps of each stage: a smoke test of this script, numbers meaningless")
    p.add_argument("--hf-model", default="", metavar="MODEL",
                   help="measure a Hugging Face causal LM (hub name or local folder) instead of the lab model")
    p.add_argument("--task", default="sum",
                   help="the task of stages 2-4 (default sum); with --hf-model arith or gsm8k for a pretrained one")
    a = p.parse_args(argv)
    console = Console(highlight=False)
    try:
        base = RunConfig(device=a.device, hf_model=a.hf_model, task=a.task)
        t = Trainer(base)
    except ValueError as exc:  # ConfigError: a model that cannot load, an unknown task
        console.print(f"[red]error:[/] {exc}")
        return 2
    console.print(f"device {t.device}, torch {torch.__version__}, {torch.get_num_threads()} threads"
                  + (f", model {a.hf_model}, task {a.task}" if a.hf_model else ""))
    new_tokens, repeats, seeds, max_steps, steps = (8, 1, (0,), 3, 2) if a.quick else (64, 3, (0, 1, 2), 400, 20)
    if a.hf_model:  # a real model: one seed, a fixed number of steps
        seeds, max_steps = (0,), (3 if a.quick else 20)
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
            TimeElapsedColumn()]
    with Progress(*cols, console=console) as progress:
        def stage(description):
            task = progress.add_task(description, total=None, note="")
            return lambda done, total, note="": progress.update(task, completed=done, total=total, note=note)

        cached, full = bench_sampling(t, new_tokens, repeats,
                                      stage(f"1. sampling {new_tokens} tokens: KV cache, full recomputation"))
        runs = bench_time_to_target(a.device, seeds, max_steps,
                                    lambda seed: stage(f"2. training to a reward of 0.9, seed {seed}"), base)
        parts = bench_breakdown(Trainer(base), steps, stage("3. per-step time: sampling, log-probs, update"))
        memory_tick = stage("4. peak memory of one step")
        memory = peak_memory_of_a_step(Trainer(base))
        memory_tick(1, 1)
        if not a.hf_model:
            ranks = bench_ranks(steps, stage("5. data parallel on the CPU: 1 rank, then 2 gloo ranks"))
            bare, judged = bench_judge(repeats, stage("6. the judge: import torch, pytest; then a check run"))

    table = Table("measure", "value", title="grpo-katas reference trainer")
    table.add_row(f"sampling {new_tokens} tokens, KV cache", f"{cached:,.0f} tokens/s")
    table.add_row(f"sampling {new_tokens} tokens, full recomputation", f"{full:,.0f} tokens/s")
    table.add_row("KV cache speed-up", f"{cached / full:.1f}x" + ("" if a.hf_model else " (goal >= 3x)"))
    for seed, hit, seconds, first, last, n in runs:
        if a.hf_model:
            table.add_row(f"reward over {n} steps (5-step means), seed {seed}",
                          f"{first:.3f} -> {last:.3f} in {seconds:.1f} s ({seconds / n:.2f} s/step)")
            continue
        result = f"step {hit}, {seconds:.1f} s" if hit else f"not reached in {seconds:.1f} s"
        table.add_row(f"reward {first:.2f} -> 0.9 (5-step mean), seed {seed}", result)
    if runs:
        times = [s for _, h, s, *_ in runs if h]
        if times:
            table.add_row("median time to 0.9", f"{statistics.median(times):.1f} s (goal < 60 s)")
    total = sum(parts.values())
    for name, seconds in parts.items():
        table.add_row(f"per step: {name}", f"{seconds * 1000:.1f} ms ({seconds / total:.0%})")
    table.add_row("peak memory of a step", memory)
    if a.hf_model:
        console.print(table)
        console.print(f"reproduce: make bench MODEL={a.hf_model}   (python -m grpo_katas.training.bench --hf-model ...)")
        return 0
    table.add_row("data parallel (CPU, gloo): rollouts/s on 1 and 2 ranks",
                  f"{ranks[1]:,.0f} / {ranks[2]:,.0f} ({ranks[2] / ranks[1]:.2f}x on {torch.get_num_threads()} "
                  f"threads; see docs/trainer.md)")
    table.add_row("check run of the reference / bare import torch, pytest",
                  f"{judged:.1f} s / {bare:.1f} s = {judged / bare:.1f}x (goal <= 3x)")
    console.print(table)
    console.print("reproduce: make bench   (python -m grpo_katas.training.bench)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
