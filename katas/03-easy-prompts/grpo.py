"""GRPO, the reference: the corrected loop that every kata is measured against.

Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300, section 4.1): sample G completions per
prompt, score them with a verifiable reward, use each group's mean and std as the baseline, and take clipped
policy-gradient steps with a k3 KL penalty against a frozen reference policy. Read it top to bottom:

    config -> 1) sample groups -> 2) rewards -> 3) advantages -> 4) log-probs -> 5) KL -> 6) loss
           -> 7) one update (mu inner steps) -> 8) the training loop

Shapes: B prompts, G = group_size, N = B*G rows, P prompt columns (left-padded), T completion columns,
V vocabulary. A model is called as model(input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V) and
derives positions from the mask. Where this departs from the paper: mu (num_iterations) defaults to 1 as in
the paper's experiments, the loss is the per-row mean of the paper's eq. 3 (TRL's loss_type="grpo"), and the
KL term sits in the loss, not the reward. Device and dtype come from the model; nothing is tied to CUDA.
"""
import copy
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8          # G completions per prompt; the group is the baseline (paper 64, TRL 8)
    max_new_tokens: int = 8      # longest completion T; the toy tasks need at most 4
    temperature: float = 1.0     # sampling temperature; log-probs divide the logits by the same value
    beta: float = 0.04           # KL coefficient (DeepSeekMath 0.04; 0 drops the reference, as Dr. GRPO does)
    clip_eps: float = 0.2        # PPO trust region: ratio clipped to [1 - eps, 1 + eps]
    adv_eps: float = 1e-4        # added to the group std, so an all-equal group gives 0, not NaN (TRL 1e-4)
    num_iterations: int = 1      # mu: policy updates per batch of rollouts (paper 1; >1 makes the clip bite)
    lr: float = 3e-3             # AdamW learning rate; high because the lab model is tiny (paper 1e-6)
    max_grad_norm: float = 1.0   # global grad-norm clip before each optimizer step

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2: a group of one has no baseline")
        if self.temperature <= 0:
            raise ValueError("temperature must be positive")


@dataclass
class Rollout:
    input_ids: torch.Tensor        # (N, P+T) prompt then completion; pad after a row's first EOS
    attention_mask: torch.Tensor   # (N, P+T) 0 on left padding and on pad after EOS
    completion_mask: torch.Tensor  # (N, T) 1 up to and including the first EOS
    prompt_len: int                # P


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
    Uses the model's KV cache when it offers one (model.make_cache()), else recomputes the prefix."""
    ids = prompt_ids.repeat_interleave(cfg.group_size, dim=0)             # (N, P) rows i*G..i*G+G-1: prompt i
    mask = prompt_mask.repeat_interleave(cfg.group_size, dim=0)           # (N, P)
    P = ids.shape[1]
    ended = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)  # (N,)
    cache = policy.make_cache() if hasattr(policy, "make_cache") else None
    new = ids                                                             # columns the model has not seen
    for _ in range(cfg.max_new_tokens):
        if cache is None:
            logits = policy(ids, mask)[:, -1]                             # (N, V)
        else:
            logits = policy(new, mask, cache=cache)[:, -1]                # (N, V)
        probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)   # (N, V)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N,)
        tok = torch.where(ended, pad_id, tok)                             # (N,) pad after EOS
        ids = torch.cat([ids, tok[:, None]], dim=1)                       # (N, P+t)
        mask = torch.cat([mask, (~ended).to(mask.dtype)[:, None]], dim=1)  # (N, P+t)
        ended = ended | (tok == eos_id)
        new = tok[:, None]                                                # (N, 1)
        if ended.all():
            break
    return Rollout(ids, mask, completion_mask(ids[:, P:], eos_id), P)


# 3) advantages: each reward against its own group -----------------------------------------------------

def group_advantages(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    """(N,) -> (N,): (r - group mean) / (group std + eps), std unbiased, groups = contiguous runs of G.
    One scalar per completion, shared by all its tokens (outcome supervision, paper section 4.1.2)."""
    r = rewards.detach().float().view(-1, group_size)                     # (B, G)
    mean = r.mean()                                                       # ()
    std = r.std()                                                         # ()
    return ((r - mean) / (std + eps)).view(-1)                            # (N,)


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

def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg: GRPOConfig) -> torch.Tensor:
    """Scalar: mean over rows of the masked mean over that row's completion tokens of
    -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * kl (paper eq. 3, TRL loss_type="grpo")."""
    ratio = torch.exp(logp - old_logp)                                    # (N, T) pi / pi_old
    adv = advantages[:, None]                                             # (N, 1) one advantage per row
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps)      # (N, T)
    surrogate = torch.min(ratio * adv, clipped * adv)                     # (N, T)
    per_token = -surrogate + cfg.beta * kl_penalty(logp, ref_logp)        # (N, T)
    mask = completion_mask.to(per_token.dtype)                            # (N, T)
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (N,)
    return per_row.mean()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean over the whole batch, for logging."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


# 7) one update: mu optimizer steps on one batch of rollouts --------------------------------------------

def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards, cfg: GRPOConfig) -> dict:
    """Advantages, then pi_old and pi_ref log-probs under no_grad, then num_iterations times:
    log-probs, loss, zero_grad, backward, clip_grad_norm_, step. The reference is never stepped."""
    advantages = group_advantages(rewards, cfg.group_size, cfg.adv_eps)  # (N,)
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, cfg.temperature)
    mask = rollout.completion_mask                                        # (N, T)
    with torch.no_grad():
        old_logp = token_logprobs(policy, *args)                          # (N, T) pi_old, the sampler
        ref_logp = token_logprobs(ref_policy, *args)                      # (N, T) pi_ref, frozen
    losses, kls, clipped = [], [], []
    for _ in range(cfg.num_iterations):
        logp = token_logprobs(policy, *args)                              # (N, T)
        loss = grpo_loss(logp, old_logp, ref_logp, advantages, mask, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            losses.append(loss.detach())
            kls.append(masked_mean(kl_penalty(logp, ref_logp), mask))
            ratio = torch.exp(logp - old_logp)                            # (N, T)
            clipped.append(masked_mean(((ratio - 1).abs() > cfg.clip_eps).float(), mask))
    return {"loss": losses[0].item(), "kl": kls[0].item(), "clip_frac": clipped[-1].item(),
            "grad_norm": grad_norm.item(), "adv_std": advantages.std().item(),
            "completion_len": mask.sum(dim=1).float().mean().item()}


# 8) the training loop ---------------------------------------------------------------------------------

def print_stats(s: dict) -> None:
    print(f"step {s['step']:3d} | reward {s['reward_mean']:.3f} | kl {s['kl']:.4f} | loss {s['loss']:+.4f}"
          f" | clip {s['clip_frac']:.2f} | gnorm {s['grad_norm']:.2f} | len {s['completion_len']:.1f}", flush=True)


def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=print_stats) -> list:
    """Reference = frozen deepcopy of the policy at the start; AdamW(lr); each step: B prompts from the task,
    G completions each, the task's rewards, one grpo_step. Returns one stats dict per step."""
    torch.manual_seed(seed)
    device = next(policy.parameters()).device
    prompt_gen = torch.Generator().manual_seed(seed)                      # the task samples on the CPU
    sample_gen = torch.Generator(device=device).manual_seed(seed)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    history = []
    for step in range(1, steps + 1):
        prompt_ids, prompt_mask = task.sample_prompts(batch_size, prompt_gen)  # (B, P)
        rollout = generate(policy, prompt_ids.to(device), prompt_mask.to(device), cfg,
                           eos_id=task.eos_id, pad_id=task.pad_id, generator=sample_gen)
        rewards = task.reward(rollout).to(device)                         # (N,)
        stats = grpo_step(policy, ref_policy, optimizer, rollout, rewards, cfg)
        stats = {"step": step, "reward_mean": rewards.mean().item(), "reward_max": rewards.max().item(), **stats}
        history.append(stats)
        log(stats)
    return history


if __name__ == "__main__":
    from lab import ModelConfig, SumTask, TinyLM
    torch.manual_seed(0)
    train(TinyLM(ModelConfig()), SumTask(), GRPOConfig(num_iterations=2), steps=40, batch_size=16, seed=0)
