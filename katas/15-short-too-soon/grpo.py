"""
GRPO on a small causal LM, all of it in this single file: sample a group of completions per prompt, score each
one against the others of its prompt, and step the policy on the clipped surrogate with a KL penalty against a
reference policy. Runs as one process, or under torch.distributed with DDP.
References:
1) DeepSeekMath, the GRPO objective (eq. 3) and its KL estimator (eq. 4):
https://arxiv.org/abs/2402.03300
2) DAPO, its token-level loss (loss_type 'dapo') and clip-higher (clip_eps_high):
https://arxiv.org/abs/2503.14476
3) Dr. GRPO, which drops the length and the std normalization (loss_type 'dr_grpo', scale_rewards 'none'):
https://arxiv.org/abs/2503.20783
4) GSPO, one importance ratio per sequence (importance_sampling_level 'sequence'):
https://arxiv.org/abs/2507.18071
5) MiniMax-M1's CISPO (loss_type 'cispo'), and ScaleRL, which sets its cap:
https://arxiv.org/abs/2506.13585 https://arxiv.org/abs/2510.13786
6) SAPO, a soft gate in place of the clip (loss_type 'sapo'):
https://arxiv.org/abs/2511.20347
7) INTELLECT-2, which caps the ratio on the unclipped side too (delta):
https://arxiv.org/abs/2505.07291
8) Beyond the 80/20 Rule, the policy gradient on the high-entropy tokens only (top_entropy_quantile):
https://arxiv.org/abs/2506.01939
9) DeepSeek-V3.2, the KL weighed by the ratio and the off-policy sequence mask:
https://arxiv.org/abs/2512.02556
"""

import copy
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# Shapes: B prompts, G = group_size, N = B*G rows, P prompt columns (left-padded), T completion columns,
# V vocabulary. A model is called as model(input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V) and
# derives positions from the mask. Device and dtype come from the model.


@dataclass
class GRPOConfig:
    group_size: int = 8          # G completions per prompt (paper 64)
    max_new_tokens: int = 8      # longest completion T; the toy tasks need at most 4
    temperature: float = 1.0     # sampling temperature
    beta: float = 0.04           # KL coefficient (paper 0.04)
    clip_eps: float = 0.2        # PPO clip range
    adv_eps: float = 1e-4        # std epsilon in the advantages
    num_iterations: int = 1      # mu in the paper; 1 is on-policy
    lr: float = 3e-3             # AdamW learning rate; high because the lab model is tiny (paper 1e-6)
    max_grad_norm: float = 1.0   # clip gradients at this value
    loss_type: str = "grpo"      # 'grpo' (the paper) or 'bnpo', 'dr_grpo', 'dapo', 'cispo', 'sapo'
    scale_rewards: str = "group"  # 'group' (the paper) or 'batch', 'none'
    clip_eps_high: float | None = None  # None: clip_eps; DAPO's clip-higher uses 0.28; cispo's cap (None: 5.0)
    grad_accum_steps: int = 1    # used to simulate larger batch sizes
    is_cap: float | None = None  # truncated importance sampling against the sampler; None: off
    importance_sampling_level: str = "token"  # one ratio per token (the paper); 'sequence': one per row (GSPO)
    sapo_temperature_pos: float = 1.0   # loss_type 'sapo': the gate's temperature where A > 0 (SAPO's values)
    sapo_temperature_neg: float = 1.05  # and where A <= 0, a little steeper
    delta: float | None = None   # None: off; INTELLECT-2 bounds the unclipped ratio at 4
    top_entropy_quantile: float = 1.0  # 1.0 trains on every token; the 80/20 paper's 0.2 on the top fifth by entropy
    mask_truncated_completions: bool = False  # False trains on every row; True: DAPO's overlong filtering
    rollout_is_mode: str | None = None  # None: off; token_truncate, token_mask, sequence_truncate, sequence_mask
    rollout_is_clip_min: float | None = None  # bounds of that correction (TRL's defaults); None: unbounded
    rollout_is_clip_max: float | None = 3.0
    use_bias_correction_kl: bool = False  # False: the paper's KL term; True: DeepSeek-V3.2's, as TRL defaults to
    off_policy_mask_threshold: float | None = None  # None: off; DeepSeek-V3.2's off-policy sequence mask, e.g. 0.5

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2: a group of one has no baseline")
        if self.temperature <= 0:
            raise ValueError("temperature must be positive")
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"):
            raise ValueError(f"loss_type must be grpo, bnpo, dr_grpo, dapo, cispo or sapo, not {self.loss_type!r}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"scale_rewards must be group, batch or none, not {self.scale_rewards!r}")
        if self.grad_accum_steps < 1:
            raise ValueError("grad_accum_steps must be at least 1")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(f"importance_sampling_level must be token or sequence, not "
                             f"{self.importance_sampling_level!r}")
        if not min(self.sapo_temperature_pos, self.sapo_temperature_neg) > 0:
            raise ValueError("sapo_temperature_pos and sapo_temperature_neg must be positive")
        if self.delta is not None and not self.delta > 1:
            raise ValueError("delta must be None or above 1 (it bounds the ratio, which is 1 on-policy)")
        if not 0 <= self.top_entropy_quantile <= 1:
            raise ValueError("top_entropy_quantile must be from 0 to 1")
        if not (isinstance(self.mask_truncated_completions, bool) and isinstance(self.use_bias_correction_kl, bool)):
            raise ValueError("mask_truncated_completions and use_bias_correction_kl must be True or False")
        modes = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
        if self.rollout_is_mode not in (None, *modes):
            raise ValueError(f"rollout_is_mode must be None, {', '.join(modes)}, not {self.rollout_is_mode!r}")
        if self.is_cap is not None and self.rollout_is_mode is not None:
            raise ValueError("is_cap is rollout_is_mode 'token_truncate' with rollout_is_clip_max = is_cap: set one")
        lo, hi = self.rollout_is_clip_min, self.rollout_is_clip_max
        if lo is not None and hi is not None and not lo < hi:
            raise ValueError("rollout_is_clip_min must be below rollout_is_clip_max")
        if self.rollout_is_mode is not None and lo is None and hi is None:
            raise ValueError(f"rollout_is_mode {self.rollout_is_mode!r} needs a rollout_is_clip_min or _max")
        if self.off_policy_mask_threshold is not None and not self.off_policy_mask_threshold > 0:
            raise ValueError("off_policy_mask_threshold must be None or positive")


@dataclass
class Rollout:
    input_ids: torch.Tensor        # (N, P+T) prompt, then completion
    attention_mask: torch.Tensor   # (N, P+T)
    completion_mask: torch.Tensor  # (N, T) the completion tokens the loss trains on
    prompt_len: int                # P
    sampler_logp: torch.Tensor | None = None  # (N, T) as the sampler reported them

# -----------------------------------------------------------------------------
# 1) sample a group of G completions per prompt

def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(N, T) -> (N, T): 1 on each completion's tokens through its end, 0 on the pad after it."""
    cols = torch.arange(completion_ids.size(1), device=completion_ids.device)  # (T,)
    first_eos = (completion_ids == eos_id).int().argmax(dim=1)            # (N,) the first hit
    return (cols <= first_eos[:, None]).float()                           # (N, T)


@torch.no_grad()
def generate(policy, prompt_ids, prompt_mask, cfg: GRPOConfig, *, eos_id: int, pad_id: int,
             generator=None) -> Rollout:
    """
    Take the prompts (B, P), repeat each one G times in a row, and complete every row max_new_tokens times,
    feeding the predictions back into the model each time. A row that samples EOS is done: from then on it
    takes pad. Returns a Rollout, with each sampled token's log-prob as the sampler computed it.
    Uses the model's KV cache when it offers one (model.make_cache()), else recomputes the prefix.
    """
    idx = prompt_ids.repeat_interleave(cfg.group_size, dim=0)             # (N, P) rows i*G..i*G+G-1: prompt i
    mask = prompt_mask.repeat_interleave(cfg.group_size, dim=0)           # (N, P)
    P = idx.size(1)
    done = torch.zeros_like(idx[:, :1], dtype=torch.bool)                 # (N, 1)
    make_cache = getattr(policy, "make_cache", None)                      # the model's KV cache, if it offers one
    cache = make_cache() if make_cache is not None else None
    p_drawn = []                                                          # T tensors of (N, 1)
    for _ in range(cfg.max_new_tokens):
        # with a KV cache the model has already seen every column but the newest one
        idx_cond = idx if cache is None or idx.size(1) == P else idx[:, -1:]
        # forward the model to get the logits for the index in the sequence
        logits = policy(idx_cond, mask) if cache is None else policy(idx_cond, mask, cache=cache)
        # pluck the logits at the final step, in float32 or wider, and scale by desired temperature
        logits = logits[:, -1, :]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / cfg.temperature
        # apply softmax to convert logits to (normalized) probabilities
        probs = F.softmax(logits, dim=-1)                                 # (N, V)
        # sample from the distribution
        idx_next = torch.multinomial(probs, num_samples=1, generator=generator)  # (N, 1)
        p_drawn.append(probs.gather(1, idx_next).masked_fill(done, 1.0))  # (N, 1)
        # a row that has ended takes pad
        idx_next = idx_next.masked_fill(done, pad_id)
        idx = torch.cat((idx, idx_next), dim=1)                           # (N, P+t)
        mask = torch.cat((mask, mask[:, -1:]), dim=1)                     # (N, P+t)
        done = done | (idx_next == eos_id)
        if done.all():
            break
    comp_mask = completion_mask(idx[:, P:], eos_id)                       # (N, T)
    if cfg.mask_truncated_completions:
        comp_mask = comp_mask * done                                      # (N, T) DAPO's overlong filtering
    return Rollout(idx, mask, comp_mask, P, torch.cat(p_drawn, dim=1).log())

# -----------------------------------------------------------------------------
# 2) advantages

def group_advantages(rewards: torch.Tensor, group_size: int, eps: float, scale: str = "group") -> torch.Tensor:
    """(N,) -> (N,): each reward against the G rewards of its prompt, scaled as `scale` says: 'group',
    'batch' or 'none' (Dr. GRPO)."""
    r = rewards.detach().view(-1, group_size).to(torch.promote_types(rewards.dtype, torch.float32))  # (B, G)
    centred = r - r.mean(dim=1, keepdim=True)                             # (B, G)
    if scale == "none":
        return centred.view(-1)                                           # (N,)
    std = r.std(dim=1 if scale == "group" else (0, 1), keepdim=True)      # (B, 1) the group's, or (1, 1) the batch's
    return (centred / (std + eps)).view(-1)                               # (N,)

# -----------------------------------------------------------------------------
# 3) per-token log-probs of the sampled completion

def next_token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """(N, P+T) -> (N, T, V): log pi(. | the columns before P+t) over the vocabulary.
    The logits at column c predict the token at column c+1; log-softmax runs in float32, or in the model's
    dtype where that is wider."""
    logits = model(input_ids, attention_mask)                             # (N, P+T, V)
    logits = logits[:, prompt_len - 1:-1]                                 # (N, T, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = torch.log_softmax(logits, dim=-1)                              # (N, T, V)
    return logp


def token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """(N, P+T) -> (N, T): log pi(token at column P+t | columns before it), at the sampling temperature."""
    logp = next_token_logprobs(model, input_ids, attention_mask, prompt_len, temperature)  # (N, T, V)
    targets = input_ids[:, prompt_len:]                                   # (N, T)
    return logp.gather(-1, targets[..., None]).squeeze(-1)                # (N, T)


def token_entropies(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """(N, P+T) -> (N, T): the entropy of the distribution each completion token was scored under."""
    logp = next_token_logprobs(model, input_ids, attention_mask, prompt_len, temperature)  # (N, T, V)
    return -(logp.exp() * logp).sum(dim=-1)                               # (N, T)


# -----------------------------------------------------------------------------
# 4) the KL penalty

def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) -> (N, T): Schulman's k3 estimator of KL(pi || pi_ref) on the sampled tokens,
    pi_ref/pi - log(pi_ref/pi) - 1 (paper eq. 4). Unbiased and never negative."""
    log_ratio = ref_logp - logp                                           # (N, T)
    return torch.exp(log_ratio) - log_ratio - 1                           # (N, T)

# -----------------------------------------------------------------------------
# 5) the surrogate loss

def row_mean(x, keep) -> torch.Tensor:
    """(N, T) -> (N, 1): each row's mean over its completion tokens."""
    return x.where(keep, 0.0).sum(dim=1, keepdim=True) / keep.sum(dim=1, keepdim=True).clamp(min=1)


def clipped_surrogate(ratio, adv, cfg: GRPOConfig) -> tuple:
    """(N, T) -> (N, T): PPO's clipped surrogate (paper eq. 3) with DAPO's clip-higher and INTELLECT-2's delta;
    and, for the log, where the clipped term is the smaller one."""
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    surr1 = (ratio if cfg.delta is None else ratio.clamp(max=cfg.delta)) * adv  # (N, T)
    surr2 = ratio.clamp(1 - cfg.clip_eps, 1 + eps_high) * adv             # (N, T)
    pg = -torch.min(surr1, surr2)                                         # (N, T)
    return pg, surr2 < surr1


def cispo_surrogate(ratio, adv, logp, cfg: GRPOConfig) -> tuple:
    """(N, T) -> (N, T): MiniMax-M1's CISPO surrogate, its cap set as ScaleRL sets it; and, for the log, where
    the cap binds."""
    cap = 5.0 if cfg.clip_eps_high is None else cfg.clip_eps_high
    weight = ratio.clamp(max=cap).detach()                                # (N, T)
    return -weight * adv * logp, ratio > cap


def sapo_surrogate(ratio, adv, cfg: GRPOConfig) -> tuple:
    """(N, T) -> (N, T): SAPO's surrogate, a soft gate in place of the clip; nothing is clipped."""
    tau = torch.where(adv > 0, ratio.new_tensor(cfg.sapo_temperature_pos),
                      ratio.new_tensor(cfg.sapo_temperature_neg))         # (N, 1)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau                     # (N, T)
    return -gate * adv, torch.zeros_like(ratio, dtype=torch.bool)


def off_policy_rows(logp, sampler_logp, adv, keep, threshold: float) -> torch.Tensor:
    """(N, T) -> (N, 1): DeepSeek-V3.2's off-policy sequence mask, the rows whose policy term counts."""
    drift = row_mean(sampler_logp - logp.detach(), keep)                  # (N, 1)
    return (adv >= 0) | (drift <= threshold)                              # (N, 1)


def high_entropy_tokens(entropies, keep, quantile: float) -> torch.Tensor:
    """(N, T) -> (N, T): the 80/20 paper's high-entropy (forking) tokens among the completion tokens."""
    if not keep.any():
        return keep
    threshold = torch.quantile(entropies[keep], 1 - quantile)             # ()
    return (entropies >= threshold) & keep                                # (N, T)


def rollout_weights(old_logp, sampler_logp, keep, cfg: GRPOConfig) -> torch.Tensor:
    """(N, T) -> (N, T): the correction for the sampler that cfg.rollout_is_mode (or cfg.is_cap) asks for, one
    weight a token or a row."""
    mode, lo, hi = cfg.rollout_is_mode, cfg.rollout_is_clip_min, cfg.rollout_is_clip_max
    if cfg.is_cap is not None:
        mode, lo, hi = "token_truncate", None, cfg.is_cap
    lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
    drift = torch.where(keep, old_logp - sampler_logp, 0.0)               # (N, T) log pi_old / pi_sampler
    if mode.startswith("sequence"):
        drift = drift.sum(dim=1, keepdim=True).expand_as(drift)           # (N, T) the row's, on each token
    weight = torch.exp(drift).detach()                                    # (N, T)
    if mode.endswith("truncate"):
        return weight.clamp(lo, hi)                                       # (N, T)
    return weight.where((weight >= lo) & (weight <= hi), 0.0)             # (N, T)


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg: GRPOConfig, *,
              num_tokens=None, sampler_logp=None, entropies=None, stats=None) -> torch.Tensor:
    """Scalar loss of a batch of completions, (N, T) each: the surrogate loss_type names (PPO's clipped one, paper
    eq. 3, or CISPO's or SAPO's) on the ratio importance_sampling_level names, masked and corrected for the sampler
    as cfg asks, plus beta times the KL penalty; loss_type says how the completion tokens are weighed, num_tokens
    is dapo's and cispo's count, `entropies` (N, T) the policy's, for top_entropy_quantile. Given a dict `stats`,
    the loss also puts there, for the log, its own (N, T) ratio and KL, and where the clip binds."""
    keep = completion_mask.bool()                                         # (N, T)
    log_ratio = (logp - old_logp).where(keep, 0.0)                        # (N, T) log pi / pi_old
    if cfg.importance_sampling_level == "sequence":
        log_ratio = row_mean(log_ratio, keep).expand_as(log_ratio)        # (N, T) GSPO: the row's, on each token
    ratio = torch.exp(log_ratio)                                          # (N, T) pi / pi_old
    adv = advantages[:, None]                                             # (N, 1) one advantage per row
    if cfg.loss_type == "cispo":
        pg, clipped = cispo_surrogate(ratio, adv, logp.where(keep, 0.0), cfg)  # (N, T)
    elif cfg.loss_type == "sapo":
        pg, clipped = sapo_surrogate(ratio, adv, cfg)                     # (N, T)
    else:
        pg, clipped = clipped_surrogate(ratio, adv, cfg)                  # (N, T)
    if cfg.off_policy_mask_threshold is not None:
        behaviour = old_logp if sampler_logp is None else sampler_logp    # (N, T) what sampled the tokens
        pg = pg * off_policy_rows(logp, behaviour, adv, keep, cfg.off_policy_mask_threshold)  # (N, T)
    if cfg.top_entropy_quantile < 1.0 and entropies is not None:
        pg = pg * high_entropy_tokens(entropies, keep, cfg.top_entropy_quantile)  # (N, T)
    if sampler_logp is not None and (cfg.is_cap is not None or cfg.rollout_is_mode is not None):
        pg = pg * rollout_weights(old_logp, sampler_logp, keep, cfg)      # (N, T)
    kl = torch.zeros_like(pg).masked_scatter(keep, kl_penalty(logp[keep], ref_logp[keep]))  # (N, T) 0 on the padding
    if cfg.use_bias_correction_kl:
        kl = kl * ratio                                                   # (N, T) DeepSeek-V3.2
    per_token = pg + cfg.beta * kl                                        # (N, T)
    if stats is not None:
        stats.update(ratio=ratio.detach(), kl=kl.detach(), clipped=clipped)

    # how much each token counts, by loss_type
    N, mask = keep.size(0), keep.to(per_token.dtype)
    if cfg.loss_type in ("grpo", "sapo"):
        weight = mask / mask.numel()                                      # (N, T)
    elif cfg.loss_type == "bnpo":
        weight = mask / mask.sum().clamp(min=1.0)                         # (N, T)
    elif cfg.loss_type == "dr_grpo":
        weight = mask / (N * cfg.max_new_tokens)                          # (N, T)
    else:  # dapo, cispo
        weight = mask / (mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens)  # (N, T)
    return (per_token * weight).sum()


# -----------------------------------------------------------------------------
# 6) one update on a batch of rollouts

def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards, cfg: GRPOConfig) -> dict:
    """One update on a batch of rollouts; returns the stats of the step. `policy` may be wrapped in
    DistributedDataParallel."""
    ddp = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1  # is this a ddp run?
    ddp_world_size = dist.get_world_size() if ddp else 1
    advantages = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)  # (N,)
    mask = rollout.completion_mask                                        # (N, T)
    N = mask.size(0)
    gradient_accumulation_steps = min(cfg.grad_accum_steps, N)
    # the rows of each micro step: N split as evenly as it goes, in order
    micro_batches = torch.arange(N, device=mask.device).tensor_split(gradient_accumulation_steps)

    def logprobs(model, rows):                                            # (n, T)
        return token_logprobs(model, rollout.input_ids[rows], rollout.attention_mask[rows], rollout.prompt_len,
                              cfg.temperature)

    @torch.no_grad()
    def entropies(model, rows):                                           # (n, T), or None where nothing reads them
        if cfg.top_entropy_quantile == 1.0:
            return None
        return token_entropies(model, rollout.input_ids[rows], rollout.attention_mask[rows], rollout.prompt_len,
                               cfg.temperature)

    with torch.no_grad():
        old_logp = torch.cat([logprobs(policy, rows) for rows in micro_batches])  # (N, T) pi_old, the sampler
        ref_logp = torch.cat([logprobs(ref_policy, rows) for rows in micro_batches])  # (N, T) pi_ref, frozen
    sampler_logp = rollout.sampler_logp                                   # (N, T) or None, as the sampler reported them
    # dapo divides by every completion token of the batch, on all processes; DDP then averages the processes'
    # gradients, so each process takes its share of that count
    num_tokens = mask.sum().float() / ddp_world_size
    if ddp:
        dist.all_reduce(num_tokens)
    num_tokens = num_tokens.clamp(min=1.0 / ddp_world_size)
    per_iteration = []
    optimizer.zero_grad(set_to_none=True)  # the micro steps accumulate into .grad: start from none
    for _ in range(cfg.num_iterations):
        lossf, seen = 0.0, []
        for micro_step, rows in enumerate(micro_batches):
            if ddp:
                # in DDP training we only need to sync gradients at the last micro step; this is the flag
                # model.no_sync() toggles, set before the forward pass
                policy.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
            logp = logprobs(policy, rows)                                 # (n, T)
            seen.append({})                                               # for the log: what the loss saw
            loss = grpo_loss(logp, old_logp[rows], ref_logp[rows], advantages[rows], mask[rows], cfg,
                             num_tokens=num_tokens, sampler_logp=None if sampler_logp is None else sampler_logp[rows],
                             entropies=entropies(policy, rows), stats=seen[-1])
            # each loss_type scales its micro step its own way, not all by 1 / gradient_accumulation_steps
            if cfg.loss_type == "bnpo":
                loss = loss / gradient_accumulation_steps # scale the loss to account for gradient accumulation
            elif cfg.loss_type not in ("dapo", "cispo"):
                loss = loss * len(rows) / N # a mean over rows: this micro-batch weighs as its share of the rows
            loss.backward()
            lossf += loss.item()
        # clip the gradient
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        # step the optimizer
        optimizer.step()
        # flush the gradients as soon as we can, no need for this memory anymore
        optimizer.zero_grad(set_to_none=True)
        per_iteration.append({**step_stats(seen, mask), "loss": lossf, "grad_norm": grad_norm.item()})
    first, last = per_iteration[0], per_iteration[-1]
    return {"loss": first["loss"], "kl": first["kl"], "ratio_dev": first["ratio_dev"],
            "clip_frac": last["clip_frac"], "grad_norm": last["grad_norm"],
            "adv_std": advantages.std().item(), "completion_len": mask.sum(dim=1).float().mean().item()}


@torch.no_grad()
def step_stats(seen: list, mask) -> dict:
    """For the log, from what grpo_loss saw of each micro-batch (its `stats`), over the completion tokens of the
    batch: the mean KL, the largest |ratio - 1|, and the share of tokens whose clipped surrogate is below the
    unclipped one."""
    keep = mask.bool()                                                    # (N, T)
    n = max(int(keep.sum()), 1)
    ratio, kl, clipped = (torch.cat([s[name] for s in seen])[keep] for name in ("ratio", "kl", "clipped"))  # (M,)
    return {"kl": kl.sum().item() / n,
            "ratio_dev": (ratio - 1).abs().max().item() if ratio.numel() else 0.0,
            "clip_frac": clipped.sum().item() / n}

# -----------------------------------------------------------------------------
# 7) the training loop

def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=None) -> list:
    """Reference = frozen deepcopy of the policy at the start; AdamW(lr); each step: B prompts from the task,
    G completions each, the task's rewards, one grpo_step. Returns one stats dict per step, and hands each to
    `log` as it comes (without one, the master process prints a line per step).
    Data-parallel when torch.distributed is initialized: every rank draws its own prompts and samples its own
    groups (seeded by seed + rank), and the update goes through DistributedDataParallel, which averages the
    gradients over the ranks; each rank keeps its own copy of the reference."""
    # various inits, derived attributes
    ddp = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1  # is this a ddp run?
    if ddp:
        ddp_rank = dist.get_rank()
        ddp_world_size = dist.get_world_size()
        master_process = ddp_rank == 0 # this process will do the printing
        seed_offset = ddp_rank # each process gets a different seed
    else:
        # if not ddp, we are running in one process
        master_process = True
        seed_offset = 0
        ddp_world_size = 1
    if log is None and master_process:
        print(f"completions per iteration will be: {ddp_world_size * batch_size * cfg.group_size:,}")
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


# -----------------------------------------------------------------------------
if __name__ == "__main__":
    import sys
    from ast import literal_eval
    from dataclasses import fields
    from lab import ModelConfig, SumTask, TinyLM
    # default config values: 40 iterations on the lab's sum task with its tiny model
    steps = 40
    batch_size = 16 # B prompts per iteration, each completed group_size times
    seed = 0
    num_iterations = 2
    dtype = 'float64' # 'float64' gives the same digits on every CPU; 'float32' is faster
    # overrides from command line, --key=value: a setting above or a GRPOConfig field
    config = {f.name: f.default for f in fields(GRPOConfig)}
    config.update(steps=steps, batch_size=batch_size, seed=seed, num_iterations=num_iterations, dtype=dtype)
    for arg in sys.argv[1:]:
        if not (arg.startswith('--') and '=' in arg):
            sys.exit(f"expected --key=value, got {arg}")
        key, val = arg[2:].split('=', 1)
        if key not in config:
            sys.exit(f"Unknown config key: {key}")
        try:
            # attempt to eval it (e.g. if bool, number, or etc)
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            # if that goes wrong, just use the string
            attempt = val
        # ensure the types match ok; a setting that is None by default is off, and takes a number
        if type(attempt) != type(config[key]) and config[key] is not None:
            sys.exit(f"{key} takes a {type(config[key]).__name__}, got {val}")
        print(f"Overriding: {key} = {attempt}")
        config[key] = attempt
    steps, batch_size, seed, dtype = (config.pop(k) for k in ("steps", "batch_size", "seed", "dtype"))
    if min(steps, batch_size) < 1:
        sys.exit("steps and batch_size must be at least 1")
    if dtype not in ("float64", "float32"):
        sys.exit(f"dtype must be float64 or float32, got {dtype}")
    ptdtype = {'float64': torch.float64, 'float32': torch.float32}[dtype]
    try:
        cfg = GRPOConfig(**config)
    except ValueError as e:
        sys.exit(str(e))
    torch.manual_seed(seed)
    train(TinyLM(ModelConfig(), dtype=ptdtype), SumTask(), cfg, steps=steps, batch_size=batch_size, seed=seed)
