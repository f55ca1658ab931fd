"""The slow, loop-based, obviously right GRPO that every check compares against.

Each function spells out the contract one row, one group, one token at a time, with Python loops and scalar
tensor ops, so that it can be read against the paper line by line. It is only ever run on tiny shapes.
"""
import math

import torch


def completion_mask(completion_ids, eos_id):
    N, T = completion_ids.shape
    mask = torch.zeros(N, T)
    for n in range(N):
        for t in range(T):
            mask[n, t] = 1.0
            if int(completion_ids[n, t]) == eos_id:
                break
    return mask


def group_advantages(rewards, group_size, eps):
    r = [float(x) for x in rewards]
    out = []
    for start in range(0, len(r), group_size):
        group = r[start:start + group_size]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        out += [(x - mean) / (std + eps) for x in group]
    return torch.tensor(out, dtype=torch.float64)


def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    """Per row and per completion token: run the model on that row's real prefix alone (no padding at all)
    and score the next token. (N, T) float64; positions whose predicting column is padding are NaN."""
    N, L = input_ids.shape
    out = torch.full((N, L - prompt_len), float("nan"), dtype=torch.float64)
    with torch.no_grad():
        for n in range(N):
            for c in range(prompt_len, L):
                if not attention_mask[n, c - 1]:
                    continue
                prefix = input_ids[n, :c][attention_mask[n, :c].bool()][None]        # (1, L') real tokens only
                logits = model(prefix, torch.ones_like(prefix))[0, -1].double()      # (V,)
                out[n, c - prompt_len] = torch.log_softmax(logits / temperature, -1)[input_ids[n, c]]
    return out


def kl_k3(logp, ref_logp):
    """exp(ref - logp) - (ref - logp) - 1, one element at a time."""
    out = torch.empty_like(logp)
    for idx in range(logp.numel()):
        d = ref_logp.reshape(-1)[idx] - logp.reshape(-1)[idx]
        out.reshape(-1)[idx] = torch.exp(d) - d - 1
    return out


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, clip_eps, beta):
    """Differentiable in logp: the per-row masked mean of the per-token objective, averaged over rows."""
    N, T = logp.shape
    rows = []
    for n in range(N):
        terms = []
        for t in range(T):
            if not completion_mask[n, t]:
                continue
            ratio = torch.exp(logp[n, t] - old_logp[n, t].detach())
            a = advantages[n]
            surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
            d = ref_logp[n, t].detach() - logp[n, t]
            terms.append(-surrogate + beta * (torch.exp(d) - d - 1))
        rows.append(sum(terms) / len(terms) if terms else logp.sum() * 0)
    return sum(rows) / N


def grpo_step(policy, ref_policy, lr, rollout, rewards, cfg):
    """The update, spelled out, with plain SGD at learning rate lr: advantages; pi_old and pi_ref under no_grad;
    mu times: loss, clear the gradients, backward, clip_grad_norm_, p -= lr * grad. Uses the oracle's own loss
    and advantages."""
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps)
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, cfg.temperature)
    with torch.no_grad():
        old = _batched_logprobs(policy, *args)
        ref = _batched_logprobs(ref_policy, *args)
    for _ in range(cfg.num_iterations):
        logp = _batched_logprobs(policy, *args)
        loss = grpo_loss(logp, old, ref, adv, rollout.completion_mask, cfg.clip_eps, cfg.beta)
        for p in policy.parameters():
            p.grad = None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        with torch.no_grad():
            for p in policy.parameters():
                if p.grad is not None:
                    p -= lr * p.grad


def _batched_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    """Differentiable log-probs, one row at a time on its unpadded sequence (float64)."""
    rows = []
    for n in range(input_ids.shape[0]):
        keep = attention_mask[n].bool()
        keep[prompt_len:] = True  # score every completion column; pads after EOS are masked in the loss
        ids = input_ids[n][keep][None]
        P = int(keep[:prompt_len].sum())
        logits = model(ids, attention_mask[n][keep][None])[0].double()             # (L', V)
        logp = torch.log_softmax(logits[P - 1:-1] / temperature, -1)               # (T, V)
        rows.append(logp.gather(-1, ids[0, P:, None]).squeeze(-1))                 # (T,)
    return torch.stack(rows)


@torch.no_grad()
def expected_reward(policy, task, prompt_ids, prompt_mask, samples: int, max_new_tokens: int, seed: int) -> float:
    """Mean task reward of `samples` completions per prompt, sampled at temperature 1 by this file's own
    sampler: a measure of the policy itself, whatever sampler the implementation under test uses."""
    gen = torch.Generator().manual_seed(seed)
    ids = prompt_ids.repeat_interleave(samples, 0)
    mask = prompt_mask.repeat_interleave(samples, 0)
    P = ids.shape[1]
    ended = torch.zeros(ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        probs = torch.softmax(policy(ids, mask)[:, -1].double(), -1)
        tok = torch.where(ended, task.pad_id, torch.multinomial(probs, 1, generator=gen).squeeze(1))
        ids = torch.cat([ids, tok[:, None]], 1)
        mask = torch.cat([mask, (~ended).long()[:, None]], 1)
        ended |= tok == task.eos_id
    rollout = type("Rollout", (), {"input_ids": ids, "attention_mask": mask, "prompt_len": P})
    return float(task.reward(rollout).mean())
