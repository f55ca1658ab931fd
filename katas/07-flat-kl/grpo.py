"""
Reinforcement learning on a toy task via GRPO.

Group Relative Policy Optimization (DeepSeekMath): sample a group of completions per prompt, score them, use the
group as its own baseline, and take clipped policy-gradient steps with a KL penalty to a frozen reference model.
Out of the box it is the paper's recipe. The knobs people turn, with the names TRL gives them:

1) loss_type: how the per-token losses become one number (grpo, bnpo, dr_grpo, dapo).
2) scale_rewards: what the centred rewards are divided by (group, batch, or none as in Dr. GRPO).
3) clip_eps_high: DAPO's clip-higher.
4) is_cap: importance sampling for a sampler that is not exactly the policy (TRL's vLLM correction).
5) grad_accum_steps: the batch goes through the model in that many passes.

1 process:
python grpo.py

2 processes (data parallel, gloo on CPU):
torchrun --standalone --nproc_per_node=2 grpo.py --loss-type=dapo
"""

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# Compute helpers: which rank we are, printing on rank 0 only

def get_dist_info():
    # (ddp, ddp_rank, ddp_world_size): data parallel as soon as a process group has been initialized
    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), dist.get_world_size()
    return False, 0, 1

def print0(s="", **kwargs):
    ddp, ddp_rank, ddp_world_size = get_dist_info()
    if ddp_rank == 0:
        print(s, **kwargs)

def autodetect_device_type():
    # prefer to use CUDA if available, otherwise use MPS, otherwise fallback on CPU
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"

def compute_init(device_type="cpu"): # cuda|cpu|mps
    # Distributed setup: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; nccl on GPUs, gloo otherwise
    ddp_local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(device_type, ddp_local_rank) if device_type == "cuda" else torch.device(device_type)
    if all(k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        if device_type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        dist.barrier()
    ddp, ddp_rank, ddp_world_size = get_dist_info()
    return ddp, ddp_rank, ddp_local_rank, ddp_world_size, device

def compute_cleanup():
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

# -----------------------------------------------------------------------------
# Config and the rollout that the batch generator yields

@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8 # samples per prompt, the group each one is compared with
    max_new_tokens: int = 8 # max tokens to generate per sample
    temperature: float = 1.0 # sampling temperature
    beta: float = 0.04 # weight of the KL penalty to the reference model
    clip_eps: float = 0.2 # PPO clip range
    adv_eps: float = 1e-4 # added to the std the advantages are divided by
    num_iterations: int = 1 # iterations on each batch of rollouts (mu)
    lr: float = 3e-3 # AdamW learning rate
    max_grad_norm: float = 1.0 # gradient norm clipping
    loss_type: str = "grpo" # grpo|bnpo|dr_grpo|dapo
    scale_rewards: str = "group" # group|batch|none
    clip_eps_high: float | None = None # DAPO clip-higher (None = clip_eps)
    grad_accum_steps: int = 1 # passes per optimizer step
    is_cap: float | None = None # cap of the sampler importance weight (None = no correction)

    def __post_init__(self):
        assert self.group_size >= 2, "group_size must be >= 2, a group of one has no baseline"
        assert self.temperature > 0, "temperature must be > 0"
        assert self.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"), f"unknown loss_type {self.loss_type}"
        assert self.scale_rewards in ("group", "batch", "none"), f"unknown scale_rewards {self.scale_rewards}"
        assert self.grad_accum_steps >= 1, "grad_accum_steps must be >= 1"

@dataclass
class Rollout:
    input_ids: torch.Tensor # (N, P+T) prompt, then the sampled completion
    attention_mask: torch.Tensor # (N, P+T)
    completion_mask: torch.Tensor # (N, T) the tokens that are trained on
    prompt_len: int # P
    sampler_logp: torch.Tensor | None = None # (N, T) log-probs reported by the sampler

# -----------------------------------------------------------------------------
# Sampling

def completion_mask(completion_ids, eos_id):
    # The length of each completion, from where its eos is; all T columns if it never produced one
    num_rows, num_columns = completion_ids.shape
    is_eos = completion_ids == eos_id # (N, T)
    completion_lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, num_columns) # (N,)
    columns = torch.arange(num_columns, device=completion_ids.device)
    return (columns[None, :] < completion_lengths[:, None]).float() # (N, T)

@torch.no_grad()
def generate(policy, prompt_ids, prompt_mask, cfg, *, eos_id, pad_id, generator=None):
    # Replicate every prompt group_size times, (B, P) -> (B, G, P) -> (N, P), so its samples are rows in a run
    num_prompts, prompt_length = prompt_ids.shape
    num_rows = num_prompts * cfg.group_size
    input_ids = prompt_ids[:, None, :].expand(-1, cfg.group_size, -1).reshape(num_rows, prompt_length)
    attention_mask = prompt_mask[:, None, :].expand(-1, cfg.group_size, -1).reshape(num_rows, prompt_length)

    # 1) Prefill: one forward pass over the prompts, which also fills the KV cache if the model keeps one
    kv_cache = policy.make_cache() if hasattr(policy, "make_cache") else None
    model_kwargs = {} if kv_cache is None else {"cache": kv_cache}
    logits = policy(input_ids, attention_mask, **model_kwargs)[:, -1, :] # (N, V)

    # 2) Main generation loop, one column of tokens at a time
    row_completed = torch.zeros(num_rows, dtype=torch.bool, device=input_ids.device)
    sampled_logprobs = [] # one (N,) per column
    while True:
        # Sample the next token of every row
        logprobs = F.log_softmax(logits.float() / cfg.temperature, dim=-1) # (N, V)
        next_ids = torch.multinomial(logprobs.exp(), num_samples=1, generator=generator) # (N, 1)
        # Remember the log-prob of each sampled token (0 for the rows that had already completed)
        next_logprobs = logprobs.gather(1, next_ids).squeeze(1) # (N,)
        sampled_logprobs.append(next_logprobs.masked_fill(row_completed, 0.0))
        # Rows that have completed only receive pad from here on, and nothing attends to it
        next_ids = next_ids.masked_fill(row_completed[:, None], pad_id)
        input_ids = torch.cat([input_ids, next_ids], dim=1)
        attention_mask = torch.cat([attention_mask, (~row_completed[:, None]).to(attention_mask.dtype)], dim=1)
        # A row is completed once an eos appears in it
        row_completed = (input_ids[:, prompt_length:] == eos_id).any(dim=1)
        # Stop condition: we've reached max tokens
        if len(sampled_logprobs) >= cfg.max_new_tokens:
            break
        # Stop condition: all rows are completed
        if row_completed.all():
            break
        # Prepare logits for the next iteration: with a KV cache only the new column goes through the model
        new_ids = input_ids if kv_cache is None else next_ids
        logits = policy(new_ids, attention_mask, **model_kwargs)[:, -1, :] # (N, V)

    completion_ids = input_ids[:, prompt_length:] # (N, T)
    return Rollout(input_ids, attention_mask, completion_mask(completion_ids, eos_id), prompt_length,
                   torch.stack(sampled_logprobs, dim=1))

# -----------------------------------------------------------------------------
# The pieces of the objective

@torch.no_grad()
def group_advantages(rewards, group_size, eps, scale="group"):
    assert rewards.numel() % group_size == 0, "the rewards must come in whole groups"
    # One row per prompt holding the rewards of its samples, (B, G): a copy, as it is changed in place below
    advantages = rewards.float().view(-1, group_size).clone()
    batch_std = advantages.std() # the spread of the rewards over the whole batch, for scale="batch"
    # One prompt at a time, as the batch generator hands them out
    for prompt_advantages in advantages: # (G,)
        # The baseline is the mean reward of the prompt's own samples
        prompt_advantages -= prompt_advantages.mean()
        # Then divide by the spread of the rewards: the prompt's own (group), the batch's (batch), none (none)
        if scale == "group":
            prompt_advantages /= prompt_advantages.std() + eps
        elif scale == "batch":
            prompt_advantages /= batch_std + eps
    return advantages.view(-1) # (N,)

def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    assert temperature > 0.0, "temperature must be positive"
    # Autoregressive inputs and targets
    logits = model(input_ids, attention_mask)[:, :-1, :] # (N, P+T-1, V)
    targets = input_ids[:, 1:] # (N, P+T-1)
    # Keep the completion columns only
    logits = logits[:, prompt_len - 1:, :].float() / temperature # (N, T, V)
    targets = targets[:, prompt_len - 1:] # (N, T)
    # Note that cross_entropy calculates NLL = -logp, so we negate
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return -nll.view_as(targets) # (N, T)

def kl_penalty(logp, ref_logp):
    # Schulman's "k3" approximation of the KL divergence from the reference model, per sampled token
    log_ratio = ref_logp - logp
    return torch.expm1(log_ratio) - log_ratio

def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, *, num_tokens=None, sampler_logp=None):
    # The valid tokens are those of the completions; what sits under the mask is set to 0 first
    valid = completion_mask.bool() # (N, T)
    logp, old_logp, ref_logp = (torch.where(valid, x, 0.0) for x in (logp, old_logp, ref_logp))
    # PPO's clipped objective
    ratio = torch.exp(logp - old_logp) # (N, T)
    ratio_min, ratio_max = 1 - cfg.clip_eps, 1 + (cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high)
    clipped_ratio = ratio.clamp(ratio_min, ratio_max)
    advantages = advantages.unsqueeze(-1)
    pg_obj = torch.minimum(ratio * advantages, clipped_ratio * advantages) # (N, T)
    # Truncated importance sampling, for a sampler that is not exactly pi_old (another engine, another precision)
    if cfg.is_cap is not None and sampler_logp is not None:
        log_weight = torch.where(valid, old_logp - sampler_logp, 0.0)
        pg_obj = pg_obj * log_weight.exp().clamp(max=cfg.is_cap).detach()
    # The KL penalty, against the reference model
    kl = kl_penalty(logp, ref_logp)
    obj = pg_obj - cfg.beta * kl # (N, T)
    # Normalize, as loss_type says
    if cfg.loss_type == "grpo": # DeepSeekMath: each sample's mean over its own tokens, then the mean over samples
        obj = ((obj * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1)).mean()
    else: # the token sum over one number: the tokens of this call (bnpo), a constant (dr_grpo), num_tokens (dapo)
        if cfg.loss_type == "bnpo":
            num_valid = valid.sum().clamp(min=1)
        elif cfg.loss_type == "dr_grpo":
            num_valid = valid.size(0) * cfg.max_new_tokens
        else:
            num_valid = valid.sum().clamp(min=1) if num_tokens is None else num_tokens
        obj = (obj * valid).sum() / num_valid
    # Finally, formulate the loss that we want to minimize (instead of objective we wish to maximize)
    return -obj

# -----------------------------------------------------------------------------
# One update on one batch of rollouts

def grpo_step(policy, ref_policy, optimizer, rollout, rewards, cfg):
    # The batch: N rows, each a prompt followed by one of its samples
    input_ids_all, attention_mask_all = rollout.input_ids, rollout.attention_mask # (N, P+T)
    completion_mask_all = rollout.completion_mask # (N, T)
    sampler_logprobs_all = rollout.sampler_logp if cfg.is_cap is not None else None # (N, T)
    num_rows = input_ids_all.size(0)

    # The rows go through the model in grad_accum_steps passes; as torch.tensor_split cuts them, the first
    # num_rows % num_passes passes get one row more
    num_passes = min(cfg.grad_accum_steps, num_rows)
    rows_per_pass, extra_rows = divmod(num_rows, num_passes)
    bounds = [pass_idx * rows_per_pass + min(pass_idx, extra_rows) for pass_idx in range(num_passes + 1)]
    passes = list(zip(bounds[:-1], bounds[1:])) # (b0, b1) of each pass

    # Log probabilities of the samples before the update (pi_old) and under the frozen reference model
    with torch.no_grad():
        old_logprobs_all = torch.cat([token_logprobs(policy, input_ids_all[b0:b1], attention_mask_all[b0:b1], rollout.prompt_len, cfg.temperature) for b0, b1 in passes])
        ref_logprobs_all = torch.cat([token_logprobs(ref_policy, input_ids_all[b0:b1], attention_mask_all[b0:b1], rollout.prompt_len, cfg.temperature) for b0, b1 in passes])

    # Calculate the advantages: each sample's reward against the other samples of its prompt
    advantages_all = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards) # (N,)

    # dapo divides every pass by the valid tokens of the whole batch, counted over all ranks; as DDP averages the
    # ranks' gradients, each rank divides by its share of that count
    ddp, ddp_rank, ddp_world_size = get_dist_info()
    num_valid_all = completion_mask_all.sum()
    if ddp:
        dist.all_reduce(num_valid_all)
    num_tokens = num_valid_all.clamp(min=1) / ddp_world_size

    stats = {}
    for iteration in range(cfg.num_iterations):
        policy.zero_grad(set_to_none=True)
        loss_sum, kl_sum, clipped_sum, max_ratio_dev = 0.0, 0.0, 0.0, 0.0 # for logging
        for b0, b1 in passes:
            # Calculate the log probabilities of this pass's rows, with grad this time
            logprobs = token_logprobs(policy, input_ids_all[b0:b1], attention_mask_all[b0:b1], rollout.prompt_len, cfg.temperature)
            loss = grpo_loss(logprobs, old_logprobs_all[b0:b1], ref_logprobs_all[b0:b1], advantages_all[b0:b1], completion_mask_all[b0:b1], cfg,
                             num_tokens=num_tokens, sampler_logp=None if sampler_logprobs_all is None else sampler_logprobs_all[b0:b1])
            # The passes add up to the loss of the whole batch: a grpo or dr_grpo pass averages over its own rows,
            # so it counts by its share of them; bnpo averages the passes, as TRL does; dapo is divided already
            if cfg.loss_type in ("grpo", "dr_grpo"):
                loss = loss * (b1 - b0) / num_rows
            elif cfg.loss_type == "bnpo":
                loss = loss / cfg.grad_accum_steps
            loss.backward()
            # For logging: the KL, how far the ratio is from 1, and how many tokens the clip stopped
            with torch.no_grad():
                valid = completion_mask_all[b0:b1].bool()
                advantages = advantages_all[b0:b1].unsqueeze(-1)
                ratio = torch.where(valid, logprobs - old_logprobs_all[b0:b1], 0.0).exp()
                kl = torch.where(valid, kl_penalty(logprobs, ref_logprobs_all[b0:b1]), 0.0)
                ratio_max = 1 + (cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high)
                clipped = ((ratio < 1 - cfg.clip_eps) & (advantages < 0)) | ((ratio > ratio_max) & (advantages > 0))
                loss_sum += loss.item()
                kl_sum += kl.sum().item()
                clipped_sum += (clipped & valid).sum().item()
                max_ratio_dev = max(max_ratio_dev, (ratio - 1).abs().max().item())
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        # loss, KL and ratio as the first iteration saw them; the clip and the gradient as the last one did
        num_completion_tokens = completion_mask_all.sum().clamp(min=1).item()
        if iteration == 0:
            stats.update(loss=loss_sum, kl=kl_sum / num_completion_tokens, ratio_dev=max_ratio_dev)
        stats.update(clip_frac=clipped_sum / num_completion_tokens, grad_norm=grad_norm.item())
    stats["adv_std"] = advantages_all.std().item()
    stats["completion_len"] = completion_mask_all.sum(dim=1).float().mean().item()
    return stats

# -----------------------------------------------------------------------------
# Training loop

def print_step(stats):
    print0(f"Step {stats['step']} | Average reward: {stats['reward_mean']:.4f} | KL: {stats['kl']:.4f} | loss: {stats['loss']:.6f} | Average sequence length: {stats['completion_len']:.2f} | dt: {stats['dt'] * 1000:.0f}ms", flush=True)

def train(policy, task, cfg, *, steps, batch_size, seed, log=print_step):
    ddp, ddp_rank, ddp_world_size = get_dist_info()
    master_process = ddp_rank == 0 # this process will do the logging
    device = next(policy.parameters()).device
    torch.manual_seed(seed)
    if master_process:
        print(f"Sequences per step: {batch_size} prompts x {cfg.group_size} samples" + (f" on each of {ddp_world_size} ranks" if ddp else ""))

    # The reference model for the KL penalty
    ref_policy = policy
    # The model that takes the update: in DDP when data parallel
    model = DDP(policy) if ddp else policy
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)

    @torch.no_grad()
    def get_batch():
        # The random streams for the prompts and for the sampling
        prompt_generator = torch.Generator().manual_seed(seed + ddp_rank)
        sampling_generator = torch.Generator(device=device).manual_seed(seed + ddp_rank)
        while True:
            prompt_ids, prompt_mask = task.sample_prompts(batch_size, prompt_generator) # (B, P)
            # Sample group_size completions of every prompt, with the current policy
            rollout = generate(policy, prompt_ids.to(device), prompt_mask.to(device), cfg, eos_id=task.eos_id, pad_id=task.pad_id, generator=sampling_generator)
            # Calculate the rewards for each sample
            rewards = task.reward(rollout).to(device) # (N,)
            yield rollout, rewards

    # Kick off the training loop
    batch_iterator = get_batch()
    history = []
    for step in range(1, steps + 1):
        t0 = time.time()
        rollout, rewards = next(batch_iterator)
        stats = grpo_step(model, ref_policy, optimizer, rollout, rewards, cfg)
        stats.update(step=step, reward_mean=rewards.mean().item(), reward_max=rewards.max().item(), dt=time.time() - t0)
        history.append(stats)
        log(stats)
    return history


if __name__ == "__main__":
    import argparse
    from lab import ModelConfig, TinyLM, make_task

    # CLI arguments
    parser = argparse.ArgumentParser(description="GRPO on a toy task")
    # Runtime
    parser.add_argument("--device-type", type=str, default="", choices=["", "cuda", "cpu", "mps"], help="cuda|cpu|mps (empty = autodetect)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the model, the prompts and the samples")
    # Task and training horizon
    parser.add_argument("--task", type=str, default="sum", choices=["sum", "copy"], help="sum|copy")
    parser.add_argument("--steps", type=int, default=40, help="number of optimization steps")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step on each rank")
    # Sampling
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    # Optimization
    parser.add_argument("--num-iterations", type=int, default=2, help="iterations on each batch of rollouts (mu)")
    parser.add_argument("--loss-type", type=str, default="grpo", choices=["grpo", "bnpo", "dr_grpo", "dapo"], help="grpo|bnpo|dr_grpo|dapo")
    parser.add_argument("--scale-rewards", type=str, default="group", choices=["group", "batch", "none"], help="group|batch|none")
    parser.add_argument("--grad-accum-steps", type=int, default=1, help="passes through the model per optimizer step")
    args = parser.parse_args()
    if min(args.steps, args.batch_size, args.num_iterations, args.grad_accum_steps) < 1:
        parser.error("--steps, --batch-size, --num-iterations and --grad-accum-steps must be at least 1")
    try:
        cfg = GRPOConfig(group_size=args.group_size, temperature=args.temperature, num_iterations=args.num_iterations,
                         loss_type=args.loss_type, scale_rewards=args.scale_rewards, grad_accum_steps=args.grad_accum_steps)
    except AssertionError as e:
        parser.error(str(e))

    # Init compute
    device_type = autodetect_device_type() if args.device_type == "" else args.device_type
    if device_type == "cuda" and not torch.cuda.is_available() or device_type == "mps" and not torch.backends.mps.is_available():
        parser.error(f"--device-type={device_type}, but torch sees no such device")
    ddp, ddp_rank, ddp_local_rank, ddp_world_size, device = compute_init(device_type)
    master_process = ddp_rank == 0 # this process will do the logging

    # Init the model (the same weights on every rank) and the task
    torch.manual_seed(args.seed)
    model = TinyLM(ModelConfig()).to(device)
    history = train(model, make_task(args.task), cfg, steps=args.steps, batch_size=args.batch_size, seed=args.seed)
    if master_process:
        first, last = history[:5], history[-5:]
        print(f"Average reward: {sum(s['reward_mean'] for s in first) / len(first):.4f} -> {sum(s['reward_mean'] for s in last) / len(last):.4f}")
    compute_cleanup()
