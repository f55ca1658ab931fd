"""A correct GRPO whose records are named tuples, to prove that the judge carries a result's fields whatever
record type holds them: GRPOConfig is a collections.namedtuple, Rollout a typing.NamedTuple (it reaches the judge
as a tuple subclass, its fields in an order of its own), and the steps' statistics a NamedTuple turned into a
dict only at the contract's edge.

Its own way through the contract otherwise:
- sampling by inverse CDF: one uniform per row, searchsorted into the cumulative probabilities;
- the completion mask from the index of each row's first EOS (a sentinel column for rows without one);
- advantages from torch.std_mean over the unflattened groups; log-probs as a negated cross-entropy;
- k3 as expm1(d) - d; every loss type as a token sum over a denominator picked from a table;
- micro-batches from tensor_split of the row indices, each loss rescaled by its share of the normalizer;
- under DistributedDataParallel, the no-grad scoring runs on the bare module, the training pass through the
  wrapper, and gradients are all-reduced once per step (no_sync on every micro-batch but the last);
- TRL 1.16's options as TRL shapes them: a sequence ratio and a sequence sampler weight of shape (N, 1) broadcast
  over the tokens, entropies from torch.distributions.Categorical, the threshold from torch.quantile."""
import copy
from collections import namedtuple
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


# the contract's fields and defaults; a namedtuple is immutable, so no config object is ever shared and changed
DEFAULTS = {"group_size": 8, "max_new_tokens": 8, "temperature": 1.0, "beta": 0.04, "clip_eps": 0.2,
            "adv_eps": 1e-4, "num_iterations": 1, "lr": 3e-3, "max_grad_norm": 1.0, "loss_type": "grpo",
            "scale_rewards": "group", "clip_eps_high": None, "grad_accum_steps": 1, "is_cap": None,
            "importance_sampling_level": "token", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05,
            "delta": None, "top_entropy_quantile": 1.0, "mask_truncated_completions": False, "rollout_is_mode": None,
            "rollout_is_clip_min": None, "rollout_is_clip_max": 3.0, "use_bias_correction_kl": False,
            "off_policy_mask_threshold": None}
GRPOConfig = namedtuple("GRPOConfig", DEFAULTS, defaults=DEFAULTS.values())


class Rollout(NamedTuple):
    """The contract's fields in an order of its own: the judge must go by name, never by position."""
    prompt_len: int                # P
    completion_mask: torch.Tensor  # (N, T)
    input_ids: torch.Tensor        # (N, P+T)
    attention_mask: torch.Tensor   # (N, P+T)
    sampler_logp: torch.Tensor | None = None


class StepStats(NamedTuple):
    loss: float
    kl: float
    grad_norm: float


def completion_mask(completion_ids, eos_id):
    N, T = completion_ids.shape
    with_sentinel = torch.cat([completion_ids == eos_id, torch.ones(N, 1, dtype=torch.bool,
                                                                    device=completion_ids.device)], dim=1)
    first = with_sentinel.float().argmax(dim=1, keepdim=True)                 # (N, 1) T where no EOS
    return (torch.arange(T, device=completion_ids.device)[None] <= first).float()


@torch.no_grad()
def generate(policy, prompt_ids, prompt_mask, cfg, *, eos_id, pad_id, generator=None):
    ids = prompt_ids.repeat_interleave(cfg.group_size, dim=0)
    att = prompt_mask.repeat_interleave(cfg.group_size, dim=0)
    P, done, drawn = ids.shape[1], torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device), []
    while len(drawn) < cfg.max_new_tokens and not done.all():
        logq = torch.log_softmax(policy(ids, att)[:, -1].double() / cfg.temperature, dim=-1)
        u = torch.rand(ids.shape[0], 1, generator=generator, dtype=torch.float64, device=ids.device)
        cdf = logq.exp().cumsum(dim=-1)
        tok = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=logq.shape[-1] - 1).squeeze(1)
        drawn.append(torch.where(done, 0.0, logq.gather(1, tok[:, None]).squeeze(1)).float())
        ids = torch.cat([ids, torch.where(done, pad_id, tok)[:, None]], dim=1)
        att = torch.cat([att, (~done).to(att.dtype)[:, None]], dim=1)
        done = done | (tok == eos_id)
    trained_on = completion_mask(ids[:, P:], eos_id)
    if cfg.mask_truncated_completions:
        trained_on = trained_on * done[:, None].float()
    return Rollout(P, trained_on, ids, att, torch.stack(drawn, dim=1))


def group_advantages(rewards, group_size, eps, scale="group"):
    groups = rewards.detach().float().unflatten(0, (-1, group_size))         # (B, G)
    std, mean = torch.std_mean(groups, dim=1, keepdim=True)
    divisor = {"group": lambda: std + eps, "batch": lambda: groups.std() + eps,
               "none": lambda: torch.ones(())}[scale]()
    return ((groups - mean) / divisor).flatten()


def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    logits = model(input_ids, attention_mask)[:, prompt_len - 1:-1]                           # (N, T, V)
    logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    targets = input_ids[:, prompt_len:]
    return -F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


def token_entropies(model, input_ids, attention_mask, prompt_len, temperature):
    logits = model(input_ids, attention_mask)[:, prompt_len - 1:-1]                           # (N, T, V)
    logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    return torch.distributions.Categorical(logits=logits).entropy()


def kl_penalty(logp, ref_logp):
    d = ref_logp - logp
    return torch.expm1(d) - d


def _denominator(cfg, mask, num_tokens):
    """What the token sum of the per-token losses is divided by, per loss type (grpo divides row by row)."""
    return {"bnpo": lambda: mask.sum().clamp(min=1.0),
            "dr_grpo": lambda: mask.shape[0] * cfg.max_new_tokens,
            "dapo": lambda: mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens,
            "cispo": lambda: mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens}[cfg.loss_type]()


def _sampler_weight(old_logp, sampler_logp, keep, cfg):
    """(N, T) or (N, 1): pi_old / pi_sampler as rollout_is_mode (or is_cap) shapes it; None when there is none."""
    if sampler_logp is None or (cfg.is_cap is None and cfg.rollout_is_mode is None):
        return None
    mode, low, high = ("token_truncate", None, cfg.is_cap) if cfg.is_cap is not None else \
        (cfg.rollout_is_mode, cfg.rollout_is_clip_min, cfg.rollout_is_clip_max)
    diff = (old_logp - sampler_logp.masked_fill(~keep, 0.0)).masked_fill(~keep, 0.0)
    w = (diff.sum(1, keepdim=True) if mode.startswith("sequence") else diff).exp()
    if mode.endswith("truncate"):
        return w.clamp(min=low, max=high)
    outside = torch.zeros_like(w, dtype=torch.bool)
    if low is not None:
        outside |= w < low
    if high is not None:
        outside |= w > high
    return w.masked_fill(outside, 0.0)


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, *, num_tokens=None, sampler_logp=None,
              entropies=None):
    keep = completion_mask.bool()
    zeroed = [x.masked_fill(~keep, 0.0) for x in (logp, old_logp, ref_logp)]
    logp, old_logp, ref_logp = zeroed
    log_ratio = logp - old_logp
    if cfg.importance_sampling_level == "sequence":  # (N, 1), broadcast over the tokens as TRL does
        log_ratio = log_ratio.sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp(min=1)
    ratio = log_ratio.exp()
    high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    a = advantages.unsqueeze(1)
    if cfg.loss_type == "cispo":
        gain = ratio.clamp(max=5.0 if cfg.clip_eps_high is None else cfg.clip_eps_high).detach() * a * logp
    elif cfg.loss_type == "sapo":
        tau = torch.full_like(a, cfg.sapo_temperature_neg).masked_fill(a > 0, cfg.sapo_temperature_pos)
        gain = torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    else:
        unclipped = ratio if cfg.delta is None else ratio.clamp(max=cfg.delta)
        gain = torch.minimum(unclipped * a, ratio.clamp(1 - cfg.clip_eps, 1 + high) * a)
    if cfg.off_policy_mask_threshold is not None:
        seen = old_logp if sampler_logp is None else sampler_logp.masked_fill(~keep, 0.0)
        drift = (seen - logp.detach()).masked_fill(~keep, 0.0).sum(1, keepdim=True)
        drift = drift / keep.sum(1, keepdim=True).clamp(min=1)
        gain = gain * ((a >= 0) | (drift <= cfg.off_policy_mask_threshold))
    if cfg.top_entropy_quantile < 1.0 and entropies is not None and keep.any():
        threshold = torch.quantile(entropies[keep], 1.0 - cfg.top_entropy_quantile)
        gain = gain * (entropies.masked_fill(~keep, -1.0) >= threshold)
    weight = _sampler_weight(old_logp, sampler_logp, keep, cfg)
    if weight is not None:
        gain = gain * weight.detach()
    kl = kl_penalty(logp, ref_logp) * (ratio if cfg.use_bias_correction_kl else 1.0)
    per_token = (cfg.beta * kl - gain).masked_fill(~keep, 0.0)
    if cfg.loss_type in ("grpo", "sapo"):
        return (per_token.sum(1) / keep.sum(1).clamp(min=1)).mean()
    return per_token.sum() / _denominator(cfg, keep.float(), num_tokens)


def _world():
    ready = dist.is_available() and dist.is_initialized()
    return (dist.get_rank(), dist.get_world_size()) if ready else (0, 1)


def grpo_step(policy, ref_policy, optimizer, rollout, rewards, cfg):
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)
    mask, N = rollout.completion_mask, rollout.completion_mask.shape[0]
    chunks = [rows for rows in torch.arange(N, device=mask.device).tensor_split(cfg.grad_accum_steps) if len(rows)]
    score = lambda model, rows: token_logprobs(model, rollout.input_ids[rows], rollout.attention_mask[rows],
                                               rollout.prompt_len, cfg.temperature)
    bare = policy.module if isinstance(policy, DistributedDataParallel) else policy
    with torch.no_grad():
        old = torch.cat([score(bare, rows) for rows in chunks])
        ref = torch.cat([score(ref_policy, rows) for rows in chunks])
    tokens = mask.sum().float()
    _, world = _world()
    if world > 1:
        dist.all_reduce(tokens)
    tokens = tokens.clamp(min=1.0) / world
    sampler = rollout.sampler_logp
    history = []
    for _ in range(cfg.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i, rows in enumerate(chunks):
            share = {"grpo": len(rows) / N, "sapo": len(rows) / N, "dr_grpo": len(rows) / N,
                     "bnpo": 1 / cfg.grad_accum_steps, "dapo": 1.0, "cispo": 1.0}[cfg.loss_type]
            last = i == len(chunks) - 1 or not isinstance(policy, DistributedDataParallel)
            sync = nullcontext() if last else policy.no_sync()
            with sync:
                heat = None
                if cfg.top_entropy_quantile < 1.0:
                    with torch.no_grad():
                        heat = token_entropies(bare, rollout.input_ids[rows], rollout.attention_mask[rows],
                                               rollout.prompt_len, cfg.temperature)
                loss = share * grpo_loss(score(policy, rows), old[rows], ref[rows], adv[rows], mask[rows], cfg,
                                         num_tokens=tokens, sampler_logp=None if sampler is None else sampler[rows],
                                         entropies=heat)
                loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(bare.parameters(), cfg.max_grad_norm)
        optimizer.step()
        kl = (kl_penalty(old, ref) * mask).sum() / mask.sum().clamp(min=1.0)
        history.append(StepStats(total, kl.item(), norm.item()))
    return history[0]._asdict()


def train(policy, task, cfg, *, steps, batch_size, seed, log=None):
    rank, world = _world()
    torch.manual_seed(seed)
    device = next(policy.parameters()).device
    gen = torch.Generator().manual_seed(seed + rank)
    sample_gen = torch.Generator(device=device).manual_seed(seed + rank)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    learner = DistributedDataParallel(policy) if world > 1 else policy
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    out = []
    for step in range(1, steps + 1):
        prompts, prompt_mask = task.sample_prompts(batch_size, gen)
        rollout = generate(policy, prompts.to(device), prompt_mask.to(device), cfg, eos_id=task.eos_id,
                           pad_id=task.pad_id, generator=sample_gen)
        rewards = task.reward(rollout).to(device)
        out.append({"step": step, "reward_mean": rewards.mean().item(),
                    **grpo_step(learner, ref_policy, optimizer, rollout, rewards, cfg)})
        if log is not None:
            log(out[-1])
    return out
