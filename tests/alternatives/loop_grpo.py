"""A correct GRPO in a different style from the reference, to prove the checks pass any correct implementation:
Gumbel-max sampling, bool masks, verl's cumsum mask, per-group loops, logsumexp log-probs, expm1 k3,
old log-probs as logp.detach() when num_iterations == 1, policy.zero_grad(), a reference rebuilt from a state dict."""
import copy
import math
from dataclasses import dataclass

import torch


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


@dataclass
class Rollout:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int


def completion_mask(completion_ids, eos_id):
    is_eos = (completion_ids == eos_id).long()
    return (is_eos.cumsum(dim=1) - is_eos) == 0  # bool, keeps the first EOS


def generate(policy, prompt_ids, prompt_mask, cfg, *, eos_id, pad_id, generator=None):
    with torch.inference_mode():
        rows = [i for i in range(prompt_ids.shape[0]) for _ in range(cfg.group_size)]
        ids, mask = prompt_ids[rows].clone(), prompt_mask[rows].clone()
        P = ids.shape[1]
        alive = torch.ones(len(rows), dtype=torch.bool)
        for _ in range(cfg.max_new_tokens):
            logits = policy(ids, mask)[:, -1, :].double() / cfg.temperature
            u = torch.rand(logits.shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
            tok = (logits - torch.log(-torch.log(u))).argmax(dim=-1)  # Gumbel-max
            tok[~alive] = pad_id
            ids = torch.cat([ids, tok.unsqueeze(1)], dim=1)
            mask = torch.cat([mask, alive.long().unsqueeze(1)], dim=1)
            alive = alive & (tok != eos_id)
            if not alive.any():
                break
    return Rollout(ids.clone(), mask.clone(), completion_mask(ids[:, P:], eos_id).clone(), P)


@torch.no_grad()
def group_advantages(rewards, group_size, eps):
    out = torch.empty(rewards.shape[0], dtype=torch.float32)
    for start in range(0, rewards.shape[0], group_size):
        g = rewards[start:start + group_size].double()
        var = ((g - g.mean()) ** 2).sum() / (g.numel() - 1)
        out[start:start + group_size] = ((g - g.mean()) / (math.sqrt(var) + eps)).float()
    return out


def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    T = input_ids.shape[1] - prompt_len
    logits = model(input_ids, attention_mask).float()[:, -T - 1:-1, :] / temperature
    picked = torch.gather(logits, 2, input_ids[:, -T:].unsqueeze(2)).squeeze(2)
    return picked - torch.logsumexp(logits, dim=2)


def kl_penalty(logp, ref_logp):
    x = ref_logp - logp
    return torch.expm1(x) - x


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg):
    mask = completion_mask.bool()
    ratio = (logp - old_logp).exp()
    a = advantages.reshape(-1, 1)
    objective = torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
    per_token = (cfg.beta * kl_penalty(logp, ref_logp) - objective).masked_fill(~mask, 0.0)
    lengths = mask.sum(dim=1).clamp(min=1)
    return (per_token.sum(dim=1) / lengths).mean()


def grpo_step(policy, ref_policy, optimizer, rollout, rewards, cfg):
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps)
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, cfg.temperature)
    with torch.no_grad():
        ref = token_logprobs(ref_policy, *args)
        old = None if cfg.num_iterations == 1 else token_logprobs(policy, *args)
    first = None
    for _ in range(cfg.num_iterations):
        logp = token_logprobs(policy, *args)
        loss = grpo_loss(logp, logp.detach() if old is None else old, ref, adv, rollout.completion_mask, cfg)
        policy.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.grad is not None], cfg.max_grad_norm)
        optimizer.step()
        if first is None:
            m = rollout.completion_mask.float()
            first = {"loss": float(loss.detach()), "kl": float((kl_penalty(logp.detach(), ref) * m).sum() / m.sum().clamp(min=1))}
    return first


def train(policy, task, cfg, *, steps, batch_size, seed):
    g = torch.Generator().manual_seed(seed + 1)
    ref = copy.deepcopy(policy)
    ref.load_state_dict(policy.state_dict())
    for p in ref.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    history = []
    for _ in range(steps):
        ids, mask = task.sample_prompts(batch_size, g)
        rollout = generate(policy, ids, mask, cfg, eos_id=task.eos_id, pad_id=task.pad_id, generator=g)
        rewards = task.reward(rollout)
        stats = grpo_step(policy, ref, opt, rollout, rewards, cfg)
        history.append({"reward_mean": float(rewards.mean()), **stats})
    return history
