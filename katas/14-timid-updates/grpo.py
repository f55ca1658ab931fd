"""
Core functions of GRPO: outcome advantages grouped by prompt uid, the clipped policy loss, the KL penalty and
the loss aggregation modes, plus the rollout, log-prob and actor-update stages that use them. The stages pass
one batch dict along: rollout -> reward -> advantage -> old/ref log-prob -> update.
"""
# style: volcengine/verl, verl/trainer/ppo/core_algos.py (compute_grpo_outcome_advantage, agg_loss, kl_penalty, compute_policy_loss) and verl/workers/actor/dp_actor.py (update_policy)

import copy
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class GRPOConfig:
    # rollout
    group_size: int = 8  # rollout.n
    max_new_tokens: int = 8  # response_length
    temperature: float = 1.0
    # actor
    lr: float = 3e-3
    max_grad_norm: float = 1.0  # grad_clip
    num_iterations: int = 1  # ppo_epochs
    grad_accum_steps: int = 1  # micro batches per mini batch
    clip_eps: float = 0.2  # clip_ratio_low
    clip_eps_high: Optional[float] = None  # clip_ratio_high, None -> clip_eps
    loss_type: str = "grpo"  # see LOSS_AGG_MODE
    beta: float = 0.04  # kl_loss_coef
    is_cap: Optional[float] = None  # rollout_is_threshold, None -> off
    # algorithm
    adv_eps: float = 1e-4
    scale_rewards: str = "group"  # group | batch | none

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"group_size (rollout.n) must be >= 2 for GRPO, got {self.group_size}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.loss_type not in LOSS_AGG_MODE:
            raise ValueError(f"Invalid loss_type: {self.loss_type}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"Invalid scale_rewards: {self.scale_rewards}")
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}")


@dataclass
class Rollout:
    input_ids: torch.Tensor  # (bs, prompt_length + response_length)
    attention_mask: torch.Tensor  # (bs, prompt_length + response_length)
    completion_mask: torch.Tensor  # response_mask, (bs, response_length)
    prompt_len: int
    sampler_logp: Optional[torch.Tensor] = None  # rollout_log_probs, (bs, response_length)


# loss_type -> loss_agg_mode
LOSS_AGG_MODE = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",  # batch_num_tokens from the caller
}


# ---------------------------------------------------------------------------------------------------------------
# rollout


def get_response_mask(response_id: torch.Tensor, eos_token: int, dtype=torch.float32) -> torch.Tensor:
    """response_id: (bs, response_length) -> response_mask: (bs, response_length)"""
    eos_mask = torch.isin(response_id, torch.tensor([eos_token], device=response_id.device)).int()
    return (eos_mask.cumsum(dim=1) - eos_mask).eq(0).to(dtype)


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    return get_response_mask(completion_ids, eos_token=eos_id)


@torch.no_grad()
def generate(policy, prompt_ids, prompt_mask, cfg: GRPOConfig, *, eos_id: int, pad_id: int, generator=None) -> Rollout:
    """Sample rollout.n responses per prompt. Tokens are drawn with the exponential race of vLLM's sampler
    (argmax of probs / Exp(1) noise), and the sampling log-prob of each token is returned as rollout_log_probs."""
    input_ids = prompt_ids.repeat(cfg.group_size, 1)  # (bs, prompt_length)
    attention_mask = prompt_mask.repeat(cfg.group_size, 1)
    prompt_length = input_ids.shape[1]
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    kv_cache = policy.make_cache() if hasattr(policy, "make_cache") else None
    step_input = input_ids
    rollout_log_probs = []
    for _ in range(cfg.max_new_tokens):
        if kv_cache is not None:
            logits = policy(step_input, attention_mask, cache=kv_cache)[:, -1, :]  # (bs, vocab_size)
        else:
            logits = policy(input_ids, attention_mask)[:, -1, :]
        logprobs = torch.log_softmax(logits.float() / cfg.temperature, dim=-1)
        probs = logprobs.exp()
        q = torch.empty_like(probs).exponential_(1.0, generator=generator)
        token = probs.div(q).argmax(dim=-1)  # (bs,)
        token_logprob = logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)
        rollout_log_probs.append(torch.where(finished, torch.zeros_like(token_logprob), token_logprob))
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        input_ids = torch.cat([input_ids, token.unsqueeze(-1)], dim=-1)
        attention_mask = torch.cat([attention_mask, (~finished).to(attention_mask.dtype).unsqueeze(-1)], dim=-1)
        finished = finished | token.eq(eos_id)
        step_input = token.unsqueeze(-1)
        if finished.all():
            break
    responses = input_ids[:, prompt_length:]
    return Rollout(input_ids=input_ids, attention_mask=attention_mask,
                   completion_mask=get_response_mask(responses, eos_token=eos_id), prompt_len=prompt_length,
                   sampler_logp=torch.stack(rollout_log_probs, dim=-1))


# ---------------------------------------------------------------------------------------------------------------
# advantage


@torch.no_grad()
def compute_grpo_outcome_advantage(scores: torch.Tensor, index: list, epsilon: float = 1e-6,
                                   scale_rewards: str = "group") -> torch.Tensor:
    """
    Compute advantage for GRPO, operating only on Outcome reward
    (with only one scalar reward for each response).

    Args:
        scores: `(torch.Tensor)`
            shape is (bs,)
        index: `(list)`
            prompt uid of each response, for grouping
        epsilon: `(float)`
            numerical constant of the scaling
        scale_rewards: `(str)`
            "group" scales by the std of the group, "batch" by the std of the batch, "none" does not scale
            (Dr.GRPO, https://arxiv.org/abs/2503.20783)

    Returns:
        advantages: `(torch.Tensor)`
            shape is (bs,)
    """
    scores = scores.detach().float().clone()
    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}

    bsz = scores.shape[0]
    for i in range(bsz):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        scores_tensor = torch.stack(id2score[idx])
        id2mean[idx] = torch.mean(scores_tensor)
        id2std[idx] = torch.std(scores_tensor)
    batch_std = torch.std(scores)
    for i in range(bsz):
        if scale_rewards == "group":
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        elif scale_rewards == "batch":
            scores[i] = (scores[i] - id2mean[index[i]]) / (batch_std + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


def prompt_uid(bsz: int, group_size: int) -> torch.Tensor:
    """uid of the prompt each of the bsz responses answers, (bs,)"""
    return torch.arange(bsz) // group_size


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float, scale: str = "group") -> torch.Tensor:
    uid = prompt_uid(rewards.shape[0], group_size).tolist()
    return compute_grpo_outcome_advantage(rewards, uid, epsilon=eps, scale_rewards=scale != "none")


# ---------------------------------------------------------------------------------------------------------------
# log prob


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """log_probs of the responses, (bs, response_length), fp32."""
    response_length = input_ids.shape[-1] - prompt_len
    logits = model(input_ids, attention_mask).float()  # (bs, seqlen, vocab_size)
    logits = logits / temperature
    logits = logits[:, -response_length - 1 : -1, :]  # (bs, response_length, vocab_size)
    responses = input_ids[:, -response_length:]
    return logprobs_from_logits(logits, responses)


# ---------------------------------------------------------------------------------------------------------------
# kl / loss


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Compute KL divergence given logprob and ref_logprob.
    See more description in http://joschu.net/blog/kl-approx.html

    kind: "k1" / "kl", "abs", "k2" / "mse", "k3", or "low_var_kl" (k3 clamped for numerical stability)
    """
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind == "k3":
        kl = ref_logprob - logprob
        return torch.exp(kl) - kl - 1
    if kind == "low_var_kl":
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise NotImplementedError(f"kl penalty {kind}")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str,
             batch_num_tokens=None, loss_scale_factor: Optional[int] = None) -> torch.Tensor:
    """
    Aggregate the loss matrix into a scalar.

    Args:
        loss_mat: `(torch.Tensor)`
            shape: (bs, response_length)
        loss_mask: `(torch.Tensor)`
            shape: (bs, response_length)
        loss_agg_mode: (str) "token-mean" / "seq-mean-token-mean" / "seq-mean-token-sum-norm"
        batch_num_tokens: number of valid tokens to divide by in "token-mean"; defaults to those in loss_mask
        loss_scale_factor: constant divisor of "seq-mean-token-sum-norm"; defaults to loss_mask.shape[-1]

    Returns:
        loss: `a scalar torch.Tensor`
    """
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum().clamp(min=1.0)
        loss = (loss_mat * loss_mask).sum() / batch_num_tokens
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = (loss_mat * loss_mask).sum(dim=-1) / loss_mask.sum(dim=-1).clamp(min=1.0)
        loss = seq_losses.mean()
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        seq_losses = (loss_mat * loss_mask).sum(dim=-1)
        loss = seq_losses.mean() / loss_scale_factor
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                        loss_agg_mode="token-mean", rollout_is_weights=None, **agg_kwargs):
    """
    Compute the clipped policy objective and related metrics for PPO.

    Args:
        old_log_prob: (bs, response_length)
        log_prob: (bs, response_length)
        advantages: (bs, response_length)
        response_mask: (bs, response_length)
        cliprange_low, cliprange_high: ratio clipped to [1 - cliprange_low, 1 + cliprange_high]
        rollout_is_weights: optional (bs, response_length) importance weights on the policy loss
    """
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = (torch.gt(pg_losses2, pg_losses1).float() * response_mask).sum() / response_mask.sum().clamp(min=1.0)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **agg_kwargs)
    return pg_loss, pg_clipfrac


def compute_rollout_is_weights(old_log_prob, rollout_log_probs, response_mask, threshold: float) -> torch.Tensor:
    """Token-level truncated IS weights between the actor's old log-probs and the rollout engine's."""
    log_ratio = (old_log_prob - rollout_log_probs).masked_fill(~response_mask.bool(), 0.0)
    return torch.exp(log_ratio).clamp(max=threshold).detach()


def grpo_loss(log_prob, old_log_prob, ref_log_prob, advantages, response_mask, cfg: GRPOConfig, *,
              num_tokens=None, sampler_logp=None) -> torch.Tensor:
    """pg_loss + kl_loss_coef * kl_loss, both aggregated with the loss_agg_mode of cfg.loss_type."""
    valid = response_mask.bool()
    log_prob = torch.where(valid, log_prob, torch.zeros_like(log_prob))
    old_log_prob = torch.where(valid, old_log_prob, torch.zeros_like(old_log_prob))
    ref_log_prob = torch.where(valid, ref_log_prob, torch.zeros_like(ref_log_prob))
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (bs, 1)
    response_mask = valid.to(log_prob.dtype)

    loss_agg_mode = LOSS_AGG_MODE[cfg.loss_type]
    agg_kwargs = {}
    if cfg.loss_type == "dapo" and num_tokens is not None:
        agg_kwargs["batch_num_tokens"] = num_tokens
    if cfg.loss_type == "dr_grpo":
        agg_kwargs["loss_scale_factor"] = cfg.max_new_tokens

    rollout_is_weights = None
    if cfg.is_cap is not None and sampler_logp is not None:
        rollout_is_weights = compute_rollout_is_weights(old_log_prob, sampler_logp, response_mask, cfg.is_cap)

    cliprange_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    pg_loss, _ = compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cfg.clip_eps,
                                     cliprange_high, loss_agg_mode, rollout_is_weights, **agg_kwargs)
    kld = kl_penalty(log_prob, ref_log_prob, kind="k3")
    kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **agg_kwargs)
    return pg_loss + kl_loss * cfg.beta


# ---------------------------------------------------------------------------------------------------------------
# stages on the batch dict


def split_batch(batch: dict, num_chunks: int) -> list[dict]:
    """Split every tensor of the batch along dim 0 into num_chunks micro batches (empty ones dropped)."""
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    bsz = next(iter(tensors.values())).shape[0]
    micro_batches = []
    for rows in torch.arange(bsz).tensor_split(num_chunks):
        if len(rows) == 0:
            continue
        micro_batch = {k: (v[rows.to(v.device)] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
        micro_batches.append(micro_batch)
    return micro_batches


def rollout_to_batch(rollout: Rollout, rewards: torch.Tensor, cfg: GRPOConfig) -> dict:
    return {
        "input_ids": rollout.input_ids,
        "attention_mask": rollout.attention_mask,
        "response_mask": rollout.completion_mask,
        "token_level_scores": rewards,  # outcome reward, one per response
        "uid": prompt_uid(rollout.input_ids.shape[0], cfg.group_size),
        "rollout_log_probs": rollout.sampler_logp,
        "meta_info": {"temperature": cfg.temperature, "prompt_length": rollout.prompt_len},
    }


def compute_advantage(batch: dict, cfg: GRPOConfig) -> dict:
    advantages = compute_grpo_outcome_advantage(batch["token_level_scores"], batch["uid"].tolist(),
                                                epsilon=cfg.adv_eps, scale_rewards=cfg.scale_rewards != "none")
    batch["advantages"] = advantages.unsqueeze(-1) * batch["response_mask"]  # (bs, response_length)
    batch["seq_advantages"] = advantages
    return batch


@torch.no_grad()
def compute_log_prob(model, batch: dict, cfg: GRPOConfig) -> torch.Tensor:
    meta = batch["meta_info"]
    log_probs = []
    for micro_batch in split_batch(batch, cfg.grad_accum_steps):
        log_probs.append(token_logprobs(model, micro_batch["input_ids"], micro_batch["attention_mask"],
                                        meta["prompt_length"], meta["temperature"]))
    return torch.cat(log_probs, dim=0)  # (bs, response_length)


def global_batch_num_tokens(response_mask: torch.Tensor) -> torch.Tensor:
    num_tokens = response_mask.sum().float()
    dp_size = 1
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(num_tokens)
        dp_size = dist.get_world_size()
    return num_tokens.clamp(min=1.0) / dp_size


def loss_scale_factor(cfg: GRPOConfig, micro_bsz: int, mini_bsz: int) -> float:
    if cfg.loss_type == "dapo":
        return 1.0
    if cfg.loss_type == "bnpo":
        return 1.0 / cfg.grad_accum_steps
    return micro_bsz / mini_bsz


@torch.no_grad()
def compute_data_metrics(batch: dict, log_prob: torch.Tensor, cfg: GRPOConfig) -> dict:
    mask = batch["response_mask"].bool()
    log_prob = log_prob.masked_fill(~mask, 0.0)
    ratio = torch.exp(log_prob - batch["old_log_probs"].masked_fill(~mask, 0.0))
    kld = kl_penalty(log_prob, batch["ref_log_prob"].masked_fill(~mask, 0.0), kind="k3")
    advantages = batch["seq_advantages"].unsqueeze(-1)
    cliprange_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cliprange_high)
    n = mask.sum().clamp(min=1)
    return {
        "actor/kl_loss": (kld * mask).sum().item() / n.item(),
        "actor/pg_clipfrac": (torch.gt(pg_losses2, pg_losses1) & mask).sum().item() / n.item(),
        "actor/ppo_ratio_dev": (ratio - 1).abs().max().item(),
    }


def update_policy(actor, optimizer, batch: dict, cfg: GRPOConfig) -> dict:
    metrics = defaultdict(list)
    meta = batch["meta_info"]
    mini_bsz = batch["input_ids"].shape[0]
    num_tokens = global_batch_num_tokens(batch["response_mask"])
    use_rollout_is = cfg.is_cap is not None and batch["rollout_log_probs"] is not None
    for _ in range(cfg.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        pg_loss, log_probs = 0.0, []
        for micro_batch in split_batch(batch, cfg.grad_accum_steps):
            log_prob = token_logprobs(actor, micro_batch["input_ids"], micro_batch["attention_mask"],
                                      meta["prompt_length"], meta["temperature"])
            policy_loss = grpo_loss(log_prob, micro_batch["old_log_probs"], micro_batch["ref_log_prob"],
                                    micro_batch["advantages"], micro_batch["response_mask"], cfg,
                                    num_tokens=num_tokens,
                                    sampler_logp=micro_batch["rollout_log_probs"] if use_rollout_is else None)
            loss = policy_loss * loss_scale_factor(cfg, micro_batch["input_ids"].shape[0], mini_bsz)
            loss.backward()
            pg_loss += loss.detach().item()
            log_probs.append(log_prob.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), max_norm=cfg.max_grad_norm)
        optimizer.step()
        metrics["actor/pg_loss"].append(pg_loss)
        metrics["actor/grad_norm"].append(grad_norm.item())
        for k, v in compute_data_metrics(batch, torch.cat(log_probs, dim=0), cfg).items():
            metrics[k].append(v)
    return metrics


def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards: torch.Tensor, cfg: GRPOConfig) -> dict:
    batch = rollout_to_batch(rollout, rewards, cfg)
    batch = compute_advantage(batch, cfg)
    batch["old_log_probs"] = compute_log_prob(policy, batch, cfg)
    batch["ref_log_prob"] = compute_log_prob(ref_policy, batch, cfg)
    metrics = update_policy(policy, optimizer, batch, cfg)
    return {
        "loss": metrics["actor/pg_loss"][0],
        "kl": metrics["actor/kl_loss"][0],
        "ratio_dev": metrics["actor/ppo_ratio_dev"][0],
        "clip_frac": metrics["actor/pg_clipfrac"][-1],
        "grad_norm": metrics["actor/grad_norm"][-1],
        "adv_std": batch["seq_advantages"].std().item(),
        "completion_len": batch["response_mask"].sum(-1).float().mean().item(),
    }


# ---------------------------------------------------------------------------------------------------------------
# trainer loop


def print_metrics(data: dict) -> None:
    keys = ["critic/score/mean", "critic/score/max", "actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac",
            "actor/grad_norm", "response_length/mean"]
    names = ["reward_mean", "reward_max", "loss", "kl", "clip_frac", "grad_norm", "completion_len"]
    print(f"step:{data['step']} - " + " - ".join(f"{k}:{data[n]:.3f}" for k, n in zip(keys, names)), flush=True)


def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=print_metrics) -> list:
    dp_rank, dp_size = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() \
        else (0, 1)
    torch.manual_seed(seed)
    device = next(policy.parameters()).device
    dataloader_generator = torch.Generator().manual_seed(seed + dp_rank)
    rollout_generator = torch.Generator(device=device).manual_seed(seed + dp_rank)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    actor_module = DistributedDataParallel(policy) if dp_size > 1 else policy  # the actor the optimizer updates
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    history = []
    for step in range(1, steps + 1):
        prompt_ids, prompt_mask = task.sample_prompts(batch_size, dataloader_generator)
        rollout = generate(policy, prompt_ids.to(device), prompt_mask.to(device), cfg, eos_id=task.eos_id,
                           pad_id=task.pad_id, generator=rollout_generator)
        reward_tensor = task.reward(rollout).to(device)
        metrics = grpo_step(actor_module, ref_policy, optimizer, rollout, reward_tensor, cfg)
        data = {"step": step, "reward_mean": reward_tensor.mean().item(), "reward_max": reward_tensor.max().item(),
                **metrics}
        history.append(data)
        log(data)
    return history


if __name__ == "__main__":
    from lab import ModelConfig, SumTask, TinyLM

    torch.manual_seed(0)
    train(TinyLM(ModelConfig()), SumTask(), GRPOConfig(num_iterations=2), steps=40, batch_size=16, seed=0)
