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


def rollout_mask(completion_ids, eos_id, mask_truncated_completions):
    """The completion_mask a rollout carries: completion_mask's, and with mask_truncated_completions all 0 on a row
    that holds no EOS (one that reached max_new_tokens without ending)."""
    mask = completion_mask(completion_ids, eos_id)
    for n in range(completion_ids.shape[0]):
        if mask_truncated_completions and eos_id not in completion_ids[n].tolist():
            mask[n] = 0.0
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


def token_entropies(model, input_ids, attention_mask, prompt_len, temperature):
    """Per row and per completion token: run the model on that row's real prefix alone and take the entropy
    -sum_v p_v log p_v of softmax(logits / temperature). (N, T) float64; NaN where the predicting column is padding."""
    N, L = input_ids.shape
    out = torch.full((N, L - prompt_len), float("nan"), dtype=torch.float64)
    with torch.no_grad():
        for n in range(N):
            for c in range(prompt_len, L):
                if not attention_mask[n, c - 1]:
                    continue
                prefix = input_ids[n, :c][attention_mask[n, :c].bool()][None]        # (1, L') real tokens only
                logits = model(prefix, torch.ones_like(prefix))[0, -1].double()      # (V,)
                out[n, c - prompt_len] = entropy(logits / temperature)
    return out


def entropy(logits):
    """-sum over the vocabulary of p log p, p = softmax(logits), one entry at a time."""
    logp = torch.log_softmax(logits, -1)
    return -sum(float(torch.exp(x)) * float(x) for x in logp)


def quantile(values, q):
    """The q-quantile of a list of numbers, interpolated linearly between the two nearest ranks (as torch.quantile)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def kl_k3(logp, ref_logp):
    """exp(ref - logp) - (ref - logp) - 1, one element at a time."""
    out = torch.empty_like(logp)
    for idx in range(logp.numel()):
        d = ref_logp.reshape(-1)[idx] - logp.reshape(-1)[idx]
        out.reshape(-1)[idx] = torch.exp(d) - d - 1
    return out


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, num_tokens=None, sampler_logp=None,
              entropies=None):
    """Differentiable in logp. Per completion token t of row n (masked positions are never read), with A = A_n:

    r: pi / pi_old at the token; with importance_sampling_level "sequence", exp of the mean of log(pi / pi_old)
       over the row's tokens, the same r for every token of the row (GSPO).
    policy term, by loss_type:
       grpo, bnpo, dr_grpo, dapo: -min(r' * A, clip(r, 1 - clip_eps, 1 + clip_eps_high) * A), where r' = r, or
          min(r, delta) when delta is set (INTELLECT-2);
       cispo: -min(r, cap) * A * log pi, min(r, cap) a constant, cap = clip_eps_high, or 5.0 when it is None;
       sapo:  -sigmoid(tau * (r - 1)) * 4 / tau * A, tau = sapo_temperature_pos where A > 0, else sapo_temperature_neg.
    The policy term is then multiplied by:
       0 in a row with A < 0 whose mean of log(pi_b / pi) over its tokens is above off_policy_mask_threshold, pi_b
          the sampler (sampler_logp) or pi_old without it, pi a constant here (DeepSeek-V3.2);
       0 at a token whose entropy (`entropies`) is below the (1 - top_entropy_quantile) quantile of the entropies
          of every completion token of the call, when top_entropy_quantile < 1 and entropies are given;
       w, a constant, when sampler_logp is given and rollout_is_mode or is_cap is set: pi_old / pi_sampler at the
          token (token_*) or its product over the row's tokens (sequence_*); *_truncate clamps w into
          [rollout_is_clip_min, rollout_is_clip_max], *_mask makes it 0 outside them (a bound that is None is no
          bound); is_cap C is token_truncate with the bounds (None, C).
    Plus beta * k3, times r when use_bias_correction_kl. Then by loss_type: grpo and sapo, the mean over rows of
    each row's token mean; bnpo, the token sum over the token count; dr_grpo, the token sum over rows *
    max_new_tokens; dapo and cispo, the token sum over num_tokens (default: the token count)."""
    N, T = logp.shape
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    tokens = [[t for t in range(T) if completion_mask[n, t]] for n in range(N)]
    threshold = None
    if cfg.top_entropy_quantile < 1 and entropies is not None and any(tokens):
        every = [float(entropies[n, t]) for n in range(N) for t in tokens[n]]
        threshold = quantile(every, 1 - cfg.top_entropy_quantile)
    rows, count = [], 0
    for n in range(N):
        a = float(advantages[n])
        log_ratios = [logp[n, t] - old_logp[n, t].detach() for t in tokens[n]]
        seq_ratio = torch.exp(sum(log_ratios) / len(log_ratios)) if log_ratios else None
        drop_row = False
        if cfg.off_policy_mask_threshold is not None and tokens[n]:
            behaviour = old_logp if sampler_logp is None else sampler_logp
            drift = sum(float(behaviour[n, t]) - float(logp[n, t].detach()) for t in tokens[n]) / len(tokens[n])
            drop_row = a < 0 and drift > cfg.off_policy_mask_threshold
        terms = []
        for i, t in enumerate(tokens[n]):
            r = seq_ratio if cfg.importance_sampling_level == "sequence" else torch.exp(log_ratios[i])
            if cfg.loss_type == "cispo":
                cap = 5.0 if cfg.clip_eps_high is None else cfg.clip_eps_high
                policy = -min(float(r.detach()), cap) * a * logp[n, t]
            elif cfg.loss_type == "sapo":
                tau = cfg.sapo_temperature_pos if a > 0 else cfg.sapo_temperature_neg
                policy = -torch.sigmoid(tau * (r - 1)) * 4 / tau * a
            else:
                unclipped = r if cfg.delta is None else torch.clamp(r, max=cfg.delta)
                policy = -torch.minimum(unclipped * a, torch.clamp(r, 1 - cfg.clip_eps, 1 + eps_high) * a)
            if drop_row:
                policy = policy * 0.0
            if threshold is not None and not float(entropies[n, t]) >= threshold:
                policy = policy * 0.0
            w = sampler_weight(old_logp, sampler_logp, tokens, n, t, cfg)
            if w is not None:
                policy = policy * w
            d = ref_logp[n, t].detach() - logp[n, t]
            kl = torch.exp(d) - d - 1
            if cfg.use_bias_correction_kl:
                kl = kl * r
            terms.append(policy + cfg.beta * kl)
        rows.append(terms)
        count += len(terms)
    zero = logp[completion_mask.bool()].sum() * 0  # keeps the graph when a row has no tokens
    total = sum((sum(terms) for terms in rows if terms), zero)
    if cfg.loss_type in ("grpo", "sapo"):
        return sum((sum(terms) / len(terms) for terms in rows if terms), zero) / N
    if cfg.loss_type == "bnpo":
        return total / max(count, 1)
    if cfg.loss_type == "dr_grpo":
        return total / (N * cfg.max_new_tokens)
    if cfg.loss_type in ("dapo", "cispo"):
        return total / (max(count, 1) if num_tokens is None else float(num_tokens))
    raise ValueError(f"unknown loss_type {cfg.loss_type!r}")


def sampler_weight(old_logp, sampler_logp, tokens, n, t, cfg):
    """The sampler correction of token t of row n as a float, or None when there is none (see grpo_loss)."""
    if sampler_logp is None or (cfg.is_cap is None and cfg.rollout_is_mode is None):
        return None
    mode, lo, hi = cfg.rollout_is_mode, cfg.rollout_is_clip_min, cfg.rollout_is_clip_max
    if cfg.is_cap is not None:
        mode, lo, hi = "token_truncate", None, cfg.is_cap
    over = tokens[n] if mode.startswith("sequence") else [t]
    w = math.exp(sum(float(old_logp[n, s]) - float(sampler_logp[n, s]) for s in over))
    outside = (lo is not None and w < lo) or (hi is not None and w > hi)
    if mode.endswith("mask"):
        return 0.0 if outside else w
    return max(w, lo) if lo is not None and w < lo else min(w, hi) if hi is not None and w > hi else w


def micro_batches(N, k):
    """Contiguous row ranges, sizes differing by at most one (torch.tensor_split), empty ones left out."""
    return [rows for rows in torch.tensor_split(torch.arange(N), k) if len(rows)]


def grpo_step(policy, ref_policy, lr, rollout, rewards, cfg, world=1, adamw=None):
    """The update, spelled out, with plain SGD at learning rate lr (or AdamW, given its state dict `adamw`):
    advantages (scale_rewards, per group); pi_old and pi_ref under no_grad, and the rollout's sampler_logp handed
    to the loss; mu times: the loss, clear the gradients, backward, clip_grad_norm_, p -= lr * grad.
    With grad_accum_steps, every loss_type but bnpo gives the full-batch step by definition; bnpo is the sum of
    each micro-batch's own token mean divided by grad_accum_steps (TRL). With top_entropy_quantile < 1, each
    micro-batch's loss takes its entropy threshold over its own tokens, from the entropies of the policy being
    stepped (TRL computes both in each _compute_loss call), and the micro-batches' losses add up as the step
    weighs them: divided by grad_accum_steps for bnpo, over the whole batch's token count for dapo and cispo,
    each by its share of the rows for the rest. On `world` data-parallel ranks, each holding a contiguous share
    of the groups, the gradients are averaged over ranks: every loss_type but bnpo again gives the full-batch
    step; bnpo averages each rank's own token mean. Uses the oracle's own loss and advantages."""
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards)
    args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len, cfg.temperature)
    mask = rollout.completion_mask
    sampler = getattr(rollout, "sampler_logp", None)
    with torch.no_grad():
        old = _batched_logprobs(policy, *args)
        ref = _batched_logprobs(ref_policy, *args)
    per_micro_batch = cfg.loss_type == "bnpo" or cfg.top_entropy_quantile < 1

    def rank_loss(rows):  # one rank's loss, over its micro-batches, each with its own count or threshold
        k, loss = cfg.grad_accum_steps, 0.0
        for r in [rows[m] for m in micro_batches(len(rows), k)]:
            part = grpo_loss(logp[r], old[r], ref[r], adv[r], mask[r], cfg, num_tokens=float(mask.sum()) / world,
                             sampler_logp=None if sampler is None else sampler[r],
                             entropies=None if entropies is None else entropies[r])
            if cfg.loss_type == "bnpo":
                part = part / k
            elif cfg.loss_type not in ("dapo", "cispo"):
                part = part * len(r) / len(rows)
            loss = loss + part
        return loss

    for _ in range(cfg.num_iterations):
        logp = _batched_logprobs(policy, *args)
        entropies = _batched_entropies(policy, *args) if cfg.top_entropy_quantile < 1 else None
        if per_micro_batch:
            loss = sum(rank_loss(rows) for rows in micro_batches(len(adv), world)) / world
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


def _batched_entropies(model, input_ids, attention_mask, prompt_len, temperature):
    """Entropies of every completion column (N, T), one row at a time on its unpadded sequence (float64, no grad)."""
    rows = []
    with torch.no_grad():
        for n in range(input_ids.shape[0]):
            keep = attention_mask[n].bool()
            keep[prompt_len:] = True
            ids = input_ids[n][keep][None]
            P = int(keep[:prompt_len].sum())
            logits = model(ids, attention_mask[n][keep][None])[0].double()         # (L', V)
            rows.append(torch.tensor([entropy(x / temperature) for x in logits[P - 1:-1]], dtype=torch.float64))
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
