"""
GRPO on a toy task, in one script.

Group Relative Policy Optimization (DeepSeekMath) with the knobs people actually turn:

1) loss_type: how per-token losses are averaged (grpo, bnpo, dr_grpo, dapo).
2) scale_rewards: z-score per group, per batch, or just subtract the group mean (Dr. GRPO).
3) clip_eps_high: DAPO's clip-higher.
4) is_cap: truncated importance weight between the old policy and the sampler.
5) grad_accum_steps: gradient accumulation over micro-batches.

python solutions/codebases/script.py
python solutions/codebases/script.py --steps=100 --loss-type=dapo
"""
# style: karpathy/nanochat scripts/chat_rl.py (one script, flat helpers, inline loops, plain print lines) and minimal RL scripts like open-thought/tiny-grpo train.py

import copy
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    beta: float = 0.04
    clip_eps: float = 0.2
    adv_eps: float = 1e-4
    num_iterations: int = 1
    lr: float = 3e-3
    max_grad_norm: float = 1.0
    loss_type: str = "grpo" # grpo|bnpo|dr_grpo|dapo
    scale_rewards: str = "group" # group|batch|none
    clip_eps_high: float | None = None
    grad_accum_steps: int = 1
    is_cap: float | None = None

    def __post_init__(self):
        assert self.group_size >= 2, "group_size must be >= 2"
        assert self.temperature > 0, "temperature must be > 0"
        assert self.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"), f"unknown loss_type {self.loss_type}"
        assert self.scale_rewards in ("group", "batch", "none"), f"unknown scale_rewards {self.scale_rewards}"
        assert self.grad_accum_steps >= 1, "grad_accum_steps must be >= 1"


@dataclass
class Rollout:
    input_ids: torch.Tensor # (N, P+T)
    attention_mask: torch.Tensor # (N, P+T)
    completion_mask: torch.Tensor # (N, T)
    prompt_len: int
    sampler_logp: torch.Tensor | None = None # (N, T)

# -----------------------------------------------------------------------------
# rollouts

def completion_mask(completion_ids, eos_id):
    T = completion_ids.size(1)
    hit = completion_ids == eos_id
    end = torch.where(hit.any(1), hit.float().argmax(1), T) # (N,)
    return (torch.arange(T, device=completion_ids.device) <= end[:, None]).float()

@torch.no_grad()
def generate(policy, prompt_ids, prompt_mask, cfg, *, eos_id, pad_id, generator=None):
    ids = prompt_ids.repeat_interleave(cfg.group_size, 0)
    att = prompt_mask.repeat_interleave(cfg.group_size, 0)
    P = ids.size(1)
    done = torch.zeros(ids.size(0), dtype=torch.bool, device=ids.device)
    lps = []
    for _ in range(cfg.max_new_tokens):
        logits = policy(ids, att)[:, -1].float() / cfg.temperature # (N, V)
        logp_all = F.log_softmax(logits, -1)
        tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
        lps.append(logp_all.gather(1, tok[:, None]).squeeze(1).masked_fill(done, 0.0))
        tok = tok.masked_fill(done, pad_id)
        ids = torch.cat([ids, tok[:, None]], 1)
        att = torch.cat([att, (~done).to(att.dtype)[:, None]], 1)
        done |= tok == eos_id
        if done.all():
            break
    return Rollout(ids, att, completion_mask(ids[:, P:], eos_id), P, torch.stack(lps, 1))

# -----------------------------------------------------------------------------
# loss pieces

@torch.no_grad()
def group_advantages(rewards, group_size, eps, scale="group"):
    r = rewards.float().view(-1, group_size) # (B, G)
    a = r - r.mean(1, keepdim=True)
    if scale == "group":
        a = a / (r.std(1, keepdim=True) + eps)
    elif scale == "batch":
        a = a / (r.std() + eps)
    return a.view(-1)

def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    logits = model(input_ids, attention_mask)[:, prompt_len - 1:-1].float() / temperature # (N, T, V)
    targets = input_ids[:, prompt_len:] # (N, T)
    N, T = targets.shape
    return -F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(N, T)

def kl_penalty(logp, ref_logp):
    d = ref_logp - logp
    return d.exp() - d - 1

def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, *, num_tokens=None, sampler_logp=None):
    pad = ~completion_mask.bool()
    logp, old_logp, ref_logp = logp.masked_fill(pad, 0.0), old_logp.masked_fill(pad, 0.0), ref_logp.masked_fill(pad, 0.0)
    A = advantages[:, None]
    ratio = (logp - old_logp).exp()
    hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    pg = -torch.min(ratio * A, ratio.clamp(1 - cfg.clip_eps, 1 + hi) * A)
    if cfg.is_cap is not None and sampler_logp is not None:
        w = (old_logp - sampler_logp).masked_fill(pad, 0.0).exp().clamp(max=cfg.is_cap)
        pg = pg * w.detach()
    losses = pg + cfg.beta * kl_penalty(logp, ref_logp)
    m = (~pad).to(losses.dtype)
    if cfg.loss_type == "grpo":
        return ((losses * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    if cfg.loss_type == "bnpo":
        return (losses * m).sum() / m.sum().clamp(min=1)
    if cfg.loss_type == "dr_grpo":
        return (losses * m).sum() / (m.size(0) * cfg.max_new_tokens)
    return (losses * m).sum() / (m.sum().clamp(min=1) if num_tokens is None else num_tokens) # dapo

# -----------------------------------------------------------------------------
# one update

def grpo_step(policy, ref_policy, optimizer, rollout, rewards, cfg):
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)
    ids, att, mask, P = rollout.input_ids, rollout.attention_mask, rollout.completion_mask, rollout.prompt_len
    N = ids.size(0)
    idx = [i for i in torch.arange(N, device=ids.device).tensor_split(cfg.grad_accum_steps) if len(i) > 0]
    with torch.no_grad():
        old = torch.cat([token_logprobs(policy, ids[i], att[i], P, cfg.temperature) for i in idx])
        ref = torch.cat([token_logprobs(ref_policy, ids[i], att[i], P, cfg.temperature) for i in idx])
    slp = rollout.sampler_logp if cfg.is_cap is not None else None
    ntok = mask.sum().float()
    world = 1
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(ntok)
        world = dist.get_world_size()
    ntok = ntok.clamp(min=1) / world
    out = {}
    for it in range(cfg.num_iterations):
        tot, lps = 0.0, []
        for i in idx:
            logp = token_logprobs(policy, ids[i], att[i], P, cfg.temperature)
            loss = grpo_loss(logp, old[i], ref[i], adv[i], mask[i], cfg, num_tokens=ntok,
                             sampler_logp=None if slp is None else slp[i])
            if cfg.loss_type in ("grpo", "dr_grpo"):
                loss = loss * len(i) / N
            elif cfg.loss_type == "bnpo":
                loss = loss / cfg.grad_accum_steps
            loss.backward()
            tot += loss.item()
            lps.append(logp.detach())
        gnorm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        # logging
        with torch.no_grad():
            m = mask.bool()
            logp = torch.cat(lps).masked_fill(~m, 0.0)
            ratio = (logp - old.masked_fill(~m, 0.0)).exp()
            kl = kl_penalty(logp, ref.masked_fill(~m, 0.0))
            hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
            clipped = ((ratio < 1 - cfg.clip_eps) & (adv[:, None] < 0)) | ((ratio > 1 + hi) & (adv[:, None] > 0))
            n = m.sum().clamp(min=1)
            if it == 0:
                out["loss"] = tot
                out["kl"] = (kl[m].sum() / n).item()
                out["ratio_dev"] = (ratio - 1).abs().max().item()
            out["clip_frac"] = ((clipped & m).sum() / n).item()
            out["grad_norm"] = gnorm.item()
    out["adv_std"] = adv.std().item()
    out["completion_len"] = mask.sum(1).float().mean().item()
    return out

# -----------------------------------------------------------------------------
# training loop

def print_step(s):
    print(f"step {s['step']:4d} | reward: {s['reward_mean']:.4f} | kl: {s['kl']:.4f} | loss: {s['loss']:.6f} | len: {s['completion_len']:.2f} | dt: {s['dt']*1000:.0f}ms", flush=True)

def train(policy, task, cfg, *, steps, batch_size, seed, log=print_step):
    ddp = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if ddp else 0
    torch.manual_seed(seed)
    device = next(policy.parameters()).device
    pgen = torch.Generator().manual_seed(seed + rank)
    sgen = torch.Generator(device=device).manual_seed(seed + rank)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    model = DDP(policy) if ddp else policy
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    history = []
    for step in range(1, steps + 1):
        t0 = time.time()
        prompt_ids, prompt_mask = task.sample_prompts(batch_size, pgen)
        rollout = generate(policy, prompt_ids.to(device), prompt_mask.to(device), cfg, eos_id=task.eos_id, pad_id=task.pad_id, generator=sgen)
        rewards = task.reward(rollout).to(device)
        stats = grpo_step(model, ref_policy, optimizer, rollout, rewards, cfg)
        stats = {"step": step, "reward_mean": rewards.mean().item(), "reward_max": rewards.max().item(), **stats, "dt": time.time() - t0}
        history.append(stats)
        log(stats)
    return history


if __name__ == "__main__":
    import argparse
    from lab import ModelConfig, TinyLM, make_task
    parser = argparse.ArgumentParser(description="GRPO on a toy task")
    parser.add_argument("--task", type=str, default="sum", help="sum|copy")
    parser.add_argument("--steps", type=int, default=40, help="number of optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    parser.add_argument("--num-iterations", type=int, default=2, help="updates per batch of rollouts (mu)")
    parser.add_argument("--loss-type", type=str, default="grpo", help="grpo|bnpo|dr_grpo|dapo")
    parser.add_argument("--scale-rewards", type=str, default="group", help="group|batch|none")
    parser.add_argument("--grad-accum-steps", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    cfg = GRPOConfig(num_iterations=args.num_iterations, loss_type=args.loss_type, scale_rewards=args.scale_rewards, grad_accum_steps=args.grad_accum_steps)
    hist = train(TinyLM(ModelConfig()), make_task(args.task), cfg, steps=args.steps, batch_size=args.batch_size, seed=args.seed)
    first, last = hist[:5], hist[-5:]
    print(f"reward: {sum(h['reward_mean'] for h in first) / len(first):.4f} -> {sum(h['reward_mean'] for h in last) / len(last):.4f}")
