"""
Reinforcement learning on a toy task via GRPO.

Group Relative Policy Optimization (DeepSeekMath): sample a group of completions per prompt, score them, use the
group as its own baseline, and take clipped policy-gradient steps with a KL penalty to a frozen reference model.
Out of the box it is the paper's recipe, and unlike a plain REINFORCE loop it keeps all of it: the PPO ratio+clip,
the KL penalty, and the advantage divided by the group's std. What can be changed, and how:

1) loss_type: how the per-token objective becomes one number (grpo, bnpo, dr_grpo, dapo), or another objective
   altogether: cispo (MiniMax-M1: a capped, constant weight on the log-prob), sapo (a soft gate in place of the clip).
2) scale_rewards: what the centred rewards are divided by (group, batch, or none as in Dr. GRPO).
3) clip_eps_high: DAPO's clip-higher, a wider clip above the ratio than below it (for cispo: the cap itself).
4) is_cap: importance weights capped at is_cap, for a sampler that is not exactly pi_old (another engine, precision);
   rollout_is_mode and its bounds do the same per token or per sample, truncated or masked.
5) grad_accum_steps: the batch goes through the model in that many passes.
6) importance_sampling_level: one ratio per token, or one per sample (GSPO).
7) delta: INTELLECT-2's bound on the ratio where the clip does not hold it.
8) top_entropy_quantile: only the tokens of highest entropy carry the policy gradient (Beyond the 80/20 Rule).
9) mask_truncated_completions: a sample that never produced its eos is left out of the loss (DAPO).
10) use_bias_correction_kl, off_policy_mask_threshold: DeepSeek-V3.2's KL weighed by the ratio, and its mask of bad
   samples that drifted too far off-policy.

1 process:
python grpo.py

2 processes (data parallel, gloo on CPU):
torchrun --standalone --nproc_per_node=2 grpo.py --loss-type=dapo
"""

import copy
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# Compute helpers: which rank we are, printing on rank 0 only

def get_dist_info():
    # (ddp, ddp_rank, ddp_local_rank, ddp_world_size): data parallel as soon as a process group has been initialized
    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0)), dist.get_world_size()
    return False, 0, 0, 1

def print0(s="", **kwargs):
    ddp, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    if ddp_rank == 0:
        print(s, **kwargs)

def autodetect_device_type():
    # prefer to use CUDA if available, otherwise use MPS, otherwise fallback on CPU
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"

def compute_init(device_type="cpu"): # cuda|cpu|mps
    # Distributed setup: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; nccl on GPUs, gloo otherwise
    ddp_local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(device_type, ddp_local_rank) if device_type == "cuda" else torch.device(device_type)
    if all(k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        if device_type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        dist.barrier()
    ddp, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    return ddp, ddp_rank, ddp_local_rank, ddp_world_size, device

def compute_cleanup():
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

# -----------------------------------------------------------------------------
# Config and the rollout that the batch generator yields

def require(condition, message):
    # a bad config is a ValueError: an assert would be gone under python -O
    if not condition:
        raise ValueError(message)

@dataclass(frozen=True)
class GRPOConfig:
    # Sampling
    group_size: int = 8 # samples per prompt, the group each one is compared with
    max_new_tokens: int = 8 # max tokens to generate per sample
    temperature: float = 1.0 # sampling temperature
    # Batch sizes
    grad_accum_steps: int = 1 # passes per optimizer step
    # Optimization
    lr: float = 3e-3 # AdamW learning rate
    max_grad_norm: float = 1.0 # gradient norm clipping
    num_iterations: int = 1 # iterations on each batch of rollouts (mu)
    # Objective
    loss_type: str = "grpo" # grpo|bnpo|dr_grpo|dapo|cispo|sapo
    scale_rewards: str = "group" # group|batch|none
    adv_eps: float = 1e-4 # added to the std the advantages are divided by
    clip_eps: float = 0.2 # PPO clip range
    clip_eps_high: float | None = None # DAPO clip-higher (None = clip_eps)
    is_cap: float | None = None # cap of the sampler importance weight (None = no correction)
    beta: float = 0.04 # weight of the KL penalty to the reference model
    importance_sampling_level: str = "token" # token|sequence (GSPO: one ratio per sample)
    sapo_temperature_pos: float = 1.0 # sapo: steepness of the gate for a good sample
    sapo_temperature_neg: float = 1.05 # sapo: steepness of the gate for a bad one
    delta: float | None = None # bound on the unclipped ratio (None = no bound), INTELLECT-2 uses 4
    top_entropy_quantile: float = 1.0 # share of tokens, by entropy, that carry the policy gradient (1.0 = all)
    mask_truncated_completions: bool = False # leave the samples that never produced their eos out of the loss
    rollout_is_mode: str | None = None # token_truncate|token_mask|sequence_truncate|sequence_mask (None = off)
    rollout_is_clip_min: float | None = None # lower bound of those importance weights (None = none)
    rollout_is_clip_max: float | None = 3.0 # upper bound of those importance weights (None = none)
    use_bias_correction_kl: bool = False # weigh the KL penalty by the ratio (DeepSeek-V3.2)
    off_policy_mask_threshold: float | None = None # drop bad samples that drifted further than this (None = off)

    def __post_init__(self):
        require(self.group_size >= 2, f"Each example is compared with its own samples, so it needs 2 or more: {self.group_size}")
        require(self.temperature > 0, f"Sampling needs a temperature above zero (no greedy decoding here): {self.temperature}")
        require(self.grad_accum_steps >= 1, f"The batch goes through the model in one pass at least: {self.grad_accum_steps}")
        require(self.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"), f"Expected grpo|bnpo|dr_grpo|dapo|cispo|sapo for the loss: {self.loss_type}")
        require(self.scale_rewards in ("group", "batch", "none"), f"Expected group|batch|none for the reward scaling: {self.scale_rewards}")
        require(self.importance_sampling_level in ("token", "sequence"), f"Expected token|sequence for the importance sampling level: {self.importance_sampling_level}")
        require(self.sapo_temperature_pos > 0 and self.sapo_temperature_neg > 0, f"The sapo gate needs positive temperatures: {self.sapo_temperature_pos}, {self.sapo_temperature_neg}")
        require(self.delta is None or self.delta > 1, f"delta bounds a ratio that is 1 on policy, so it must be above 1: {self.delta}")
        require(0 <= self.top_entropy_quantile <= 1, f"top_entropy_quantile is a share of the tokens, from 0 to 1: {self.top_entropy_quantile}")
        require(isinstance(self.mask_truncated_completions, bool) and isinstance(self.use_bias_correction_kl, bool), "mask_truncated_completions and use_bias_correction_kl are True or False")
        require(self.rollout_is_mode in (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"), f"Expected token_truncate|token_mask|sequence_truncate|sequence_mask for the rollout correction: {self.rollout_is_mode}")
        require(self.is_cap is None or self.rollout_is_mode is None, "is_cap is rollout_is_mode=token_truncate with rollout_is_clip_max=is_cap: set one")
        low, high = self.rollout_is_clip_min, self.rollout_is_clip_max
        require(low is None or high is None or low < high, f"The rollout correction's bounds are the wrong way round: {low}, {high}")
        require(self.rollout_is_mode is None or low is not None or high is not None, f"rollout_is_mode={self.rollout_is_mode} needs a bound")
        require(self.off_policy_mask_threshold is None or self.off_policy_mask_threshold > 0, f"off_policy_mask_threshold must be positive: {self.off_policy_mask_threshold}")

    @property
    def clip_range(self):
        # (low, high): where the ratio may go before the clip holds it
        return 1 - self.clip_eps, 1 + (self.clip_eps if self.clip_eps_high is None else self.clip_eps_high)

@dataclass
class Rollout:
    input_ids: torch.Tensor # (N, P+T) the prompt tokens followed by the generated tokens
    attention_mask: torch.Tensor # (N, P+T)
    completion_mask: torch.Tensor # (N, T) the tokens that are trained on
    prompt_len: int # P
    sampler_logp: torch.Tensor | None = None # (N, T) log-probs reported by the sampler

# -----------------------------------------------------------------------------
# Sampling: a stream of token columns, and the batch it adds up to

def completion_mask(completion_ids, eos_id):
    # The length of each completion, from where its eos is; all T columns if it never produced one
    num_rows, num_columns = completion_ids.shape
    is_eos = completion_ids == eos_id # (N, T)
    completion_lengths = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, num_columns) # (N,)
    columns = torch.arange(num_columns, device=completion_ids.device)
    return (columns[None, :] < completion_lengths[:, None]).float() # (N, T)

def sample_next_token(logits, rng, temperature):
    # Sample a single next token from given logits of shape (B, vocab_size). Returns (B, 1), and the log-prob (B, 1)
    # of each token under the distribution it was drawn from
    assert temperature > 0.0, "temperature must be positive"
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature # fp32 at least
    probs = F.softmax(logits, dim=-1) # (B, V)
    next_ids = torch.multinomial(probs, num_samples=1, generator=rng) # (B, 1)
    return next_ids, probs.gather(1, next_ids).log()

class RowState:
    # Per-row state tracking during generation
    def __init__(self):
        self.completed = False # Whether this row has completed generation (it has sampled its eos)

@torch.no_grad()
def generate_stream(model, input_ids, attention_mask, cfg, eos_id, pad_id, rng):
    # Yields one column of tokens at a time: (token_column, token_masks, token_logprobs), one entry per row each,
    # where the mask says whether the token was sampled (1) or forced (0): once a row has completed, pad is forced
    device = input_ids.device

    # 1) Prefill: one forward pass over the prompts, which also fills the KV cache if the model keeps one
    kv_cache = model.make_cache() if hasattr(model, "make_cache") else None
    kv_model_kwargs = {} if kv_cache is None else {"cache": kv_cache}
    logits = model(input_ids, attention_mask, **kv_model_kwargs)[:, -1, :] # (N, V)

    # 2) Initialize states for each row
    row_states = [RowState() for _ in range(input_ids.size(0))]

    # 3) Main generation loop
    num_generated = 0
    while True:
        # Stop condition: we've reached max tokens
        if num_generated >= cfg.max_new_tokens:
            break
        # Stop condition: all rows are completed
        if all(state.completed for state in row_states):
            break

        # Sample the next token for each row, with the log-prob it was drawn with
        next_ids, next_logprobs = sample_next_token(logits, rng, cfg.temperature) # (N, 1) each
        sampled_tokens = next_ids[:, 0].tolist()

        # Process each row: choose the next token, update state
        token_column = [] # contains the next token id along each row
        token_masks = [] # contains the mask (was it sampled (1) or forced (0)?) along each row
        for i, state in enumerate(row_states):
            # A completed row has nothing left to say: pad is forced into it
            is_forced = state.completed
            token_masks.append(0 if is_forced else 1) # mask is 0 if forced, 1 if sampled
            next_token = pad_id if is_forced else sampled_tokens[i]
            token_column.append(next_token)
            # On eos, mark the row as completed
            if next_token == eos_id:
                state.completed = True

        # Yield the token column
        yield token_column, token_masks, next_logprobs[:, 0]
        num_generated += 1

        # Prepare logits for next iteration: the forced pad is not attended to; with a KV cache only the new column
        # goes through the model
        ids = torch.tensor(token_column, dtype=torch.long, device=device).unsqueeze(1) # (N, 1)
        masks = torch.tensor(token_masks, dtype=attention_mask.dtype, device=device).unsqueeze(1) # (N, 1)
        input_ids = torch.cat([input_ids, ids], dim=1)
        attention_mask = torch.cat([attention_mask, masks], dim=1)
        new_ids = input_ids if kv_cache is None else ids
        logits = model(new_ids, attention_mask, **kv_model_kwargs)[:, -1, :] # (N, V)

def generate(policy, prompt_ids, prompt_mask, cfg, *, eos_id, pad_id, generator=None):
    # Replicate every prompt group_size times, (B, P) -> (B, G, P) -> (N, P), so its samples are rows in a run
    num_prompts, prompt_length = prompt_ids.shape
    num_rows = num_prompts * cfg.group_size
    input_ids = prompt_ids[:, None, :].expand(-1, cfg.group_size, -1).reshape(num_rows, prompt_length)
    attention_mask = prompt_mask[:, None, :].expand(-1, cfg.group_size, -1).reshape(num_rows, prompt_length)

    # Stream the samples and collect their columns: the tokens, the masks, the log-probs they were drawn with
    token_columns, mask_columns, logprob_columns = [], [], []
    for token_column, token_masks, token_logprobs in generate_stream(policy, input_ids, attention_mask, cfg, eos_id, pad_id, generator):
        token_columns.append(token_column)
        mask_columns.append(token_masks)
        logprob_columns.append(token_logprobs)
    # Stack up the columns into PyTorch tensors, one row per sample
    device = input_ids.device
    completion_ids = torch.tensor(token_columns, dtype=torch.long, device=device).T # (N, T)
    masks = torch.tensor(mask_columns, dtype=attention_mask.dtype, device=device).T # (N, T)

    # The forced pad was never drawn, so it has no log-prob (0), and nothing attends to it
    sampler_logp = torch.stack(logprob_columns, dim=1) * masks # (N, T)
    train_mask = completion_mask(completion_ids, eos_id) # (N, T)
    if cfg.mask_truncated_completions:
        # A sample that ran out of tokens before its eos is left out of the loss (DAPO's overlong filtering)
        train_mask = train_mask * (completion_ids == eos_id).any(dim=1, keepdim=True) # (N, T)
    return Rollout(input_ids=torch.cat([input_ids, completion_ids], dim=1),
                   attention_mask=torch.cat([attention_mask, masks], dim=1),
                   completion_mask=train_mask,
                   prompt_len=prompt_length,
                   sampler_logp=sampler_logp)

# -----------------------------------------------------------------------------
# The pieces of the objective

@torch.no_grad()
def group_advantages(rewards, group_size, eps, scale="group"):
    assert rewards.numel() % group_size == 0, "the rewards must come in whole groups"
    # One row per prompt, holding the rewards of its samples
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size) # (B, G)
    # Calculate the advantages by subtracting the mean reward of each row
    mu = rewards.mean(dim=-1, keepdim=True)
    advantages = rewards - mu
    # Then divide by the spread of the rewards: the row's own (group), the batch's (batch), none (none)
    if scale == "group":
        advantages.div_(rewards.std(dim=-1, keepdim=True) + eps)
    elif scale == "batch":
        advantages.div_(rewards.std() + eps)
    return advantages.view(-1) # (N,)

def get_inputs_targets(ids, mask_ids):
    # Generate autoregressive inputs and targets to the Transformer
    inputs = ids[:, :-1]
    targets = ids[:, 1:].clone() # clone to avoid in-place modification:
    targets[mask_ids[:, 1:] == 0] = -1 # <-- inplace modification right here. -1 is the ignore index
    return inputs, targets

def get_logp(model, inputs, targets, attention_mask, temperature, entropy=False):
    # The log-prob of every target at the sampling temperature; an ignored target (-1) gets 0. With entropy=True, also
    # the entropy of the distribution each target is scored under (B, L), from the same logits and without grad
    assert temperature > 0.0, "temperature must be positive"
    logits = model(inputs, attention_mask) # (B, L, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature # fp32 at least
    # Note that cross_entropy calculates NLL = -logp, so we negate
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="none")
    if not entropy:
        return -nll.view_as(targets) # (B, L)
    with torch.no_grad():
        logp_vocab = F.log_softmax(logits, dim=-1) # (B, L, V)
        entropies = -(logp_vocab.exp() * logp_vocab).sum(dim=-1) # (B, L)
    return -nll.view_as(targets), entropies

def token_logprobs(model, input_ids, attention_mask, prompt_len, temperature):
    # Every column is a target here; the ones past the prompt are the completion's
    inputs, targets = get_inputs_targets(input_ids, torch.ones_like(input_ids))
    logp = get_logp(model, inputs, targets, attention_mask[:, :-1], temperature) # (N, P+T-1)
    return logp[:, prompt_len - 1:] # (N, T)

def token_entropies(model, input_ids, attention_mask, prompt_len, temperature):
    # The entropy of the distribution each completion token is scored under, as token_logprobs scores it
    inputs, targets = get_inputs_targets(input_ids, torch.ones_like(input_ids))
    _, entropy = get_logp(model, inputs, targets, attention_mask[:, :-1], temperature, entropy=True) # (N, P+T-1)
    return entropy[:, prompt_len - 1:] # (N, T)

def kl_penalty(logp, ref_logp):
    # Schulman's "k3" approximation of the KL divergence from the reference model, per sampled token
    log_ratio = ref_logp - logp
    return torch.expm1(log_ratio) - log_ratio

def sample_mean(x, valid):
    # The mean of x over the valid tokens of each sample, (B, L) -> (B, 1)
    return (x * valid).sum(dim=-1, keepdim=True) / valid.sum(dim=-1, keepdim=True).clamp(min=1)

def high_entropy_tokens(entropy, valid, quantile):
    # Beyond the 80/20 Rule: the tokens at or above the (1 - quantile) quantile of the valid tokens' entropies, (B, L)
    if not valid.any():
        return valid
    threshold = torch.quantile(entropy[valid], 1 - quantile)
    return (entropy >= threshold) & valid

def importance_weights(logp, sampler_logp, cfg):
    # The weight logp / sampler_logp in probability space, per token or one per sample (the product over its tokens).
    # The *_truncate modes clamp it into the bounds and the *_mask modes zero it outside them; is_cap is the per-token
    # truncation with a cap and no floor. An ignored token has log-probs of 0 on both sides, so its weight is 1
    mode, low, high = cfg.rollout_is_mode, cfg.rollout_is_clip_min, cfg.rollout_is_clip_max
    if cfg.is_cap is not None:
        mode, low, high = "token_truncate", None, cfg.is_cap
    log_weights = logp - sampler_logp # (B, L)
    if mode.startswith("sequence"):
        log_weights = log_weights.sum(dim=-1, keepdim=True) # (B, 1)
    weights = log_weights.exp()
    if mode.endswith("truncate"):
        return weights.clamp(min=low, max=high)
    outside = torch.zeros_like(weights, dtype=torch.bool)
    if low is not None:
        outside |= weights < low
    if high is not None:
        outside |= weights > high
    return weights.masked_fill(outside, 0.0)

def ppo_objective(logp, old_logp, ref_logp, advantages, valid, cfg, sampler_logp=None, entropy=None):
    # The objective of every token, (B, L): the policy term of loss_type less the KL penalty. An ignored token comes in
    # with log-probs of 0, so its ratio is 1 and its KL 0 (valid says which tokens are not ignored). The ratio, the
    # clipped ratio and the KL come back too, for logging
    ratio = torch.exp(logp - old_logp) # (B, L)
    if cfg.importance_sampling_level == "sequence":
        # GSPO: one ratio per sample, exp of the mean of its tokens' log-ratios, on every one of its tokens
        ratio = torch.where(valid, sample_mean(logp - old_logp, valid).exp(), ratio) # (B, L)
    advantages = advantages.unsqueeze(-1)
    if cfg.loss_type == "cispo":
        # CISPO: the ratio, capped and held constant, weighs the log-prob itself (the cap is 5 when none is given)
        clipped_ratio = ratio.clamp(max=5.0 if cfg.clip_eps_high is None else cfg.clip_eps_high) # (B, L)
        pg_obj = clipped_ratio.detach() * advantages * logp # (B, L)
    elif cfg.loss_type == "sapo":
        # SAPO: a soft gate in place of the clip, steeper for a bad sample (temperature neg) than for a good one
        temperature = torch.where(advantages > 0, ratio.new_tensor(cfg.sapo_temperature_pos), ratio.new_tensor(cfg.sapo_temperature_neg)) # (B, 1)
        clipped_ratio = ratio # nothing is clipped
        pg_obj = torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature * advantages # (B, L)
    else:
        # PPO's clip, on the side each sample's advantage pushes its ratio: up to ratio_max for a good sample, down to
        # ratio_min for a bad one, and no further
        ratio_min, ratio_max = cfg.clip_range
        clipped_ratio = torch.where(advantages > 0, ratio.clamp(max=ratio_max), ratio.clamp(min=ratio_min)) # (B, L)
        if cfg.delta is not None:
            # INTELLECT-2: a ratio above delta counts as delta, also where the clip would let a bad sample's through
            clipped_ratio = torch.where(advantages > 0, clipped_ratio.clamp(max=cfg.delta), torch.minimum(clipped_ratio, ratio.clamp(ratio_min, ratio_max).clamp(min=cfg.delta))) # (B, L)
        pg_obj = clipped_ratio * advantages # (B, L)
    # DeepSeek-V3.2: a bad sample whose tokens drifted too far from what sampled them (the sampler's log-probs, or
    # pi_old's without them) is left out of the policy term
    if cfg.off_policy_mask_threshold is not None:
        behaviour_logp = old_logp if sampler_logp is None else sampler_logp
        drift = sample_mean(behaviour_logp - logp.detach(), valid) # (B, 1)
        pg_obj = pg_obj * ((advantages >= 0) | (drift <= cfg.off_policy_mask_threshold))
    # Only the tokens of highest entropy carry the policy gradient, when top_entropy_quantile asks for it
    if cfg.top_entropy_quantile < 1.0 and entropy is not None:
        pg_obj = pg_obj * high_entropy_tokens(entropy, valid, cfg.top_entropy_quantile)
    # Importance sampling, for a sampler that is not exactly pi_old (another engine, another precision). It takes a cap
    # (is_cap) or a mode (rollout_is_mode), and the log-probs the sampler drew each token with; without, no correction
    use_importance_weights = (cfg.is_cap is not None or cfg.rollout_is_mode is not None) and sampler_logp is not None
    if use_importance_weights:
        pg_obj = pg_obj * importance_weights(old_logp, sampler_logp, cfg)
    # The KL penalty, against the reference model; DeepSeek-V3.2 weighs it by the ratio
    kl = kl_penalty(logp, ref_logp) # (B, L)
    if cfg.use_bias_correction_kl:
        kl = kl * ratio
    return pg_obj - cfg.beta * kl, ratio, clipped_ratio, kl

def normalize(pg_obj, valid, cfg, num_samples, num_passes, num_tokens):
    # One pass's share of the batch's objective, as loss_type says: the batch has num_samples samples holding num_tokens
    # valid tokens, and goes through the model in num_passes passes. The token-level normalization of each pass that
    # is often called DAPO-style is bnpo here; dapo counts the valid tokens of the whole batch
    if cfg.loss_type in ("grpo", "sapo"): # DeepSeekMath: each sample's mean over its own tokens, then the mean over samples
        return ((pg_obj * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1)).sum() / num_samples
    pg_obj = (pg_obj * valid).sum()
    if cfg.loss_type == "bnpo": # the mean over the valid tokens of each pass, averaged over the passes
        return pg_obj / (valid.sum().clamp(min=1) * num_passes)
    if cfg.loss_type == "dr_grpo": # Dr. GRPO: a constant, as if every sample were max_new_tokens long
        return pg_obj / (num_samples * cfg.max_new_tokens)
    return pg_obj / num_tokens # dapo and cispo: the mean over the valid tokens of the whole batch

def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg, *, num_tokens=None, sampler_logp=None, entropies=None):
    # The loss of one pass over a whole batch. The positions under the mask are ignored targets: their log-probs are 0
    valid = completion_mask > 0 # (N, T)
    logp, old_logp, ref_logp = logp.clone(), old_logp.clone(), ref_logp.clone() # clone to avoid in-place modification:
    logp[~valid], old_logp[~valid], ref_logp[~valid] = 0.0, 0.0, 0.0 # <-- inplace modification right here
    if sampler_logp is not None:
        sampler_logp = sampler_logp.clone()
        sampler_logp[~valid] = 0.0
    if entropies is not None:
        entropies = entropies.masked_fill(~valid, 0.0)
    pg_obj, _, _, _ = ppo_objective(logp, old_logp, ref_logp, advantages, valid, cfg, sampler_logp, entropies)
    num_tokens = valid.sum().clamp(min=1) if num_tokens is None else num_tokens
    # Finally, formulate the loss that we want to minimize (instead of objective we wish to maximize)
    return -normalize(pg_obj, valid, cfg, valid.size(0), 1, num_tokens)

# -----------------------------------------------------------------------------
# One update on one batch of rollouts

def grpo_step(model, ref_model, optimizer, rollout, rewards, cfg):
    # The rows are trained on their sampled tokens only: not the prompt, not the pad forced after the eos
    mask_ids = F.pad(rollout.completion_mask, (rollout.prompt_len, 0)) # (N, P+T)
    inputs_all, targets_all = get_inputs_targets(rollout.input_ids, mask_ids) # (N, P+T-1) each
    attention_mask_all = rollout.attention_mask[:, :-1] # (N, P+T-1)
    # The sampler's log-probs line up with the targets, and are 0 where those are ignored, as the model's will be
    sampler_logp_all = None
    if rollout.sampler_logp is not None:
        sampler_logp_all = F.pad(rollout.sampler_logp, (rollout.prompt_len - 1, 0)).masked_fill(targets_all < 0, 0.0)
    num_rows = inputs_all.size(0)

    # Calculate the advantages: each sample's reward against the other samples of its prompt
    advantages_all = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_rewards) # (N,)

    # Count the valid tokens of this rank (for logging), then of all ranks (for dapo, which needs the total; the
    # division by the world size undoes DDP's averaging of the gradients)
    ddp, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    num_valid = (targets_all >= 0).sum()
    num_completion_tokens = num_valid.clamp(min=1).item()
    if ddp: # aggregate across ranks
        dist.all_reduce(num_valid, op=dist.ReduceOp.SUM)
    num_tokens = num_valid.clamp(min=1) / ddp_world_size

    # The rows go through the model in grad_accum_steps passes, the first num_rows % num_passes of them one row longer
    num_passes = cfg.grad_accum_steps
    pass_rows = [num_rows // num_passes + (pass_idx < num_rows % num_passes) for pass_idx in range(num_passes)]

    # The log-probs of pi_old, which the first iteration records, and of the reference model
    logp_dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32) # as get_logp computes them
    old_logp_all = torch.zeros_like(targets_all, dtype=logp_dtype) # (N, P+T-1)
    ref_logp_all = torch.zeros_like(targets_all, dtype=logp_dtype)

    # For logging: one number per iteration
    losses, kls, ratio_devs, clip_fracs, grad_norms = [], [], [], [], []
    model.zero_grad(set_to_none=True) # whatever gradients the caller left behind
    for iteration in range(cfg.num_iterations):
        loss_sum, kl_sum, clipped_count, ratio_dev = 0.0, 0.0, 0, 0.0
        b1 = 0
        for pass_idx in range(num_passes):
            # Pluck out the batch for this pass (a batch with fewer rows than passes leaves the last passes empty)
            b0, b1 = b1, b1 + pass_rows[pass_idx]
            if b0 == b1:
                continue
            inputs = inputs_all[b0:b1]
            targets = targets_all[b0:b1]
            attention_mask = attention_mask_all[b0:b1]
            advantages = advantages_all[b0:b1]
            # Calculate log probabilities, and the entropies where only the high-entropy tokens carry the gradient
            if cfg.top_entropy_quantile < 1.0:
                logp, entropy = get_logp(model, inputs, targets, attention_mask, cfg.temperature, entropy=True) # (B, L) each
            else:
                logp, entropy = get_logp(model, inputs, targets, attention_mask, cfg.temperature), None # (B, L)
            if iteration == 0:
                # We are on policy in the first iteration: these are the log-probs of pi_old, which the later iterations
                # take their ratio against. The reference model scores the same tokens, once
                old_logp_all[b0:b1] = logp.detach()
                with torch.no_grad():
                    ref_logp_all[b0:b1] = get_logp(ref_model, inputs, targets, attention_mask, cfg.temperature)
            old_logp, ref_logp = old_logp_all[b0:b1], ref_logp_all[b0:b1]
            # Calculate the PG objective of every token. Note that ignore_index=-1 gives the invalid tokens log-probs of 0,
            # so they have a ratio of 1 and a KL of 0: normalize counts the valid ones only
            sampler_logp = None if sampler_logp_all is None else sampler_logp_all[b0:b1]
            pg_obj, ratio, clipped_ratio, kl = ppo_objective(logp, old_logp, ref_logp, advantages, targets >= 0, cfg, sampler_logp, entropy)
            # normalize by the samples, the valid tokens and the passes of the batch, as loss_type says
            pg_obj = normalize(pg_obj, targets >= 0, cfg, num_rows, num_passes, num_tokens)
            # Finally, formulate the loss that we want to minimize (instead of objective we wish to maximize)
            loss = -pg_obj
            loss.backward()
            # For logging: the KL, how far the ratio is from 1, and the tokens whose push the clip held back (the clip
            # moved their ratio against their advantage). An ignored token has a ratio of 1 and a KL of 0
            with torch.no_grad():
                clipped = (clipped_ratio - ratio) * advantages.unsqueeze(-1) < 0
                if cfg.loss_type == "cispo": # the tokens whose weight the cap held down, whatever their advantage
                    clipped = (clipped_ratio < ratio) & (targets >= 0)
                loss_sum += loss.item()
                kl_sum += kl.sum().item()
                clipped_count += clipped.sum().item()
                ratio_dev = max(ratio_dev, (ratio - 1).abs().max().item())
        # Clip the gradient norm, keeping the norm before the clip for logging
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        # Update the model parameters
        optimizer.step()
        model.zero_grad(set_to_none=True)
        # For logging
        losses.append(loss_sum)
        kls.append(kl_sum / num_completion_tokens)
        ratio_devs.append(ratio_dev)
        clip_fracs.append(clipped_count / num_completion_tokens)
        grad_norms.append(grad_norm.item())

    # Report loss, KL and ratio from iteration 0, while the model still equals pi_old; clip and grad norm from the final one
    return {"loss": losses[0], "kl": kls[0], "ratio_dev": ratio_devs[0], "clip_frac": clip_fracs[-1], "grad_norm": grad_norms[-1],
            "adv_std": advantages_all.std().item(), "completion_len": (targets_all >= 0).sum(dim=1).float().mean().item()}

# -----------------------------------------------------------------------------
# Training loop

def print_step(stats):
    print0(f"Step {stats['step']} | Average reward: {stats['reward_mean']:.4f} | KL: {stats['kl']:.4f} | loss: {stats['loss']:.6f} | Average sequence length: {stats['completion_len']:.2f} | dt: {stats['dt'] * 1000:.0f}ms", flush=True)

def train(policy, task, cfg, *, steps, batch_size, seed, log=print_step):
    ddp, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    master_process = ddp_rank == 0 # this process will do the logging
    device = next(policy.parameters()).device
    torch.manual_seed(seed)
    if master_process:
        print(f"Sequences per step: {batch_size} prompts x {cfg.group_size} samples" + (f" on each of {ddp_world_size} ranks" if ddp else ""))

    # The reference model for the KL penalty
    ref_policy = copy.deepcopy(policy).eval().requires_grad_(False)
    # The model that takes the update: in DDP when data parallel
    model = DDP(policy) if ddp else policy
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)

    @torch.no_grad()
    def get_batch():
        # The random streams for the prompts and for the sampling
        prompt_generator = torch.Generator().manual_seed(seed + ddp_rank)
        sampling_generator = torch.Generator(device=device).manual_seed(seed + ddp_rank)
        while True:
            prompt_ids, prompt_mask = task.sample_prompts(batch_size, prompt_generator) # (B, P)
            # Sample group_size completions of every prompt, with the current policy
            rollout = generate(policy, prompt_ids.to(device), prompt_mask.to(device), cfg, eos_id=task.eos_id, pad_id=task.pad_id, generator=sampling_generator)
            # Calculate the rewards for each sample
            rewards = task.reward(rollout).to(device) # (N,)
            yield rollout, rewards

    # Kick off the training loop
    batch_iterator = get_batch()
    history = []
    for step in range(1, steps + 1):
        t0 = time.time()
        rollout, rewards = next(batch_iterator)
        stats = grpo_step(model, ref_policy, optimizer, rollout, rewards, cfg)
        stats.update(step=step, reward_mean=rewards.mean().item(), reward_max=rewards.max().item(), dt=time.time() - t0)
        history.append(stats)
        log(stats)
    return history


if __name__ == "__main__":
    import argparse
    from lab import ModelConfig, TinyLM, make_task

    # CLI arguments
    parser = argparse.ArgumentParser(description="GRPO on a toy task")
    # Runtime
    parser.add_argument("--device-type", type=str, default="", choices=["", "cuda", "cpu", "mps"], help="cuda|cpu|mps (empty = autodetect)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the model, the prompts and the samples")
    parser.add_argument("--dtype", type=str, default="float64", choices=["float64", "float32"], help="float64 (the same numbers on every CPU) | float32 (faster)")
    # Task and training horizon
    parser.add_argument("--task", type=str, default="sum", choices=["sum", "copy"], help="sum|copy")
    parser.add_argument("--steps", type=int, default=40, help="number of optimization steps")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per step on each rank")
    # Sampling
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    # Optimization
    parser.add_argument("--num-iterations", type=int, default=2, help="iterations on each batch of rollouts (mu)")
    parser.add_argument("--loss-type", type=str, default="grpo", choices=["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"], help="grpo|bnpo|dr_grpo|dapo|cispo|sapo")
    parser.add_argument("--scale-rewards", type=str, default="group", choices=["group", "batch", "none"], help="group|batch|none")
    parser.add_argument("--clip-eps-high", type=float, default=None, help="DAPO's clip-higher: how far above 1 the ratio may go (for cispo: its cap)")
    parser.add_argument("--grad-accum-steps", type=int, default=1, help="passes through the model per optimizer step")
    parser.add_argument("--importance-sampling-level", type=str, default="token", choices=["token", "sequence"], help="token|sequence (GSPO)")
    parser.add_argument("--delta", type=float, default=None, help="INTELLECT-2's delta, above 1 (none by default)")
    parser.add_argument("--top-entropy-quantile", type=float, default=1.0, help="share of tokens, by entropy, that carry the policy gradient")
    parser.add_argument("--mask-truncated-completions", action="store_true", help="leave the samples that never produced their eos out of the loss")
    # Off-policy corrections
    parser.add_argument("--is-cap", type=float, default=None, help="cap on the importance weights of an off-policy sampler")
    parser.add_argument("--rollout-is-mode", type=str, default=None, choices=["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"], help="token_truncate|token_mask|sequence_truncate|sequence_mask")
    parser.add_argument("--rollout-is-clip-min", type=float, default=None, help="lower bound of those importance weights")
    parser.add_argument("--rollout-is-clip-max", type=float, default=3.0, help="upper bound of those importance weights")
    parser.add_argument("--use-bias-correction-kl", action="store_true", help="weigh the KL penalty by the ratio (DeepSeek-V3.2)")
    parser.add_argument("--off-policy-mask-threshold", type=float, default=None, help="drop bad samples that drifted further than this (DeepSeek-V3.2)")
    args = parser.parse_args()
    if min(args.steps, args.batch_size, args.num_iterations, args.grad_accum_steps) < 1:
        parser.error("--steps, --batch-size, --num-iterations and --grad-accum-steps must be at least 1")
    try:
        cfg = GRPOConfig(group_size=args.group_size, temperature=args.temperature, num_iterations=args.num_iterations,
                         loss_type=args.loss_type, scale_rewards=args.scale_rewards, clip_eps_high=args.clip_eps_high,
                         grad_accum_steps=args.grad_accum_steps, importance_sampling_level=args.importance_sampling_level,
                         delta=args.delta, top_entropy_quantile=args.top_entropy_quantile,
                         mask_truncated_completions=args.mask_truncated_completions, is_cap=args.is_cap,
                         rollout_is_mode=args.rollout_is_mode, rollout_is_clip_min=args.rollout_is_clip_min,
                         rollout_is_clip_max=args.rollout_is_clip_max, use_bias_correction_kl=args.use_bias_correction_kl,
                         off_policy_mask_threshold=args.off_policy_mask_threshold)
    except ValueError as e:
        parser.error(str(e))

    # Init compute
    device_type = autodetect_device_type() if args.device_type == "" else args.device_type
    if device_type == "cuda" and not torch.cuda.is_available() or device_type == "mps" and not torch.backends.mps.is_available():
        parser.error(f"--device-type={device_type}, but torch sees no such device")
    ddp, ddp_rank, ddp_local_rank, ddp_world_size, device = compute_init(device_type)
    master_process = ddp_rank == 0 # this process will do the logging

    # Init the model (the same weights on every rank) and the task
    torch.manual_seed(args.seed)
    model = TinyLM(ModelConfig(), dtype=getattr(torch, args.dtype)).to(device)
    history = train(model, make_task(args.task), cfg, steps=args.steps, batch_size=args.batch_size, seed=args.seed)
    if master_process:
        first, last = history[:5], history[-5:]
        print(f"Average reward: {sum(s['reward_mean'] for s in first) / len(first):.4f} -> {sum(s['reward_mean'] for s in last) / len(last):.4f}")
    compute_cleanup()
