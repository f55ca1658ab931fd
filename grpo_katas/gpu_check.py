"""`make gpu-check`: prove the reference's CUDA path on a machine that has one, in well under five minutes.

1. The hidden checks against the reference (they build their own CPU tensors), then the reference's contract
   functions on CUDA against the same calls on the CPU: log-probs, one grpo_step, KV-cached sampling
   invariants, and a short training run whose reward must rise.
2. A short bf16 training run of a larger lab model (8 layers of width 512 by default): tokens per second,
   model FLOP utilisation (against the chip's dense bf16 peak) and peak GPU memory.

    python -m grpo_katas.gpu_check                    # on a CUDA machine
    python -m grpo_katas.gpu_check --device cpu --small   # a smoke test of this script anywhere
"""
import argparse
import copy
import subprocess
import sys
import time
from pathlib import Path

import torch

from grpo_katas import ROOT
from grpo_katas.curves import summarize
from grpo_katas.runs import RunConfig
from grpo_katas.trainer import Trainer
from lab import ModelConfig

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}


def peak_flops(device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def contract_on_device(device, small) -> bool:
    """The reference on `device` against the CPU, with TF32 off so the two can be compared closely."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t = Trainer(RunConfig(device=str(device), batch_size=4, grpo={"group_size": 4}))
    grpo, task, cfg = t.grpo, t.task, t.cfg
    ok = True
    # sampling with the KV cache on the device: layout and EOS invariants
    ids, mask = task.sample_prompts(4, torch.Generator().manual_seed(0))
    r = grpo.generate(t.policy, ids.to(device), mask.to(device), cfg, eos_id=task.eos_id, pad_id=task.pad_id,
                      generator=torch.Generator(device=device).manual_seed(0))
    P = r.prompt_len
    same_prompt = all(torch.equal(r.input_ids[n, :P].cpu(), ids[n // cfg.group_size]) for n in range(r.input_ids.shape[0]))
    comp = r.input_ids[:, P:].cpu()
    after_eos = (torch.cumsum((comp == task.eos_id).int(), 1) - (comp == task.eos_id).int()) > 0
    clean = bool((comp[after_eos] == task.pad_id).all() and (r.attention_mask[:, P:].cpu()[after_eos] == 0).all())
    ok &= check("generate on " + str(device), same_prompt and clean,
                f"{r.input_ids.shape[0]} rows, groups contiguous: {same_prompt}, pad after EOS: {clean}")
    # log-probs on the device vs the CPU
    cpu_model = copy.deepcopy(t.policy).cpu()
    args = (r.input_ids, r.attention_mask, P, cfg.temperature)
    with torch.no_grad():
        on_dev = grpo.token_logprobs(t.policy, *args).cpu()
        on_cpu = grpo.token_logprobs(cpu_model, *(a.cpu() if torch.is_tensor(a) else a for a in args))
    keep = r.completion_mask.cpu().bool()
    err = (on_dev - on_cpu)[keep].abs().max().item()
    ok &= check("token_logprobs", err < 1e-3, f"max |device - cpu| = {err:.2e}")
    # one grpo_step on each, SGD so the gradient's size shows
    rewards = task.reward(r)
    deltas = []
    for model, dev in ((t.policy, device), (cpu_model, torch.device("cpu"))):
        ref = copy.deepcopy(model).requires_grad_(False)
        before = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
        roll = grpo.Rollout(*(x.to(dev) for x in (r.input_ids, r.attention_mask, r.completion_mask)), P)
        grpo.grpo_step(model, ref, torch.optim.SGD(model.parameters(), lr=0.1), roll, rewards.to(dev), cfg)
        deltas.append(torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]) - before)
    rel = ((deltas[0] - deltas[1]).norm() / deltas[1].norm().clamp(min=1e-12)).item()
    ok &= check("grpo_step", rel < 1e-2, f"update differs from the CPU's by {rel:.2e} of its size")
    # a short training run on the device
    steps = 40 if not small else 10
    s = summarize(Trainer(RunConfig(device=str(device), steps=steps)).fit())
    ok &= check(f"train {steps} steps", small or s.last > s.first + 0.1, f"reward {s.first:.2f} -> {s.last:.2f}")
    return ok


def throughput(device, small) -> None:
    layers, width, heads, B, steps = (8, 512, 8, 64, 12) if not small else (1, 32, 2, 4, 3)
    t = Trainer(RunConfig(device=str(device), model=ModelConfig(d_model=width, n_layer=layers, n_head=heads),
                          batch_size=B, steps=steps, grpo={"group_size": 16 if not small else 4}))
    n_params = sum(p.numel() for p in t.policy.parameters())
    t.train_step()  # warm-up: allocator, kernels
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    flops, tokens, seconds = 0.0, 0, 0.0
    for _ in range(steps):
        s = t.train_step()
        N = B * t.cfg.group_size
        # model FLOPs: sampling 2*P per new token; pi_old and pi_ref passes 2*P per token each (twice:
        # once inside grpo_step); mu training passes 6*P per token (forward and backward)
        seq = s["tokens"] / N + 4  # mean completion length plus the prompt columns
        flops += 2 * n_params * s["tokens"] + 2 * 2 * n_params * N * seq + t.cfg.num_iterations * 6 * n_params * N * seq
        tokens += s["tokens"]
        seconds += s["seconds"]
    peak = peak_flops(device)
    mfu = f"{flops / seconds / peak:.2%} of {peak / 1e12:.0f} TFLOP/s bf16" if peak else "n/a (unknown peak)"
    memory = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.type == "cuda" else "n/a on CPU"
    print(f"model {layers}x{width} ({n_params / 1e6:.1f} M parameters), B={B}, G={t.cfg.group_size}, "
          f"{'bf16 autocast' if device.type == 'cuda' else 'float32'} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    print(f"sampled tokens/s: {tokens / seconds:,.0f} | step: {seconds / steps * 1000:.0f} ms | "
          f"model FLOPs/s: {flops / seconds / 1e12:.2f} T | MFU: {mfu} | peak memory: {memory}", flush=True)


def two_ranks_on_gpus(small: bool) -> bool:
    """The data-parallel path on two GPUs: make train on 2 NCCL ranks under torchrun, each rank its own GPU."""
    import tempfile
    steps = 10 if small else 40
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "grpo_katas.trainer", "--nproc", "2", "--device", "cuda",
                            "--steps", str(steps), "--out", out], cwd=ROOT, capture_output=True, text=True)
        lines = (Path(out) / "metrics.jsonl").read_text().splitlines() if (Path(out) / "metrics.jsonl").exists() \
            else []
    return check("make train NPROC=2 on 2 GPUs (NCCL)", r.returncode == 0 and len(lines) == steps,
                 f"{len(lines)} of {steps} steps logged by rank 0 in {time.perf_counter() - start:.0f} s"
                 + ("" if r.returncode == 0 else f"; exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda",
                   help="the device to prove (default cuda); cpu only with --small, to smoke-test this script")
    p.add_argument("--small", action="store_true", help="tiny sizes, for a smoke test of this script")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run `make gpu-check` on a machine with one "
              "(or `python -m grpo_katas.gpu_check --device cpu --small` to smoke-test the script)")
        return 1
    device = torch.device(a.device)
    start = time.perf_counter()
    print(f"torch {torch.__version__}, device {device}", flush=True)
    if not a.small:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "checks"], cwd=ROOT)
        if not check("hidden checks on the reference", r.returncode == 0, f"exit status {r.returncode}"):
            return 1
    ok = contract_on_device(device, a.small)
    throughput(device, a.small)
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        ok &= two_ranks_on_gpus(a.small)
    print(f"gpu-check {'passed' if ok else 'FAILED'} in {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
