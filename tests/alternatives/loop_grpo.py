"""A correct GRPO in a different style from the reference, to prove the checks pass any correct implementation:
Gumbel-max sampling, bool masks, verl's cumsum mask, per-group loops, logsumexp log-probs, expm1 k3,
old log-probs as logp.detach() when num_iterations == 1, policy.zero_grad(), a reference rebuilt from a state dict.

The whole contract, in this file's own way:
- the loss packs the completion tokens into one flat vector (logp[mask]), so nothing under the mask (pad, inf,
  NaN) is ever read, and every loss type is "a numerator over a denominator" computed row by row in Python;
- micro-batches are slices from divmod arithmetic (tensor_split's sizes, empty ones skipped), and grpo_step
  divides each micro-batch's numerator by the whole batch's denominator instead of rescaling a per-call loss;
- under DistributedDataParallel the no-grad passes run on the bare module, and every micro-batch but the last
  runs inside no_sync(), so gradients are all-reduced once per optimizer step;
- train uses one generator per rank (seed + rank) for both the prompts and the Gumbel noise;
- TRL 1.16's options on the packed vector too: row sums by index_add_ (the sequence ratio, the sequence sampler
  weight, the off-policy drift), the entropy threshold from a sort, entropies as logsumexp minus the mean logit."""
import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_AGGREGATIONS = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")
_CORRECTIONS = (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_REWARD_SCALES = ("group", "batch", "none")


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
    loss_type: str = "grpo"
    scale_rewards: str = "group"
    clip_eps_high: float | None = None
    grad_accum_steps: int = 1
    is_cap: float | None = None
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    delta: float | None = None
    top_entropy_quantile: float = 1.0
    mask_truncated_completions: bool = False
    rollout_is_mode: str | None = None
    rollout_is_clip_min: float | None = None
    rollout_is_clip_max: float | None = 3.0
    use_bias_correction_kl: bool = False
    off_policy_mask_threshold: float | None = None

    def __post_init__(self):
        problems = [why for bad, why in [
            (self.group_size < 2, "group_size must be at least 2: a group of one has no baseline"),
            (not self.temperature > 0, "temperature must be positive"),
            (self.loss_type not in _AGGREGATIONS, f"loss_type {self.loss_type!r} is not one of {_AGGREGATIONS}"),
            (self.scale_rewards not in _REWARD_SCALES,
             f"scale_rewards {self.scale_rewards!r} is not one of {_REWARD_SCALES}"),
            (self.grad_accum_steps < 1, "grad_accum_steps must be at least 1"),
            (self.importance_sampling_level not in ("token", "sequence"), "importance_sampling_level: token, sequence"),
            (self.rollout_is_mode not in _CORRECTIONS, f"rollout_is_mode {self.rollout_is_mode!r} is not one of "
                                                       f"{_CORRECTIONS}"),
            (self.is_cap is not None and self.rollout_is_mode is not None, "is_cap and rollout_is_mode: choose one"),
            (not 0.0 <= self.top_entropy_quantile <= 1.0, "top_entropy_quantile must lie in [0, 1]"),
        ] if bad]
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class Rollout:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int
    sampler_logp: torch.Tensor | None = None  # log q(token) as drawn; 0 once a row has ended


def completion_mask(completion_ids, eos_id):
    is_eos = (completion_ids == eos_id).long()
    return (is_eos.cumsum(dim=1) - is_eos) == 0  # bool, keeps the first EOS


def generate(policy, prompt_ids, prompt_mask, cfg, *, eos_id, pad_id, generator=None):
    with torch.inference_mode():
        rows = [i for i in range(prompt_ids.shape[0]) for _ in range(cfg.group_size)]
        ids, mask = prompt_ids[rows].clone(), prompt_mask[rows].clone()
        P = ids.shape[1]
        alive = torch.ones(len(rows), dtype=torch.bool, device=ids.device)
        drawn_with = []
        for _ in range(cfg.max_new_tokens):
            logits = policy(ids, mask)[:, -1, :].double() / cfg.temperature
            u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
            tok = (logits - torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-12)))).argmax(dim=-1)  # Gumbel-max
            log_q = logits.gather(1, tok.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=1)
            drawn_with.append(log_q.masked_fill(~alive, 0.0).float())
            tok[~alive] = pad_id
            ids = torch.cat([ids, tok.unsqueeze(1)], dim=1)
            mask = torch.cat([mask, alive.to(mask.dtype).unsqueeze(1)], dim=1)
            alive = alive & (tok != eos_id)
            if not alive.any():
                break
        loss_mask = completion_mask(ids[:, P:], eos_id)
        if cfg.mask_truncated_completions:  # a row still alive after max_new_tokens never ended
            loss_mask = loss_mask & ~alive.unsqueeze(1)
    return Rollout(ids.clone(), mask.clone(), loss_mask.clone(), P, torch.stack(drawn_with, dim=1).clone())


def _unbiased_std(values):
    centred = values - values.mean()
    return math.sqrt(float((centred ** 2).sum()) / (values.numel() - 1))


@torch.no_grad()
def group_advantages(rewards, group_size, eps, scale="group"):
    flat = rewards.detach().double().reshape(-1)
    whole_batch = _unbiased_std(flat) + eps if scale == "batch" else None
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    for start in range(0, flat.shape[0], group_size):
        g = flat[start:start + group_size]
        if scale == "group":
            divisor = _unbiased_std(g) + eps
        elif scale == "batch":
            divisor = whole_batch
        else:
            divisor = 1.0
        out[start:start + group_size] = ((g - g.mean()) / divisor).float()
    return out


def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    T = input_ids.shape[1] - prompt_len
    raw = model(input_ids, attention_mask)[:, -T - 1:-1, :]
    logits = (raw if raw.dtype == torch.float64 else raw.float()) / temperature
    picked = torch.gather(logits, 2, input_ids[:, -T:].unsqueeze(2)).squeeze(2)
    return picked - torch.logsumexp(logits, dim=2)


def token_entropies(model, input_ids, attention_mask, prompt_len, temperature):
    T = input_ids.shape[1] - prompt_len
    raw = model(input_ids, attention_mask)[:, -T - 1:-1, :]
    logits = (raw if raw.dtype == torch.float64 else raw.float()) / temperature
    return torch.logsumexp(logits, dim=2) - (logits.softmax(dim=2) * logits).sum(dim=2)


def kl_penalty(logp, ref_logp):
    x = ref_logp - logp
    return torch.expm1(x) - x


def _per_row(values, rows, n):
    """(M,) token values -> (n,) each row's sum."""
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, rows, values)


def _kth(sorted_values, q):
    """The q-quantile of an ascending vector, between its two nearest ranks."""
    pos = q * (sorted_values.numel() - 1)
    below = int(math.floor(pos))
    above = min(below + 1, sorted_values.numel() - 1)
    return sorted_values[below] + (pos - below) * (sorted_values[above] - sorted_values[below])


def _packed_terms(logp, old_logp, ref_logp, advantages, completion_mask, cfg, sampler_logp=None, entropies=None):
    """The per-token loss of every completion token, packed row after row into one vector, and each row's token
    count. Only the positions under the mask are ever indexed, so pad, inf or NaN elsewhere cannot leak in."""
    keep = completion_mask.bool()
    n = keep.shape[0]
    lengths = keep.sum(dim=1)                                    # (N,)
    rows = torch.arange(n, device=keep.device).repeat_interleave(lengths)  # (M,) the row of each token
    lp = logp[keep]                                              # (M,) differentiable
    old = old_logp.detach()[keep]
    ref = ref_logp.detach()[keep]
    a = advantages.detach().to(lp.dtype).repeat_interleave(lengths)  # (M,) each token carries its row's A
    log_r = lp - old
    if cfg.importance_sampling_level == "sequence":
        log_r = (_per_row(log_r, rows, n) / lengths.clamp(min=1))[rows]
    ratio = log_r.exp()
    upper = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    if cfg.loss_type == "cispo":
        objective = ratio.clamp(max=5.0 if cfg.clip_eps_high is None else cfg.clip_eps_high).detach() * a * lp
    elif cfg.loss_type == "sapo":
        tau = torch.full_like(a, cfg.sapo_temperature_neg).masked_fill(a > 0, cfg.sapo_temperature_pos)
        objective = 4 / tau * torch.sigmoid(tau * (ratio - 1)) * a
    else:
        free = ratio if cfg.delta is None else torch.minimum(ratio, torch.full_like(ratio, cfg.delta))
        objective = torch.minimum(free * a, ratio.clamp(1 - cfg.clip_eps, 1 + upper) * a)
    behaviour = None if sampler_logp is None else sampler_logp.detach()[keep].to(lp.dtype)
    if cfg.off_policy_mask_threshold is not None:
        seen_by = old if behaviour is None else behaviour
        drift = _per_row(seen_by - lp.detach(), rows, n) / lengths.clamp(min=1)
        dropped = (advantages.detach() < 0) & (drift > cfg.off_policy_mask_threshold)
        objective = objective * (~dropped)[rows]
    if cfg.top_entropy_quantile < 1.0 and entropies is not None and lp.numel():
        h = entropies.detach()[keep]
        objective = objective * (h >= _kth(h.sort().values, 1.0 - cfg.top_entropy_quantile))
    mode, low, high = cfg.rollout_is_mode, cfg.rollout_is_clip_min, cfg.rollout_is_clip_max
    if cfg.is_cap is not None:
        mode, low, high = "token_truncate", None, cfg.is_cap
    if mode is not None and behaviour is not None:
        drift = old - behaviour                                  # log pi_old / pi_sampler
        if mode.startswith("sequence"):
            drift = _per_row(drift, rows, n)[rows]
        w = drift.exp()
        if mode.endswith("truncate"):
            w = w.clamp(min=low, max=high)
        else:
            inside = (w >= (-math.inf if low is None else low)) & (w <= (math.inf if high is None else high))
            w = torch.where(inside, w, torch.zeros_like(w))
        objective = objective * w.detach()
    kl = kl_penalty(lp, ref)
    if cfg.use_bias_correction_kl:
        kl = kl * ratio
    return cfg.beta * kl - objective, lengths


def _numerator(terms, lengths, cfg):
    """grpo: the sum over rows of each row's token mean; every other loss type: the plain token sum."""
    if cfg.loss_type not in ("grpo", "sapo"):
        return terms.sum()
    total = terms.sum() * 0.0  # keeps the graph when no row has a token
    for row in terms.split(lengths.tolist()):
        if row.numel():
            total = total + row.sum() / row.numel()
    return total


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, *, num_tokens=None, sampler_logp=None,
              entropies=None):
    terms, lengths = _packed_terms(logp, old_logp, ref_logp, advantages, completion_mask, cfg, sampler_logp,
                                   entropies)
    rows, tokens = lengths.numel(), int(lengths.sum())
    by_count = max(tokens, 1) if num_tokens is None else float(num_tokens)
    denominator = {"grpo": rows, "sapo": rows, "bnpo": max(tokens, 1), "dr_grpo": rows * cfg.max_new_tokens,
                   "dapo": by_count, "cispo": by_count}[cfg.loss_type]
    return _numerator(terms, lengths, cfg) / denominator


def _slices(n, parts):
    """Contiguous slices with tensor_split's sizes (the first n % parts one row longer); empty ones skipped."""
    size, extra = divmod(n, parts)
    start = 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        if stop > start:
            yield slice(start, stop)
        start = stop


def _ranks():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def grpo_step(policy, ref_policy, optimizer, rollout, rewards, cfg):
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)
    keep = rollout.completion_mask.bool()
    N = keep.shape[0]
    bare = policy.module if isinstance(policy, DistributedDataParallel) else policy
    chunks = list(_slices(N, cfg.grad_accum_steps))
    sampler = rollout.sampler_logp

    def score(model, sl):
        return token_logprobs(model, rollout.input_ids[sl], rollout.attention_mask[sl], rollout.prompt_len,
                              cfg.temperature)

    with torch.no_grad():
        ref = [score(ref_policy, sl) for sl in chunks]
        old = None if cfg.num_iterations == 1 else [score(bare, sl) for sl in chunks]

    # what each micro-batch's numerator is divided by, so the micro-batches add up to the configured loss
    if cfg.loss_type in ("dapo", "cispo"):
        _, world = _ranks()
        count = torch.tensor(float(keep.sum()))
        if world > 1:
            dist.all_reduce(count)  # tokens on every rank; each rank divides by its average share
        everyone = max(float(count), 1.0) / world
    split_by = {"grpo": lambda tokens: N, "sapo": lambda tokens: N,
                "dr_grpo": lambda tokens: N * cfg.max_new_tokens,
                "bnpo": lambda tokens: max(tokens, 1) * cfg.grad_accum_steps,
                "dapo": lambda tokens: everyone, "cispo": lambda tokens: everyone}[cfg.loss_type]

    upper = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    log = []
    for _ in range(cfg.num_iterations):
        policy.zero_grad()
        loss_total, kl_sum, clipped, dev = 0.0, 0.0, 0, 0.0
        for i, sl in enumerate(chunks):
            last = i == len(chunks) - 1
            # every micro-batch but the last accumulates locally; the last one's backward all-reduces the sum
            syncing = policy.no_sync() if isinstance(policy, DistributedDataParallel) and not last else nullcontext()
            with syncing:
                logp = score(policy, sl)
                before = logp.detach() if old is None else old[i]
                piece_mask = keep[sl]
                heat = None
                if cfg.top_entropy_quantile < 1.0:
                    with torch.no_grad():
                        heat = token_entropies(bare, rollout.input_ids[sl], rollout.attention_mask[sl],
                                               rollout.prompt_len, cfg.temperature)
                terms, lengths = _packed_terms(logp, before, ref[i], adv[sl], piece_mask, cfg,
                                               None if sampler is None else sampler[sl], heat)
                piece = _numerator(terms, lengths, cfg) / split_by(int(lengths.sum()))
                piece.backward()
            loss_total += float(piece.detach())
            with torch.no_grad():
                lp, b, r = logp[piece_mask], before[piece_mask], ref[i][piece_mask]
                a = adv[sl].to(lp.dtype).repeat_interleave(lengths)
                ratio = (lp - b).exp()
                kl_sum += float(kl_penalty(lp, r).sum())
                clipped += int((((ratio < 1 - cfg.clip_eps) & (a < 0)) | ((ratio > 1 + upper) & (a > 0))).sum())
                if ratio.numel():
                    dev = max(dev, float((ratio - 1).abs().max()))
        grads = [p for p in policy.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, cfg.max_grad_norm) if grads else torch.zeros(())
        optimizer.step()
        tokens = max(int(keep.sum()), 1)
        log.append({"loss": loss_total, "kl": kl_sum / tokens, "ratio_dev": dev, "clip_frac": clipped / tokens,
                    "grad_norm": float(norm)})
    return {"loss": log[0]["loss"], "kl": log[0]["kl"], "ratio_dev": log[0]["ratio_dev"],
            "clip_frac": log[-1]["clip_frac"], "grad_norm": log[-1]["grad_norm"],
            "adv_std": float(adv.std()), "completion_len": float(keep.sum(dim=1).double().mean())}


def train(policy, task, cfg, *, steps, batch_size, seed, log=None):
    rank, world = _ranks()
    g = torch.Generator().manual_seed(seed + rank)  # this rank's prompts and Gumbel noise
    ref = copy.deepcopy(policy)
    ref.load_state_dict(policy.state_dict())
    for p in ref.parameters():
        p.requires_grad_(False)
    learner = DistributedDataParallel(policy) if world > 1 else policy
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    history = []
    for step in range(steps):
        ids, mask = task.sample_prompts(batch_size, g)
        rollout = generate(policy, ids, mask, cfg, eos_id=task.eos_id, pad_id=task.pad_id, generator=g)
        rewards = task.reward(rollout)
        stats = grpo_step(learner, ref, opt, rollout, rewards, cfg)
        entry = {"step": step + 1, "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max()), **stats}
        history.append(entry)
        if log is not None:
            log(entry)
    return history
