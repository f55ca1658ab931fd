"""`make gpu-check`: prove the reference's CUDA path on a machine that has one, in well under five minutes.

1. The hidden checks against the reference (they build their own CPU tensors), then the reference's contract
   functions on CUDA against the same calls on the CPU: log-probs, one grpo_step, KV-cached sampling
   invariants, and a short training run whose reward must rise.
2. A short bf16 training run of a larger lab model (8 layers of width 512 by default): tokens per second,
   model FLOP utilisation (against the chip's dense bf16 peak) and peak GPU memory.
3. A real model (needs the hf extra): the reference trainer on --hf-model, or where none is given a small
   instruct checkpoint found in the local Hugging Face cache, or else a random Llama with Qwen2.5-0.5B's shapes
   built from its config: B=8 prompts, G=8, 256 new tokens, micro-batches of 8 rows, gradient checkpointing, the
   reference in bf16. Sampled tokens per second, peak GPU memory, and the reward (on arith for a checkpoint; the
   reward of random weights says nothing).

    python -m grpo_katas.training.gpu_check [--hf-model MODEL]     # on a CUDA machine (make gpu-check MODEL=...)
    python -m grpo_katas.training.gpu_check --device cpu --small   # a smoke test of this script anywhere
"""
import argparse
import copy
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_katas import ROOT
from grpo_katas.training.curves import summarize
from grpo_katas.training.runs import RunConfig
from grpo_katas.training.train import Trainer
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


def warm_up(t: Trainer, device) -> None:
    """One step for the allocator and the kernels; on CUDA, the peak memory is counted from here on."""
    t.train_step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device) -> str:
    return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.type == "cuda" else "n/a on CPU"


def throughput(device, small) -> None:
    layers, width, heads, B, steps = (8, 512, 8, 64, 12) if not small else (1, 32, 2, 4, 3)
    t = Trainer(RunConfig(device=str(device), model=ModelConfig(d_model=width, n_layer=layers, n_head=heads),
                          batch_size=B, steps=steps, grpo={"group_size": 16 if not small else 4}))
    n_params = sum(p.numel() for p in t.policy.parameters())
    warm_up(t, device)
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
    memory = peak_memory(device)
    print(f"model {layers}x{width} ({n_params / 1e6:.1f} M parameters), B={B}, G={t.cfg.group_size}, "
          f"{'bf16 autocast' if device.type == 'cuda' else next(t.policy.parameters()).dtype} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    print(f"sampled tokens/s: {tokens / seconds:,.0f} | step: {seconds / steps * 1000:.0f} ms | "
          f"model FLOPs/s: {flops / seconds / 1e12:.2f} T | MFU: {mfu} | peak memory: {memory}", flush=True)


# Small instruct checkpoints the real-model stage uses when one is in the local Hugging Face cache (no download).
CACHED_CHECKPOINTS = ["Qwen/Qwen2.5-0.5B-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
                      "meta-llama/Llama-3.2-1B-Instruct"]


def pick_model(name: str, small: bool, scratch: str) -> tuple:
    """(what to load, what it is, whether its weights are random): the given model; else a small checkpoint from
    the local cache; else a random Llama saved in the folder `scratch` (tiny with --small)."""
    if name and name != "auto":
        return name, name, False
    from huggingface_hub import snapshot_download
    for repo in CACHED_CHECKPOINTS:
        try:
            return snapshot_download(repo, local_files_only=True), f"{repo} (local cache)", False
        except Exception:  # not cached: the next one
            continue
    from lab.hf import save_random_llama
    size = "tiny" if small else "0.5b"
    folder = save_random_llama(scratch, size)
    return str(folder), f"a random {size} Llama built from its config", True


def real_model(device, name: str, small: bool) -> bool:
    """The reference trainer on a Hugging Face model: tokens/s, peak memory, reward; the policy in float32 and the
    reference in bf16 on CUDA."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-llama-") as scratch:  # a random model's 2 GB go with it
        return train_real_model(device, name, small, scratch)


def train_real_model(device, name: str, small: bool, scratch: str) -> bool:
    try:
        path, what, random_weights = pick_model(name, small, scratch)
    except ImportError:  # no transformers (nor huggingface_hub): the lab stages were the check
        from lab.hf import INSTALL_HINT
        print(f"skip the real model: {INSTALL_HINT}")
        return True
    B, G, new_tokens, steps = (2, 4, 8, 3) if small else (8, 8, 256, 10)
    grpo = {"group_size": G, "max_new_tokens": new_tokens, "grad_accum_steps": 2 if small else 8, "lr": 1e-6}
    run = RunConfig(device=str(device), hf_model=path, task="sum" if random_weights else "arith", batch_size=B,
                    steps=steps, gradient_checkpointing=not small, grpo=grpo)
    try:
        t = Trainer(run)
    except ValueError as exc:  # ConfigError: cannot load, no transformers
        return check("real model", False, str(exc))
    n_params = sum(p.numel() for p in t.policy.parameters())
    warm_up(t, device)
    history = [t.train_step() for _ in range(steps)]
    tokens, seconds = sum(s["tokens"] for s in history), sum(s["seconds"] for s in history)
    memory = peak_memory(device)
    rewards = [s["reward_mean"] for s in history]
    print(f"model {what}: {n_params:,} parameters, task {run.task}, B={B}, G={G}, {new_tokens} new tokens, "
          f"micro-batches of {B * G // grpo['grad_accum_steps']} rows, gradient checkpointing "
          f"{'on' if run.gradient_checkpointing else 'off'}", flush=True)
    print(f"sampled tokens/s: {tokens / seconds:,.0f} | step: {seconds / steps:.2f} s | peak memory: {memory} | "
          f"reward {rewards[0]:.3f} -> {rewards[-1]:.3f} over {steps} steps"
          + (" (random weights: the reward says nothing)" if random_weights else ""), flush=True)
    dtypes = {next(t.policy.parameters()).dtype, next(t.ref.parameters()).dtype}
    want = {torch.float32, torch.bfloat16} if device.type == "cuda" else {torch.float32}
    ok = check("real model: policy float32, reference " + ("bf16" if device.type == "cuda" else "float32"),
               dtypes == want, f"dtypes {sorted(map(str, dtypes))}")
    finite = all(math.isfinite(s[k]) for s in history for k in ("loss", "kl", "reward_mean"))
    return ok & check("real model: finite loss, KL and reward", finite, f"{steps} steps")


def two_ranks_on_gpus(small: bool) -> bool:
    """The data-parallel path on two GPUs: make train on 2 NCCL ranks under torchrun, each rank its own GPU."""
    import tempfile
    steps = 10 if small else 40
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--nproc", "2", "--device", "cuda",
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
    p.add_argument("--hf-model", default="", metavar="MODEL",
                   help="the real model of stage 3: a hub name or a local folder (default auto: a small checkpoint "
                        "in the local cache, else a random 0.5B-sized Llama); stage 3 runs by default unless --small")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run `make gpu-check` on a machine with one "
              "(or `python -m grpo_katas.training.gpu_check --device cpu --small` to smoke-test the script)")
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
    if a.hf_model or not a.small:
        ok &= real_model(device, a.hf_model, a.small)
    print(f"gpu-check {'passed' if ok else 'FAILED'} in {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
