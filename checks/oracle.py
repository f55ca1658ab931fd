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


def std(values):
    """The unbiased (Bessel-corrected) standard deviation."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - 1))


def group_advantages(rewards, group_size, eps, scale="group"):
    """Each reward minus its group's mean; divided by that group's std + eps ("group"), by the whole batch's
    std + eps ("batch"), or not at all ("none")."""
    r = [float(x) for x in rewards]
    out = []
    for start in range(0, len(r), group_size):
        group = r[start:start + group_size]
        mean = sum(group) / len(group)
        divisor = {"group": lambda: std(group) + eps, "batch": lambda: std(r) + eps, "none": lambda: 1.0}[scale]()
        out += [(x - mean) / divisor for x in group]
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


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, num_tokens=None, sampler_logp=None):
    """Differentiable in logp. Per completion token (masked positions are never read):
    -min(r*A, clip(r, 1 - clip_eps, 1 + clip_eps_high)*A) * w + beta * k3, with r = pi / pi_old and
    w = min(pi_old / pi_sampler, is_cap) as a constant when is_cap and sampler_logp are given. Then by loss_type:
    grpo, the mean over rows of each row's token mean; bnpo, the token sum over the token count; dr_grpo, the
    token sum over rows * max_new_tokens; dapo, the token sum over num_tokens (default: the token count)."""
    N, T = logp.shape
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    rows, count = [], 0
    for n in range(N):
        terms = []
        for t in range(T):
            if not completion_mask[n, t]:
                continue
            ratio = torch.exp(logp[n, t] - old_logp[n, t].detach())
            a = advantages[n]
            surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + eps_high) * a)
            if cfg.is_cap is not None and sampler_logp is not None:
                surrogate = surrogate * min(math.exp(float(old_logp[n, t]) - float(sampler_logp[n, t])), cfg.is_cap)
            d = ref_logp[n, t].detach() - logp[n, t]
            terms.append(-surrogate + cfg.beta * (torch.exp(d) - d - 1))
        rows.append(terms)
        count += len(terms)
    zero = logp[completion_mask.bool()].sum() * 0  # keeps the graph when a row has no tokens
    total = sum((sum(terms) for terms in rows if terms), zero)
    if cfg.loss_type == "grpo":
        return sum((sum(terms) / len(terms) for terms in rows if terms), zero) / N
    if cfg.loss_type == "bnpo":
        return total / max(count, 1)
    if cfg.loss_type == "dr_grpo":
        return total / (N * cfg.max_new_tokens)
    if cfg.loss_type == "dapo":
        return total / (max(count, 1) if num_tokens is None else float(num_tokens))
    raise ValueError(f"unknown loss_type {cfg.loss_type!r}")


def micro_batches(N, k):
    """Contiguous row ranges, sizes differing by at most one (torch.tensor_split), empty ones left out."""
    return [rows for rows in torch.tensor_split(torch.arange(N), k) if len(rows)]


def grpo_step(policy, ref_policy, lr, rollout, rewards, cfg, world=1, adamw=None):
    """The update, spelled out, with plain SGD at learning rate lr (or AdamW, given its state dict `adamw`):
    advantages (scale_rewards, per group); pi_old and pi_ref under no_grad; mu times: the loss, clear the
    gradients, backward, clip_grad_norm_, p -= lr * grad. With grad_accum_steps, grpo, dr_grpo and dapo give the
    full-batch step by definition; bnpo is the sum of each micro-batch's own token mean divided by
    grad_accum_steps (TRL). On `world` data-parallel ranks, each holding a contiguous share of the groups, the
    gradients are averaged over ranks: grpo, dr_grpo and dapo again give the full-batch step; bnpo averages each
    rank's own token mean. Uses the oracle's own loss and advantages."""
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, cfg.temperature)
    mask = rollout.completion_mask
    sampler = getattr(rollout, "sampler_logp", None) if cfg.is_cap is not None else None
    with torch.no_grad():
        old = _batched_logprobs(policy, *args)
        ref = _batched_logprobs(ref_policy, *args)

    def bnpo(rows):  # one rank's bnpo loss, over its micro-batches
        k = cfg.grad_accum_steps
        return sum(grpo_loss(logp[r], old[r], ref[r], adv[r], mask[r], cfg,
                             sampler_logp=None if sampler is None else sampler[r])
                   for r in [rows[m] for m in micro_batches(len(rows), k)]) / k

    for _ in range(cfg.num_iterations):
        logp = _batched_logprobs(policy, *args)
        if cfg.loss_type == "bnpo":
            loss = sum(bnpo(rows) for rows in micro_batches(len(adv), world)) / world
        else:
            loss = grpo_loss(logp, old, ref, adv, mask, cfg, sampler_logp=sampler)
        for p in policy.parameters():
            p.grad = None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        with torch.no_grad():
            if adamw is None:
                for p in policy.parameters():
                    if p.grad is not None:
                        p -= lr * p.grad
            else:
                adamw_update(policy, lr, adamw)


def adamw_update(model, lr, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
    """torch.optim.AdamW's step with its defaults, written out; state holds t and each parameter's moments."""
    state["t"] = state.get("t", 0) + 1
    t = state["t"]
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        m, v = state.setdefault(name, (torch.zeros_like(p), torch.zeros_like(p)))
        m = betas[0] * m + (1 - betas[0]) * p.grad
        v = betas[1] * v + (1 - betas[1]) * p.grad ** 2
        state[name] = (m, v)
        p.mul_(1 - lr * weight_decay)
        denom = (v / (1 - betas[1] ** t)).sqrt() + eps
        p -= lr / (1 - betas[0] ** t) * m / denom


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
