"""GRPO: Group Relative Policy Optimization on a small causal LM, read top to bottom.

Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300, section 4.1): sample G completions per
prompt, score them with a verifiable reward, use each group's mean and std as the baseline, and take clipped
policy-gradient steps with a k3 KL penalty against a frozen reference policy.

    config -> 1) sample groups -> 2) rewards -> 3) advantages -> 4) log-probs -> 5) KL -> 6) loss
           -> 7) one update (mu inner steps, micro-batched) -> 8) the training loop

Shapes: B prompts, G = group_size, N = B*G rows, P prompt columns (left-padded), T completion columns,
V vocabulary. A model is called as model(input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V) and
derives positions from the mask. Device and dtype come from the model; nothing is tied to CUDA.

Where this departs from the paper. The defaults are eq. 3 as written (each row's token mean, averaged over rows;
each group's z-score of the rewards; a symmetric clip; the k3 KL in the loss, not the reward; mu = 1), except
that adv_eps is added to the std (TRL's 1e-4) and the reference policy stays the starting policy for the whole
run (no reference reset as in the paper's iterative GRPO, section 4.2). The options beyond it take the names
and meanings of TRL's GRPOTrainer:
- loss_type picks how per-token losses become one number (LOSS_TYPES): "grpo" is the per-row mean of eq. 3;
  "bnpo", "dr_grpo" (arXiv 2503.20783) and "dapo" (arXiv 2503.14476) weigh every token alike.
- scale_rewards: divide the centred rewards by the group std (the paper), the batch std, or nothing (Dr. GRPO).
- clip_eps_high: an upper clip bound apart from the lower one (DAPO's clip-higher).
- is_cap: a capped per-token importance weight between pi_old and the sampler that drew the tokens
  (TRL's vllm_importance_sampling_correction, token_truncate mode).
- grad_accum_steps: the batch is backpropagated in micro-batches, one optimizer step per inner iteration.
"""
import copy
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8          # G completions per prompt; the group is the baseline (paper 64, TRL 8)
    max_new_tokens: int = 8      # longest completion T; the toy tasks need at most 4
    temperature: float = 1.0     # sampling temperature; log-probs divide the logits by the same value
    beta: float = 0.04           # KL coefficient (DeepSeekMath 0.04; 0 drops the reference, as Dr. GRPO does)
    clip_eps: float = 0.2        # PPO trust region: ratio clipped to [1 - eps, 1 + eps]
    adv_eps: float = 1e-4        # added to the group std, so an all-equal group gives 0, not NaN (TRL 1e-4)
    num_iterations: int = 1      # mu: policy updates per batch of rollouts (paper 1)
    lr: float = 3e-3             # AdamW learning rate; high because the lab model is tiny (paper 1e-6)
    max_grad_norm: float = 1.0   # global grad-norm clip before each optimizer step
    loss_type: str = "grpo"      # token aggregation, one of LOSS_TYPES (TRL's default is now "dapo")
    scale_rewards: str = "group"  # advantage scale, one of REWARD_SCALES: "group" | "batch" | "none" (TRL)
    clip_eps_high: float | None = None  # upper clip 1 + clip_eps_high; None: clip_eps (DAPO uses 0.28)
    grad_accum_steps: int = 1    # micro-batches per optimizer step; fewer rows in memory at a time
    is_cap: float | None = None  # cap on the pi_old / sampler weight; None: no correction (TRL uses 3.0)

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2: a group of one has no baseline")
        if self.temperature <= 0:
            raise ValueError("temperature must be positive")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, not {self.loss_type!r}")
        if self.scale_rewards not in REWARD_SCALES:
            raise ValueError(f"scale_rewards must be one of {', '.join(REWARD_SCALES)}, not {self.scale_rewards!r}")
        if self.grad_accum_steps < 1:
            raise ValueError("grad_accum_steps must be at least 1")


@dataclass
class Rollout:
    input_ids: torch.Tensor        # (N, P+T) prompt then completion; pad after a row's first EOS
    attention_mask: torch.Tensor   # (N, P+T) 0 on left padding and on pad after EOS
    completion_mask: torch.Tensor  # (N, T) 1 up to and including the first EOS
    prompt_len: int                # P
    sampler_logp: torch.Tensor | None = None  # (N, T) float32 log-prob each token was drawn with; 0 after EOS


# 1) sample a group of G completions per prompt -------------------------------------------------------

def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(N, T) -> (N, T): 1 up to and including each row's first EOS, 0 after; all 1 where no EOS.
    Built from positions, never from ids == pad (pad and EOS may share an id)."""
    N, T = completion_ids.shape
    is_eos = completion_ids == eos_id                                     # (N, T)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), T)  # (N,)
    cols = torch.arange(T, device=completion_ids.device)                  # (T,)
    return (cols[None, :] <= first_eos[:, None]).float()                   # (N, T)


@torch.no_grad()
def generate(policy, prompt_ids, prompt_mask, cfg: GRPOConfig, *, eos_id: int, pad_id: int,
             generator=None) -> Rollout:
    """Repeat each prompt G times contiguously and sample completions from softmax(logits / temperature).
    A row ends at its first EOS: EOS kept, pad after it with attention 0. Stops once every row has ended.
    Records the log-prob each token was drawn with (rollout.sampler_logp), as an inference engine reports it.
    Uses the model's KV cache when it offers one (model.make_cache()), else recomputes the prefix."""
    ids = prompt_ids.repeat_interleave(cfg.group_size, dim=0)             # (N, P) rows i*G..i*G+G-1: prompt i
    mask = prompt_mask.repeat_interleave(cfg.group_size, dim=0)           # (N, P)
    P = ids.shape[1]
    ended = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)  # (N,)
    cache = policy.make_cache() if hasattr(policy, "make_cache") else None
    new = ids                                                             # columns the model has not seen
    drawn_logp = []                                                       # T tensors of (N,)
    for _ in range(cfg.max_new_tokens):
        if cache is None:
            logits = policy(ids, mask)[:, -1]                             # (N, V)
        else:
            logits = policy(new, mask, cache=cache)[:, -1]                # (N, V)
        logprobs = torch.log_softmax(logits.float() / cfg.temperature, dim=-1)  # (N, V)
        tok = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)  # (N,)
        drawn_logp.append(torch.where(ended, 0.0, logprobs.gather(1, tok[:, None]).squeeze(1)))  # (N,)
        tok = torch.where(ended, pad_id, tok)                             # (N,) pad after EOS
        ids = torch.cat([ids, tok[:, None]], dim=1)                       # (N, P+t)
        mask = torch.cat([mask, (~ended).to(mask.dtype)[:, None]], dim=1)  # (N, P+t)
        ended = ended | (tok == eos_id)
        new = tok[:, None]                                                # (N, 1)
        if ended.all():
            break
    return Rollout(ids, mask, completion_mask(ids[:, P:], eos_id), P, torch.stack(drawn_logp, dim=1))


# 3) advantages: each reward against its own group -----------------------------------------------------
# The divisor of the centred rewards, by scale_rewards (TRL's names). r is (B, G).

def group_std(r: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, 1): each group's own std, the paper's z-score (TRL scale_rewards="group")."""
    std = r.std(dim=1, keepdim=True)                                      # (B, 1) Bessel-corrected
    return std + eps


def batch_std(r: torch.Tensor, eps: float) -> torch.Tensor:
    """(): one std over all N rewards of the batch (PPO Lite, arXiv 2508.08221; TRL "batch")."""
    return r.std() + eps


def no_scale(r: torch.Tensor, eps: float) -> torch.Tensor:
    """(): centre only, no division (Dr. GRPO, arXiv 2503.20783; TRL "none")."""
    return torch.ones((), dtype=r.dtype, device=r.device)


REWARD_SCALES: dict[str, Callable] = {"group": group_std, "batch": batch_std, "none": no_scale}


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float, scale: str = "group") -> torch.Tensor:
    """(N,) -> (N,): (r - group mean) / REWARD_SCALES[scale], groups = contiguous runs of G, std unbiased.
    One scalar per completion, shared by all its tokens (outcome supervision, paper section 4.1.2)."""
    r = rewards.detach().float().view(-1, group_size)                     # (B, G)
    mean = r.mean(dim=1, keepdim=True)                                    # (B, 1)
    return ((r - mean) / REWARD_SCALES[scale](r, eps)).view(-1)          # (N,)


# 4) per-token log-probs of the sampled completion -------------------------------------------------------

def token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """(N, P+T) -> (N, T): log pi(token at column P+t | columns before it), at the sampling temperature.
    The logits at column c predict the token at column c+1; log-softmax runs in float32."""
    logits = model(input_ids, attention_mask)                             # (N, P+T, V)
    logits = logits[:, prompt_len - 1:-1].float() / temperature           # (N, T, V)
    targets = input_ids[:, prompt_len:]                                   # (N, T)
    logp = torch.log_softmax(logits, dim=-1)                              # (N, T, V)
    return logp.gather(-1, targets[..., None]).squeeze(-1)                # (N, T)


# 5) the KL penalty against the frozen reference -------------------------------------------------------

def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) -> (N, T): Schulman's k3 estimator of KL(pi || pi_ref) on the sampled tokens,
    pi_ref/pi - log(pi_ref/pi) - 1 (paper eq. 4). Unbiased and never negative."""
    log_ratio = ref_logp - logp                                           # (N, T)
    return torch.exp(log_ratio) - log_ratio - 1                           # (N, T)


# 6) the clipped surrogate loss ------------------------------------------------------------------------
# LOSS_TYPES: how one call's masked per-token losses (N, T) become a scalar.

def per_row_token_mean(per_token, mask, cfg, num_tokens):
    """Mean over rows of each row's token mean: DeepSeekMath eq. 3 (TRL loss_type="grpo")."""
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (N,)
    return per_row.mean()


def local_token_mean(per_token, mask, cfg, num_tokens):
    """Token sum over this call's token count (TRL "bnpo": normalized per micro-batch)."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def max_length_sum(per_token, mask, cfg, num_tokens):
    """Token sum over rows * the configured max length, a constant (Dr. GRPO, arXiv 2503.20783; TRL "dr_grpo")."""
    return (per_token * mask).sum() / (per_token.shape[0] * cfg.max_new_tokens)


def global_token_mean(per_token, mask, cfg, num_tokens):
    """Token sum over the tokens of the whole accumulated batch, num_tokens (DAPO, arXiv 2503.14476;
    TRL "dapo"); this call's own count when num_tokens is None."""
    return (per_token * mask).sum() / (mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens)


LOSS_TYPES: dict[str, Callable] = {"grpo": per_row_token_mean, "bnpo": local_token_mean,
                                   "dr_grpo": max_length_sum, "dapo": global_token_mean}


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg: GRPOConfig, *,
              num_tokens=None, sampler_logp=None) -> torch.Tensor:
    """Scalar: LOSS_TYPES[cfg.loss_type] over the completion tokens of
    minus PPO's clipped surrogate * w + beta * kl (paper eq. 3, TRL's _compute_loss),
    where w = min(pi_old / pi_sampler, is_cap) when cfg.is_cap and sampler_logp are given, else 1.
    Inputs (N, T); whatever sits at masked positions (pad, inf, NaN) reaches neither the loss nor its gradient."""
    mask = completion_mask.bool()                                         # (N, T)
    logp, old_logp, ref_logp = (torch.where(mask, x, 0.0) for x in (logp, old_logp, ref_logp))  # (N, T)
    ratio = torch.exp(logp - old_logp)                                    # (N, T) pi / pi_old
    adv = advantages[:, None]                                             # (N, 1) one advantage per row
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps, 1 + eps_high)          # (N, T)
    surrogate = torch.max(ratio * adv, clipped * adv)                     # (N, T)
    if cfg.is_cap is not None and sampler_logp is not None:
        drift = torch.where(mask, old_logp - sampler_logp, 0.0)           # (N, T) log pi_old / pi_sampler
        surrogate = surrogate * torch.exp(drift).clamp(max=cfg.is_cap).detach()  # (N, T)
    per_token = -surrogate + cfg.beta * kl_penalty(logp, ref_logp)        # (N, T)
    return LOSS_TYPES[cfg.loss_type](per_token, mask.to(per_token.dtype), cfg, num_tokens)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean over the whole batch, for logging."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


# 7) one update: mu optimizer steps on one batch of rollouts --------------------------------------------

def world_position() -> tuple:
    """(rank, world size) under an initialized torch.distributed, else (0, 1): one process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def batch_token_count(mask: torch.Tensor) -> torch.Tensor:
    """Completion tokens in the whole batch, across data-parallel ranks, per rank (TRL's
    num_items_in_batch / num_processes): the dapo normalizer every micro-batch shares."""
    count = mask.sum().float()
    _, world = world_position()
    if world > 1:
        dist.all_reduce(count)
    return count.clamp(min=1.0) / world


def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards, cfg: GRPOConfig) -> dict:
    """Advantages and pi_ref log-probs under no_grad, then num_iterations times: zero_grad,
    for each of grad_accum_steps contiguous micro-batches log-probs, loss, backward; clip_grad_norm_, step.
    The reference is never stepped. `policy` may be wrapped in DistributedDataParallel."""
    ddp = isinstance(policy, DistributedDataParallel)
    advantages = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)  # (N,)
    mask = rollout.completion_mask                                        # (N, T)
    N = mask.shape[0]
    micro_batches = torch.tensor_split(torch.arange(N, device=mask.device), cfg.grad_accum_steps)  # k x (n,)
    micro_batches = [rows for rows in micro_batches if len(rows) > 0]

    def logprobs(model, rows):                                            # (n, T)
        return token_logprobs(model, rollout.input_ids[rows], rollout.attention_mask[rows], rollout.prompt_len,
                              cfg.temperature)

    with torch.no_grad():
        ref_logp = torch.cat([logprobs(ref_policy, rows) for rows in micro_batches])  # (N, T) pi_ref, frozen
    sampler_logp = rollout.sampler_logp if cfg.is_cap is not None else None  # (N, T) or None
    num_tokens = batch_token_count(mask)
    per_iteration = []
    for _ in range(cfg.num_iterations):
        with torch.no_grad():
            old_logp = torch.cat([logprobs(policy, rows) for rows in micro_batches])  # (N, T)
        optimizer.zero_grad(set_to_none=True)
        loss, logp = 0.0, []
        for micro_step, rows in enumerate(micro_batches):
            if ddp:
                # in DDP training we only need to sync gradients at the last micro step; this is the flag
                # model.no_sync() toggles, set before the forward pass
                policy.require_backward_grad_sync = (micro_step == len(micro_batches) - 1)
            logp.append(logprobs(policy, rows))                           # (n, T)
            micro_loss = grpo_loss(logp[-1], old_logp[rows], ref_logp[rows], advantages[rows], mask[rows], cfg,
                                   num_tokens=num_tokens,
                                   sampler_logp=None if sampler_logp is None else sampler_logp[rows])
            # scale the loss to account for gradient accumulation: a row mean (grpo, dr_grpo) counts each
            # micro-batch by its share of the rows, bnpo averages the micro-batches' own token means (as TRL
            # does), and dapo's num_tokens already counts the whole batch
            if cfg.loss_type in ("grpo", "dr_grpo"):
                micro_loss = micro_loss * (len(rows) / N)
            elif cfg.loss_type == "bnpo":
                micro_loss = micro_loss * (1 / cfg.grad_accum_steps)
            micro_loss.backward()
            loss += micro_loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        stats = step_stats(torch.cat(logp).detach(), old_logp, ref_logp, advantages, mask, cfg)
        per_iteration.append({**stats, "loss": float(loss), "grad_norm": grad_norm.item()})
    first, last = per_iteration[0], per_iteration[-1]
    return {"loss": first["loss"], "kl": first["kl"], "ratio_dev": first["ratio_dev"],
            "clip_frac": last["clip_frac"], "grad_norm": last["grad_norm"],
            "adv_std": advantages.std().item(), "completion_len": mask.sum(dim=1).float().mean().item()}


@torch.no_grad()
def step_stats(logp, old_logp, ref_logp, advantages, mask, cfg: GRPOConfig) -> dict:
    """For the log, over the completion tokens of the batch: the mean KL, the largest |ratio - 1|, and the
    share of tokens whose push the clip stopped (ratio past the bound on the side its advantage pushes, TRL's
    clip_ratio/region_mean)."""
    keep = mask.bool()                                                    # (N, T)
    logp, old_logp, ref_logp = (torch.where(keep, x, 0.0) for x in (logp, old_logp, ref_logp))
    ratio = torch.exp(logp - old_logp)                                    # (N, T)
    adv = advantages[:, None]                                             # (N, 1)
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    clipped = ((ratio < 1 - cfg.clip_eps) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))  # (N, T)
    return {"kl": masked_mean(kl_penalty(logp, ref_logp), mask).item(),
            "ratio_dev": (ratio - 1).abs().max().item(),
            "clip_frac": masked_mean(clipped.float(), mask).item()}


# 8) the training loop ---------------------------------------------------------------------------------

def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=None) -> list:
    """Reference = frozen deepcopy of the policy at the start; AdamW(lr); each step: B prompts from the task,
    G completions each, the task's rewards, one grpo_step. Returns one stats dict per step, and hands each to
    `log` as it comes (without one, the master process prints a line per step).
    Data-parallel when torch.distributed is initialized: every rank draws its own prompts and samples its own
    groups (seeded by seed + rank), and the update goes through DistributedDataParallel, which averages the
    gradients over the ranks; each rank keeps its own copy of the reference."""
    # various inits, derived attributes
    ddp_rank, ddp_world_size = world_position()
    ddp = ddp_world_size > 1                                              # is this a ddp run?
    master_process = ddp_rank == 0                                        # this process will do the printing
    seed_offset = ddp_rank                                                # each process gets a different seed
    torch.manual_seed(seed)
    device = next(policy.parameters()).device
    prompt_gen = torch.Generator().manual_seed(seed + seed_offset)        # the task samples on the CPU
    sample_gen = torch.Generator(device=device).manual_seed(seed + seed_offset)

    # the reference policy: the starting weights, frozen; it is never wrapped or stepped
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    # wrap the policy into a DDP container: the update goes through it, sampling uses the raw policy
    model = DistributedDataParallel(policy) if ddp else policy

    history = []
    t0 = time.time()
    for iter_num in range(1, steps + 1):
        prompt_ids, prompt_mask = task.sample_prompts(batch_size, prompt_gen)  # (B, P)
        rollout = generate(policy, prompt_ids.to(device), prompt_mask.to(device), cfg,
                           eos_id=task.eos_id, pad_id=task.pad_id, generator=sample_gen)
        rewards = task.reward(rollout).to(device)                         # (N,)
        stats = grpo_step(model, ref_policy, optimizer, rollout, rewards, cfg)
        stats = {"step": iter_num, "reward_mean": rewards.mean().item(), "reward_max": rewards.max().item(), **stats}
        history.append(stats)

        # timing and logging
        t1 = time.time()
        dt = t1 - t0
        t0 = t1
        if log is not None:
            log(stats)
        elif master_process:
            print(f"iter {iter_num}: loss {stats['loss']:.4f}, reward {stats['reward_mean']:.3f}, "
                  f"kl {stats['kl']:.4f}, clip {stats['clip_frac']:.2f}, time {dt * 1000:.2f}ms", flush=True)
    return history


if __name__ == "__main__":
    from lab import ModelConfig, SumTask, TinyLM
    torch.manual_seed(0)
    train(TinyLM(ModelConfig()), SumTask(), GRPOConfig(num_iterations=2), steps=40, batch_size=16, seed=0)
