"""
Core algorithms of PPO-style GRPO over a batch of rollouts, the worker that runs each stage of a step, and the
trainer that drives them.

The batch is a DataProto: `batch` holds tensors with one row per response, `non_tensor_batch` the prompt uid of
each response, `meta_info` what is the same for every row. PPOTrainer.fit runs, for each batch of prompts from
its dataloader, the stages in order:

    generate_sequences -> reward -> compute_log_prob (old) -> compute_ref_log_prob -> compute_advantage
    -> update_actor

The score of a response sits on its last valid token (token_level_scores, (bs, response_length)); advantages
are grouped by prompt uid and broadcast over the response tokens. The actor update splits the batch into
mini-batches (here one: one optimizer step per epoch) and each mini-batch into micro-batches whose losses are
normalized by the whole mini-batch, over all data-parallel ranks, so that they add up to its loss.
"""

import copy
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class GRPOConfig:
    # rollout
    group_size: int = 8  # rollout.n
    max_new_tokens: int = 8  # rollout.response_length
    temperature: float = 1.0  # rollout.temperature
    # actor
    lr: float = 3e-3  # actor.optim.lr
    max_grad_norm: float = 1.0  # actor.grad_clip
    num_iterations: int = 1  # actor.ppo_epochs
    grad_accum_steps: int = 1  # micro-batches per mini-batch
    clip_eps: float = 0.2  # actor.clip_ratio_low
    clip_eps_high: Optional[float] = None  # actor.clip_ratio_high, None -> clip_eps
    loss_type: str = "grpo"  # actor.loss_agg_mode, see LOSS_AGG_MODE; cispo and sapo: actor.policy_loss.loss_mode
    beta: float = 0.04  # actor.kl_loss_coef
    is_cap: Optional[float] = None  # algorithm.rollout_is_threshold, None -> no rollout correction
    importance_sampling_level: str = "token"  # "sequence": actor.policy_loss.loss_mode=gspo
    sapo_temperature_pos: float = 1.0  # actor.policy_loss.tau_pos
    sapo_temperature_neg: float = 1.05  # actor.policy_loss.tau_neg
    delta: Optional[float] = None  # upper bound of the unclipped ratio (two-sided clip), None -> none
    top_entropy_quantile: float = 1.0  # share of the tokens, by entropy, in the policy loss
    mask_truncated_completions: bool = False  # drop the responses cut at response_length from the loss
    use_bias_correction_kl: bool = False  # kl loss weighed by the importance ratio
    off_policy_mask_threshold: Optional[float] = None  # off-policy sequence mask, None -> off
    # algorithm
    adv_eps: float = 1e-4
    scale_rewards: str = "group"  # group | batch | none
    rollout_is_mode: Optional[str] = None  # algorithm.rollout_correction: {token,sequence}_{truncate,mask}
    rollout_is_clip_min: Optional[float] = None  # algorithm.rollout_correction.rollout_is_threshold_lower
    rollout_is_clip_max: Optional[float] = 3.0  # algorithm.rollout_correction.rollout_is_threshold

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
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(f"Invalid importance_sampling_level: {self.importance_sampling_level}")
        if self.sapo_temperature_pos <= 0 or self.sapo_temperature_neg <= 0:
            raise ValueError(f"sapo temperatures must be > 0, got {self.sapo_temperature_pos}, "
                             f"{self.sapo_temperature_neg}")
        if self.delta is not None and self.delta <= 1:
            raise ValueError(f"delta must be > 1, got {self.delta}")
        if not 0 <= self.top_entropy_quantile <= 1:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile}")
        if not isinstance(self.mask_truncated_completions, bool) or not isinstance(self.use_bias_correction_kl, bool):
            raise ValueError("mask_truncated_completions and use_bias_correction_kl must be bools")
        if self.rollout_is_mode not in (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
            raise ValueError(f"Invalid rollout_is_mode: {self.rollout_is_mode}")
        if self.is_cap is not None and self.rollout_is_mode is not None:
            raise ValueError("is_cap is rollout_is_mode=token_truncate with rollout_is_clip_max=is_cap: set one")
        lower, upper = self.rollout_is_clip_min, self.rollout_is_clip_max
        if lower is not None and upper is not None and lower >= upper:
            raise ValueError(f"rollout_is_clip_min must be < rollout_is_clip_max, got {lower} and {upper}")
        if self.rollout_is_mode is not None and lower is None and upper is None:
            raise ValueError(f"rollout_is_mode={self.rollout_is_mode} needs rollout_is_clip_min or rollout_is_clip_max")
        if self.off_policy_mask_threshold is not None and self.off_policy_mask_threshold <= 0:
            raise ValueError(f"off_policy_mask_threshold must be > 0, got {self.off_policy_mask_threshold}")


# loss_type -> the loss_agg_mode of agg_loss. bnpo and dapo are both token-mean, told apart by the token count that
# global_batch_info passes: dapo divides by the mini-batch's tokens over every rank, bnpo by each micro-batch's own
LOSS_AGG_MODE = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "sapo": "seq-mean-token-mean",
}


@dataclass
class Rollout:
    input_ids: torch.Tensor  # (bs, prompt_length + response_length)
    attention_mask: torch.Tensor  # (bs, prompt_length + response_length)
    completion_mask: torch.Tensor  # response_mask, (bs, response_length)
    prompt_len: int
    sampler_logp: Optional[torch.Tensor] = None  # rollout_log_probs, (bs, response_length)


@dataclass
class DataProto:
    batch: dict  # name -> (bs, ...) tensor
    non_tensor_batch: dict = field(default_factory=dict)  # name -> list of bs items
    meta_info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return next(iter(self.batch.values())).shape[0]

    def repeat(self, repeat_times: int) -> "DataProto":
        """Repeat the batch data a specified number of times."""
        repeated_tensors = {key: tensor.repeat_interleave(repeat_times, dim=0) for key, tensor in self.batch.items()}
        return DataProto(repeated_tensors, meta_info=self.meta_info)

    def chunk(self, chunks: int) -> list:
        """Split along dim 0 into `chunks` pieces of consecutive rows, as equal as can be (torch.tensor_split);
        empty pieces are dropped."""
        pieces = []
        for rows in torch.arange(len(self)).tensor_split(chunks):
            if len(rows) == 0:
                continue
            s = slice(int(rows[0]), int(rows[-1]) + 1)
            pieces.append(DataProto({key: tensor[s] for key, tensor in self.batch.items()},
                                    {key: val[s] for key, val in self.non_tensor_batch.items()}, self.meta_info))
        return pieces

    def union(self, other: "DataProto") -> "DataProto":
        """Add other's tensors, non-tensors and meta_info, of the same rows, to this batch."""
        self.batch.update(other.batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask) / (mask.sum() + 1e-8)


# ---------------------------------------------------------------------------------------------------------------
# rollout


def get_response_mask(response_id: torch.Tensor, eos_token: int, dtype=torch.int64) -> torch.Tensor:
    """response_id: (bs, response_length) -> response_mask: (bs, response_length)"""
    eos_mask = torch.isin(response_id, torch.tensor([eos_token], device=response_id.device)).int()
    return (eos_mask.cumsum(dim=1) - eos_mask).eq(0).to(dtype)


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    return get_response_mask(completion_ids, eos_token=eos_id, dtype=torch.float32)


def pad_2d_list_to_length(response: list, pad_token_id, max_length: Optional[int] = None,
                          dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Pad a 2D list (e.g. responses, logprobs) to a 2D tensor."""
    response_length = max(len(sub_list) for sub_list in response)
    target_length = max_length if max_length is not None and max_length > response_length else response_length
    padded_response = [tuple(sub_list) + (pad_token_id,) * (target_length - len(sub_list)) for sub_list in response]
    return torch.tensor(padded_response, dtype=dtype)


@torch.no_grad()
def generate_sequences(actor_module, prompts: DataProto, cfg: GRPOConfig, eos_token_id: int, pad_token_id: int,
                       generator=None) -> DataProto:
    """Sample one response per row of prompts (left-padded input_ids and attention_mask), each until its
    eos_token_id or max_new_tokens, with the log-prob the sampler gave each token. Every running sequence takes a
    token per forward pass; a token is drawn by the exponential race (argmax of probs / Exp(1) noise)."""
    idx = prompts.batch["input_ids"]  # (bs, prompt_length)
    attention_mask = prompts.batch["attention_mask"]
    batch_size = idx.size(0)
    try:
        kv_cache = actor_module.make_cache()  # use_cache=True
    except AttributeError:
        kv_cache = None

    response = [[] for _ in range(batch_size)]
    rollout_log_probs = [[] for _ in range(batch_size)]
    running = list(range(batch_size))  # the sequences still sampling
    seq, seq_mask, step_ids = idx, attention_mask, idx
    for _ in range(cfg.max_new_tokens):
        if kv_cache is None:
            logits = actor_module(seq, seq_mask)[:, -1, :]  # (bs, vocab_size)
        else:
            logits = actor_module(step_ids, seq_mask, cache=kv_cache)[:, -1, :]
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        logits.div_(cfg.temperature)
        logprobs = logits.log_softmax(dim=-1)
        probs = logprobs.exp()
        q = torch.empty_like(probs).exponential_(1.0, generator=generator)
        next_token = probs.div(q).argmax(dim=-1)  # (bs,)
        next_logprob = logprobs.gather(-1, next_token.unsqueeze(-1)).squeeze(-1)
        tokens, token_log_probs = next_token.tolist(), next_logprob.tolist()
        for i in running:
            response[i].append(tokens[i])
            rollout_log_probs[i].append(token_log_probs[i])
        running = [i for i in running if response[i][-1] != eos_token_id]
        if not running:
            break
        step_ids = next_token.unsqueeze(-1)
        seq = torch.cat([seq, step_ids], dim=-1)
        seq_mask = torch.cat([seq_mask, torch.ones_like(step_ids)], dim=-1)

    response = pad_2d_list_to_length(response, pad_token_id).to(idx.device)  # (bs, response_length)
    rollout_log_probs = pad_2d_list_to_length(rollout_log_probs, 0.0, dtype=logprobs.dtype).to(idx.device)
    response_attention_mask = get_response_mask(response_id=response, eos_token=eos_token_id,
                                                dtype=attention_mask.dtype)
    return DataProto(batch={
        "prompts": idx,
        "responses": response,
        "input_ids": torch.cat([idx, response], dim=-1),
        "attention_mask": torch.cat((attention_mask, response_attention_mask), dim=-1),
        "rollout_log_probs": rollout_log_probs,
    })


def compute_response_mask(data: DataProto, mask_truncated_completions: bool = False,
                          eos_token_id: Optional[int] = None) -> torch.Tensor:
    """The attention mask of the response part of the sequence, (bs, response_length): the tokens that the loss
    and every per-token computation apply to. With mask_truncated_completions, a response cut at response_length
    has none."""
    responses = data.batch["responses"]
    response_length = responses.size(1)
    attention_mask = data.batch["attention_mask"]
    response_mask = attention_mask[:, -response_length:]
    if mask_truncated_completions:
        is_truncated = responses[:, -1] != eos_token_id  # (bs,)
        response_mask = response_mask * (~is_truncated).unsqueeze(-1).to(response_mask.dtype)
    return response_mask


def generate(policy, prompt_ids, prompt_mask, cfg: GRPOConfig, *, eos_id: int, pad_id: int, generator=None) -> Rollout:
    prompts = DataProto(batch={"input_ids": prompt_ids, "attention_mask": prompt_mask})
    output = generate_sequences(policy, prompts.repeat(repeat_times=cfg.group_size), cfg, eos_token_id=eos_id,
                                pad_token_id=pad_id, generator=generator)
    return Rollout(input_ids=output.batch["input_ids"], attention_mask=output.batch["attention_mask"],
                   completion_mask=compute_response_mask(output, cfg.mask_truncated_completions, eos_id),
                   prompt_len=prompt_ids.shape[1],
                   sampler_logp=output.batch["rollout_log_probs"])


# ---------------------------------------------------------------------------------------------------------------
# reward and advantage


def assign_uid(batch_size: int, n: int) -> list:
    """The uid of each of the batch_size responses, n of them to a prompt."""
    uid = [str(uuid.uuid4()) for _ in range(batch_size // n)]
    return [u for u in uid for _ in range(n)]


def compute_token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """scores (bs,), one per response -> (bs, response_length), each on the last valid token of its response."""
    reward_tensor = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    valid_response_length = response_mask.sum(dim=-1).long()
    reward_tensor[torch.arange(len(scores), device=scores.device), valid_response_length - 1] = scores
    return reward_tensor


def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: list,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                   std_from_batch: bool = False) -> tuple:
    """
    Compute advantage for GRPO, operating only on Outcome reward
    (with only one scalar reward for each response).

    Args:
        token_level_rewards: `(torch.Tensor)`
            shape is (bs, response_length)
        response_mask: `(torch.Tensor)`
            shape is (bs, response_length)
        index: `(list)`
            prompt uid of each response, for grouping
        epsilon: `(float)`
            small value to avoid division by zero
        norm_adv_by_std_in_grpo: `(bool)`
            whether to scale the GRPO advantage
        std_from_batch: `(bool)`
            scale by the std of the whole batch instead of each group's (the group means stay)

    Note:
        If norm_adv_by_std_in_grpo is True, the advantage is scaled by the std, as in the original GRPO.
        If False, the advantage is not scaled, as in Dr.GRPO (https://arxiv.org/abs/2503.20783).

    Returns:
        advantages: `(torch.Tensor)`
            shape is (bs, response_length)
        Returns: `(torch.Tensor)`
            shape is (bs, response_length)
    """
    scores = token_level_rewards.sum(dim=-1)

    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        if std_from_batch:
            id2std = dict.fromkeys(id2std, torch.std(scores))
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float, scale: str = "group") -> torch.Tensor:
    token_level_rewards = rewards.unsqueeze(-1)  # (bs, 1): each score on a response of one token
    advantages, _ = compute_grpo_outcome_advantage(token_level_rewards, torch.ones_like(token_level_rewards),
                                                   assign_uid(len(rewards), group_size), epsilon=eps,
                                                   norm_adv_by_std_in_grpo=scale in ("group", "batch"),
                                                   std_from_batch=scale == "batch")
    return advantages.squeeze(-1)


def compute_advantage(data: DataProto, cfg: GRPOConfig) -> DataProto:
    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        epsilon=cfg.adv_eps,
        norm_adv_by_std_in_grpo=cfg.scale_rewards in ("group", "batch"),
        std_from_batch=cfg.scale_rewards == "batch",
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


# ---------------------------------------------------------------------------------------------------------------
# log prob


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Calculate entropy from logits."""
    pd = torch.nn.functional.softmax(logits, dim=-1)
    entropy = torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)
    return entropy


def forward_micro_batch(actor_module, micro_batch: dict, temperature: float, calculate_entropy: bool = False):
    """log_probs of the responses, (bs, response_length), fp32 (fp64 for an fp64 actor); with calculate_entropy,
    (entropy, log_probs), the entropy of each response token's distribution without gradient."""
    response_length = micro_batch["responses"].size(-1)
    logits = actor_module(micro_batch["input_ids"], micro_batch["attention_mask"])  # (bs, seqlen, vocab)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    logits.div_(temperature)
    logits = logits[:, -response_length - 1 : -1, :]  # (bs, response_length, vocab_size)
    log_probs = logprobs_from_logits(logits, micro_batch["responses"])
    if calculate_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits)  # (bs, response_length)
        return entropy, log_probs
    return log_probs


def token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    micro_batch = {"input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, prompt_len:]}
    return forward_micro_batch(model, micro_batch, temperature)


def token_entropies(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    micro_batch = {"input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, prompt_len:]}
    entropy, _ = forward_micro_batch(model, micro_batch, temperature, calculate_entropy=True)
    return entropy


def compute_log_prob(actor_module, data: DataProto, cfg: GRPOConfig) -> torch.Tensor:
    """log_probs of the responses under actor_module, (bs, response_length), in the micro-batches of the update."""
    actor_module.eval()
    temperature = data.meta_info["temperature"]
    log_probs_lst = []
    for micro_batch in data.chunk(cfg.grad_accum_steps):
        with torch.no_grad():
            log_probs_lst.append(forward_micro_batch(actor_module, micro_batch.batch, temperature))
    return torch.concat(log_probs_lst, dim=0)


# ---------------------------------------------------------------------------------------------------------------
# kl / loss


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "k3") -> torch.Tensor:
    """Compute KL divergence given logprob and ref_logprob.
    See more description in http://joschu.net/blog/kl-approx.html

    kl_penalty: "kl" / "k1", "abs", "mse" / "k2", "k3", or "low_var_kl" (k3 clamped to [-10, 10] for numerical
        stability; "k3" is not an alias of it here, but the estimate unclamped)
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob

    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()

    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()

    if kl_penalty in ("k3", "low_var_kl"):
        kl = ref_logprob - logprob
        # For numerical stability
        kl = torch.clamp(kl, min=-20, max=20)
        kld = torch.exp(kl) - kl - 1
        if kl_penalty == "low_var_kl":
            return torch.clamp(kld, min=-10, max=10)
        return kld

    raise NotImplementedError(f"kl_penalty {kl_penalty}")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, dp_size: int = 1,
             batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None) -> torch.Tensor:
    """
    Aggregate the loss across global batch to ensure the loss is invariant to data parallelism.

    Args:
        loss_mat: micro batch loss matrix, (bs, response_length)
        loss_mask: micro batch loss mask, (bs, response_length)
        loss_agg_mode: method to aggregate the loss matrix into a scalar
        dp_size: data parallel size
        batch_num_tokens: number of valid tokens in global batch
        global_batch_size: global batch size
        loss_scale_factor: scale factor for "seq-mean-token-sum-norm" mode. If None, uses loss_mask.shape[-1].
            Set this to a constant value to ensure consistent normalization throughout training.

    Returns:
        loss: `a scalar torch.Tensor`
            aggregated loss
    """
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        loss = torch.sum(seq_losses) / loss_scale_factor
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")

    return loss


def clipped_policy_loss(ratio, negative_approx_kl, advantages, response_mask, loss_agg_mode, config: GRPOConfig,
                        rollout_is_weights, global_batch_info: dict) -> tuple:
    """The clipped policy objective of PPO on an importance ratio (bs, response_length), and its metrics; with
    config.delta, the two-sided clip, whose unclipped ratio is bounded by delta too."""
    clip_ratio_low = config.clip_eps
    clip_ratio_high = config.clip_eps_high if config.clip_eps_high is not None else config.clip_eps

    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    if config.delta is not None:
        pg_losses1 = -advantages * torch.clamp(ratio, max=config.delta)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_info)

    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/ppo_ratio_dev": torch.where(response_mask, (ratio - 1).abs(), 0.0).max().item(),
    }
    return pg_loss, pg_metrics


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config: GRPOConfig,
                        rollout_is_weights, global_batch_info: dict) -> tuple:
    """
    Compute the clipped policy objective and related metrics for PPO.

    Args:
        old_log_prob: (bs, response_length)
        log_prob: (bs, response_length)
        advantages: (bs, response_length)
        response_mask: (bs, response_length)
        loss_agg_mode: the aggregation mode of agg_loss
        config: clip_eps (clip_ratio_low) and clip_eps_high (clip_ratio_high) bound the ratio
        rollout_is_weights: (bs, response_length) weights on the policy loss, or None
        global_batch_info: the normalizers agg_loss takes from the global batch
    """
    negative_approx_kl = log_prob - old_log_prob
    # Clamp negative_approx_kl for stability
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    return clipped_policy_loss(ratio, negative_approx_kl, advantages, response_mask, loss_agg_mode, config,
                               rollout_is_weights, global_batch_info)


def compute_sequence_log_ratio(old_log_prob, log_prob, response_mask) -> tuple:
    """(negative_approx_kl, negative_approx_kl_seq): the clamped log-ratio of every token, (bs, response_length), and
    its mean over each response's tokens, (bs,)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = masked_sum(negative_approx_kl, response_mask, axis=-1) / seq_lengths
    return negative_approx_kl, negative_approx_kl_seq


def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config: GRPOConfig,
                             rollout_is_weights, global_batch_info: dict) -> tuple:
    """
    Compute the clipped policy objective and related metrics for GSPO.

    See https://arxiv.org/pdf/2507.18071 for more details. Arguments as compute_policy_loss.
    """
    # compute sequence-level importance ratio:
    # si(θ) = (π_θ(yi|x)/π_θold(yi|x))^(1/|yi|) =
    # exp [(1/|y_i|) * Σ_t log(π_θ(y_i,t|x,y_i,<t)/π_θold(y_i,t|x,y_i,<t))]
    negative_approx_kl, negative_approx_kl_seq = compute_sequence_log_ratio(old_log_prob, log_prob, response_mask)
    seq_importance_ratio = torch.exp(negative_approx_kl_seq).unsqueeze(-1).expand_as(log_prob)
    return clipped_policy_loss(seq_importance_ratio, negative_approx_kl, advantages, response_mask, loss_agg_mode,
                               config, rollout_is_weights, global_batch_info)


def compute_importance_ratio(old_log_prob, log_prob, response_mask, config: GRPOConfig) -> tuple:
    """(negative_approx_kl, ratio) of config.importance_sampling_level: per token, or the sequence's on each of its
    tokens, (bs, response_length) each."""
    if config.importance_sampling_level == "sequence":
        negative_approx_kl, negative_approx_kl_seq = compute_sequence_log_ratio(old_log_prob, log_prob, response_mask)
        return negative_approx_kl, torch.exp(negative_approx_kl_seq).unsqueeze(-1).expand_as(log_prob)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    return negative_approx_kl, torch.exp(negative_approx_kl)


def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config: GRPOConfig,
                              rollout_is_weights, global_batch_info: dict) -> tuple:
    """
    Compute the CISPO policy objective (https://arxiv.org/abs/2506.13585): the importance ratio, clipped at
    clip_ratio_high (ScaleRL's 5.0 when it is None) and without gradient, weighs the log-prob. Arguments as
    compute_policy_loss.
    """
    clip_ratio_high = config.clip_eps_high if config.clip_eps_high is not None else 5.0
    negative_approx_kl, ratio = compute_importance_ratio(old_log_prob, log_prob, response_mask, config)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    clipped_ratio = torch.clamp(ratio, max=clip_ratio_high).detach()
    pg_losses = -advantages * clipped_ratio * torch.where(response_mask, log_prob, 0.0)
    pg_clipfrac = masked_mean(torch.gt(ratio, clip_ratio_high).float(), response_mask)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_info)
    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.item(),
        "actor/ppo_kl": ppo_kl.item(),
        "actor/ppo_ratio_dev": torch.where(response_mask, (ratio - 1).abs(), 0.0).max().item(),
    }
    return pg_loss, pg_metrics


def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config: GRPOConfig,
                             rollout_is_weights, global_batch_info: dict) -> tuple:
    """
    Compute the SAPO policy objective (https://arxiv.org/abs/2511.20347): a soft gate sigmoid(tau (ratio - 1)) 4 / tau
    in place of the clip, tau_pos for a positive advantage and tau_neg otherwise. Arguments as compute_policy_loss.
    """
    negative_approx_kl, ratio = compute_importance_ratio(old_log_prob, log_prob, response_mask, config)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    tau = torch.where(advantages > 0, ratio.new_tensor(config.sapo_temperature_pos),
                      ratio.new_tensor(config.sapo_temperature_neg))
    pg_losses = -advantages * torch.sigmoid(tau * (ratio - 1)) * 4 / tau

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_info)
    pg_metrics = {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": ppo_kl.item(),
        "actor/ppo_ratio_dev": torch.where(response_mask, (ratio - 1).abs(), 0.0).max().item(),
    }
    return pg_loss, pg_metrics


POLICY_LOSS_REGISTRY = {
    "vanilla": compute_policy_loss,
    "gspo": compute_policy_loss_gspo,
    "cispo": compute_policy_loss_cispo,
    "sapo": compute_policy_loss_sapo,
}


def get_policy_loss_fn(config: GRPOConfig):
    """actor.policy_loss.loss_mode of the config: cispo and sapo by loss_type, else gspo at the sequence level and
    vanilla PPO at the token level."""
    if config.loss_type in ("cispo", "sapo"):
        return POLICY_LOSS_REGISTRY[config.loss_type]
    return POLICY_LOSS_REGISTRY["gspo" if config.importance_sampling_level == "sequence" else "vanilla"]


def compute_rollout_rejection_mask(rollout_is_weights, rollout_is_threshold_lower, rollout_is_threshold):
    """1 where the importance weight lies within [rollout_is_threshold_lower, rollout_is_threshold] (a bound that is
    None is none), 0 where the token or the sequence is rejected."""
    keep = torch.ones_like(rollout_is_weights, dtype=torch.bool)
    if rollout_is_threshold_lower is not None:
        keep = keep & (rollout_is_weights >= rollout_is_threshold_lower)
    if rollout_is_threshold is not None:
        keep = keep & (rollout_is_weights <= rollout_is_threshold)
    return keep.to(rollout_is_weights.dtype)


def compute_rollout_is_weights(old_log_prob, rollout_log_prob, response_mask, config: GRPOConfig):
    """Importance weights between the actor and the rollout engine, token by token or one per sequence (the product
    over its tokens), as config.rollout_is_mode asks, (bs, response_length):
    truncated into the thresholds, or zeroed outside them (rejection); is_cap truncates token by token at is_cap."""
    rollout_is_mode = config.rollout_is_mode
    lower, upper = config.rollout_is_clip_min, config.rollout_is_clip_max
    if config.is_cap is not None:
        rollout_is_mode, lower, upper = "token_truncate", None, config.is_cap
    rollout_is, correction = rollout_is_mode.split("_")
    log_ratio = torch.where(response_mask.bool(), old_log_prob - rollout_log_prob, 0.0)
    if rollout_is == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True)  # (bs, 1)
    rollout_is_weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    if correction == "truncate":
        rollout_is_weights = rollout_is_weights.clamp(min=lower, max=upper)
    else:
        rollout_is_weights = rollout_is_weights * compute_rollout_rejection_mask(rollout_is_weights, lower, upper)
    return (rollout_is_weights * response_mask).detach()


def compute_off_policy_mask(log_prob, rollout_log_prob, advantages, response_mask, threshold: float):
    """DeepSeek-V3.2's off-policy sequence mask, (bs, 1): 0 for a response with a negative advantage whose mean
    log-ratio of the rollout policy to the actor (without gradient) is above the threshold, 1 otherwise."""
    seq_lengths = torch.sum(response_mask, dim=-1, keepdim=True).clamp(min=1)
    seq_kl = masked_sum(rollout_log_prob - log_prob.detach(), response_mask, axis=-1).unsqueeze(-1) / seq_lengths
    is_pos_adv = (advantages >= 0).all(dim=-1, keepdim=True)  # advantages are 0 outside the response
    return (is_pos_adv | (seq_kl <= threshold)).to(log_prob.dtype)


def compute_high_entropy_mask(entropy, response_mask, top_entropy_quantile: float):
    """The response tokens whose entropy is at or above a quantile of the entropies of this micro-batch's
    response tokens, (bs, response_length)."""
    if not response_mask.any():
        return response_mask.to(entropy.dtype)
    threshold = torch.quantile(entropy[response_mask], top_entropy_quantile)
    return ((entropy >= threshold) & response_mask).to(entropy.dtype)


def global_batch_info(cfg: GRPOConfig, response_mask, batch_num_tokens=None, dp_size: int = 1) -> dict:
    """What agg_loss divides one micro-batch's loss by, so that the micro-batches of a mini-batch (response_mask,
    this rank's share) add up to its loss: the token and response counts over every data-parallel rank, and for
    seq-mean-token-sum-norm the responses times the response length. bnpo takes none of them: each micro-batch
    is a token mean of its own."""
    if cfg.loss_type == "bnpo":
        return {}
    return {
        "dp_size": dp_size,
        "batch_num_tokens": batch_num_tokens,
        "global_batch_size": len(response_mask) * dp_size,
        "loss_scale_factor": len(response_mask) * cfg.max_new_tokens,
    }


def ppo_loss(config: GRPOConfig, log_prob, old_log_prob, data: dict, global_batch_info: dict, entropy=None) -> tuple:
    """The actor's loss on one micro-batch: the policy loss and the KL loss against the reference policy,
    aggregated by the loss_agg_mode of config.loss_type."""
    response_mask = data["response_mask"].to(bool)
    loss_agg_mode = LOSS_AGG_MODE[config.loss_type]

    rollout_is_weights = None
    if (config.is_cap is not None or config.rollout_is_mode is not None) and data.get("rollout_log_probs") is not None:
        rollout_is_weights = compute_rollout_is_weights(old_log_prob, data["rollout_log_probs"], response_mask,
                                                        config)
    # the off-policy sequence mask and the high-entropy token mask weigh the policy loss as the rollout correction does
    if config.off_policy_mask_threshold is not None:
        rollout_log_prob = data.get("rollout_log_probs")
        if rollout_log_prob is None:  # the actor sampled the batch itself
            rollout_log_prob = old_log_prob
        off_policy_mask = compute_off_policy_mask(log_prob, rollout_log_prob, data["advantages"], response_mask,
                                                  config.off_policy_mask_threshold)
        rollout_is_weights = off_policy_mask if rollout_is_weights is None else rollout_is_weights * off_policy_mask
    if config.top_entropy_quantile < 1.0 and entropy is not None:
        entropy_mask = compute_high_entropy_mask(entropy, response_mask, config.top_entropy_quantile)
        rollout_is_weights = entropy_mask if rollout_is_weights is None else rollout_is_weights * entropy_mask

    policy_loss_fn = get_policy_loss_fn(config)
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=data["advantages"],
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
        global_batch_info=global_batch_info,
    )
    metrics = {"actor/pg_loss": pg_loss.item(), **pg_metrics}
    policy_loss = pg_loss

    kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty="k3")
    if config.use_bias_correction_kl:  # the kl of the samples of pi_old, weighed back to the actor
        ratio = compute_importance_ratio(old_log_prob, log_prob, response_mask, config)[1]
        kld = kld * torch.where(response_mask, ratio, 0.0)
    kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_info)
    policy_loss += kl_loss * config.beta
    metrics["actor/kl"] = masked_mean(kld, response_mask).item()
    return policy_loss, metrics


def grpo_loss(logp, old_logp, ref_logp, advantages, completion_mask, cfg: GRPOConfig, *, num_tokens=None,
              sampler_logp=None, entropies=None) -> torch.Tensor:
    response_mask = completion_mask.bool()
    data = {
        "response_mask": response_mask,
        "old_log_probs": old_logp,
        "ref_log_prob": ref_logp,
        "advantages": advantages.unsqueeze(-1) * response_mask,  # (bs, response_length)
        "rollout_log_probs": sampler_logp,
    }
    batch_info = global_batch_info(cfg, response_mask, num_tokens)
    policy_loss, _ = ppo_loss(cfg, logp, old_logp, data, batch_info, entropies)
    return policy_loss


# ---------------------------------------------------------------------------------------------------------------
# actor


def get_data_parallel_rank() -> int:
    """This process's rank among the data-parallel ranks: 0 when torch.distributed is not initialized."""
    if not torch.distributed.is_initialized():
        return 0
    return torch.distributed.get_rank()


def get_data_parallel_size() -> int:
    """How many data-parallel ranks there are: 1 when torch.distributed is not initialized."""
    if not torch.distributed.is_initialized():
        return 1
    return torch.distributed.get_world_size()


def append_to_dict(data: dict, new_data: dict) -> None:
    for key, val in new_data.items():
        data[key].append(val)


def _optimizer_step(actor_module, actor_optimizer, cfg: GRPOConfig) -> torch.Tensor:
    assert cfg.max_grad_norm is not None
    grad_norm = torch.nn.utils.clip_grad_norm_(actor_module.parameters(), max_norm=cfg.max_grad_norm)

    # if grad_norm is not finite, skip the update
    if not torch.isfinite(grad_norm):
        print(f"WARN: rank {get_data_parallel_rank()} grad_norm is not finite: {grad_norm}")
        actor_optimizer.zero_grad()
    else:
        actor_optimizer.step()
    return grad_norm


def update_policy(actor_module, actor_optimizer, data: DataProto, cfg: GRPOConfig) -> dict:
    actor_module.train()
    temperature = data.meta_info["temperature"]
    dp_size = get_data_parallel_size()

    # one mini-batch, the whole batch (ppo_mini_batch_size is the batch's size here): one optimizer step per epoch
    mini_batches = [data]

    on_policy = cfg.num_iterations == 1

    metrics = defaultdict(list)
    for epoch in range(cfg.num_iterations):
        for mini_batch in mini_batches:
            micro_batches = mini_batch.chunk(cfg.grad_accum_steps)
            response_mask = mini_batch.batch["response_mask"]
            batch_num_tokens = response_mask.sum().float()
            if dp_size > 1:
                torch.distributed.all_reduce(batch_num_tokens, op=torch.distributed.ReduceOp.SUM)
            batch_info = global_batch_info(cfg, response_mask, batch_num_tokens, dp_size)
            # the micro-batch's weight in the mini-batch's loss (agg_loss's loss_scale_factor is another thing, the
            # seq-mean-token-sum-norm divisor): with the global batch's normalizers the micro-batch losses add up;
            # without, they are averaged
            loss_scale_factor = 1.0 if batch_info else 1 / cfg.grad_accum_steps

            mini_batch_metrics = defaultdict(float)
            actor_optimizer.zero_grad()
            for micro_batch in micro_batches:
                entropy = None
                if cfg.top_entropy_quantile < 1.0:
                    entropy, log_prob = forward_micro_batch(actor_module, micro_batch.batch, temperature,
                                                            calculate_entropy=True)
                else:
                    log_prob = forward_micro_batch(actor_module, micro_batch.batch, temperature)
                old_log_prob = log_prob.detach() if on_policy else micro_batch.batch["old_log_probs"]

                policy_loss, micro_batch_metrics = ppo_loss(cfg, log_prob, old_log_prob, micro_batch.batch,
                                                            batch_info, entropy)
                loss = policy_loss * loss_scale_factor
                loss.backward()

                token_share = (micro_batch.batch["response_mask"].sum() / response_mask.sum()).item()
                mini_batch_metrics["actor/loss"] += loss.item()
                mini_batch_metrics["actor/kl"] += micro_batch_metrics["actor/kl"] * token_share
                mini_batch_metrics["actor/pg_clipfrac"] += micro_batch_metrics["actor/pg_clipfrac"] * token_share
                mini_batch_metrics["actor/ppo_ratio_dev"] = max(mini_batch_metrics["actor/ppo_ratio_dev"],
                                                                micro_batch_metrics["actor/ppo_ratio_dev"])

            if epoch == 0:  # pi_old's own loss, kl and ratio: no step has moved the policy yet
                append_to_dict(metrics, {key: mini_batch_metrics[key] for key in
                                         ("actor/loss", "actor/kl", "actor/ppo_ratio_dev")})
            grad_norm = _optimizer_step(actor_module, actor_optimizer, cfg)
            if epoch == cfg.num_iterations - 1:  # the clip fraction and grad norm of the last step
                append_to_dict(metrics, {"actor/pg_clipfrac": mini_batch_metrics["actor/pg_clipfrac"],
                                         "actor/grad_norm": grad_norm.item()})
    actor_optimizer.zero_grad()
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# workers


def reduce_metrics(metrics: dict) -> dict:
    """Reduces a dictionary of metric lists by computing the mean of each list."""
    for key, val in metrics.items():
        metrics[key] = sum(val) / len(val)
    return metrics


def compute_data_metrics(batch: DataProto) -> dict:
    response_length = batch.batch["response_mask"].sum(-1).float()
    return {
        "critic/advantages/std": batch.batch["advantages"][:, 0].std().item(),  # every response holds its first token
        "response_length/mean": torch.mean(response_length).item(),
    }


class HFRollout:
    """Samples from the actor's own weights, with a generator of its own."""

    def __init__(self, module, config: GRPOConfig, generator: torch.Generator):
        self.module = module
        self.config = config
        self.generator = generator

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = generate_sequences(self.module, prompts, self.config, eos_token_id=prompts.meta_info["eos_token_id"],
                                    pad_token_id=prompts.meta_info["pad_token_id"], generator=self.generator)
        output.meta_info = prompts.meta_info
        return output


class ActorRolloutRefWorker:
    """The actor, its rollout and the reference policy of one data-parallel rank. Each method is a stage of the
    dataflow: it takes the batch and returns what the stage adds to it."""

    def __init__(self, config: GRPOConfig, actor_module, actor_optimizer, ref_module, rollout=None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.ref_module = ref_module
        self.rollout = rollout

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return self.rollout.generate_sequences(prompts)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        old_log_probs = compute_log_prob(self.actor_module, data, self.config)
        return DataProto({"old_log_probs": old_log_probs}, meta_info={"temperature": self.config.temperature})

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return DataProto({"ref_log_prob": compute_log_prob(self.ref_module, data, self.config)})

    def update_actor(self, data: DataProto) -> DataProto:
        metrics = update_policy(self.actor_module, self.actor_optimizer, data, self.config)
        return DataProto({}, meta_info={"metrics": metrics})


# ---------------------------------------------------------------------------------------------------------------
# trainer


METRIC_NAMES = {  # what a step reports -> the metric it reads
    "reward_mean": "critic/score/mean",
    "reward_max": "critic/score/max",
    "loss": "actor/loss",
    "kl": "actor/kl",
    "ratio_dev": "actor/ppo_ratio_dev",
    "clip_frac": "actor/pg_clipfrac",
    "grad_norm": "actor/grad_norm",
    "adv_std": "critic/advantages/std",
    "completion_len": "response_length/mean",
}


def print_metrics(data: dict) -> None:
    shown = ("reward_mean", "reward_max", "loss", "kl", "clip_frac", "grad_norm", "completion_len")
    print(f"step:{data['step']} - " + " - ".join(f"{METRIC_NAMES[key]}:{data[key]:.3f}" for key in shown), flush=True)


class Tracking:
    """Keeps each step's metrics under the names a step reports, and hands them to log."""

    def __init__(self, log):
        self.history = []
        self.log_fn = log

    def log(self, data: dict, step: int) -> None:
        self.history.append({"step": step, **{key: data[name] for key, name in METRIC_NAMES.items()}})
        self.log_fn(self.history[-1])


class PromptDataLoader:
    """Batches of prompts drawn from the task by a seeded generator, one per training step."""

    def __init__(self, task, batch_size: int, total_steps: int, generator: torch.Generator):
        self.task = task
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.generator = generator

    def __len__(self) -> int:
        return self.total_steps

    def __iter__(self):
        for _ in range(self.total_steps):
            input_ids, attention_mask = self.task.sample_prompts(self.batch_size, self.generator)
            yield {"input_ids": input_ids, "attention_mask": attention_mask}


def fit_batch(actor_rollout_wg: ActorRolloutRefWorker, batch: DataProto, reward_tensor: torch.Tensor,
              config: GRPOConfig) -> dict:
    """The stages of a step after the reward, on a batch of responses with their prompt uids and the score of each
    (bs,): the actor's and the batch's metrics."""
    batch.batch["token_level_scores"] = compute_token_level_scores(reward_tensor, batch.batch["response_mask"])

    # recompute old_log_probs, and the reference policy's
    batch = batch.union(actor_rollout_wg.compute_log_prob(batch))
    batch = batch.union(actor_rollout_wg.compute_ref_log_prob(batch))

    # compute advantages, executed on the driver process
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch = compute_advantage(batch, config)

    # update actor
    actor_output = actor_rollout_wg.update_actor(batch)
    return {**reduce_metrics(actor_output.meta_info["metrics"]), **compute_data_metrics(batch)}


class PPOTrainer:
    """The driver: it draws the prompts, has the worker run each stage of a step and computes the advantages itself.
    Under torch.distributed each rank runs one, on prompts of its own."""

    def __init__(self, config: GRPOConfig, actor_module, task, logger, *, total_training_steps: int,
                 train_batch_size: int, seed: int):
        self.config = config
        self.actor_module = actor_module
        self.task = task
        self.logger = logger
        self.total_training_steps = total_training_steps
        self.seed = seed
        self.rank, self.world_size = get_data_parallel_rank(), get_data_parallel_size()
        self.device = next(actor_module.parameters()).device
        self._create_dataloader(train_batch_size)

    def _create_dataloader(self, train_batch_size: int) -> None:
        train_dataloader_generator = torch.Generator().manual_seed(self.seed + self.rank)
        self.train_dataloader = PromptDataLoader(self.task, train_batch_size, self.total_training_steps,
                                                 train_dataloader_generator)

    def _build_model_optimizer(self, role: str) -> tuple:
        """(module, optimizer) of a role, from the weights the actor starts with: the actor in
        DistributedDataParallel over the ranks, with its optimizer; the ref a module of its own, with no optimizer
        and no gradient."""
        if role == "ref":
            ref_module = copy.deepcopy(self.actor_module)
            ref_module.requires_grad_(False)
            return ref_module, None
        actor_module = DistributedDataParallel(self.actor_module) if self.world_size > 1 else self.actor_module
        return actor_module, torch.optim.AdamW(self.actor_module.parameters(), lr=self.config.lr)

    def init_workers(self) -> None:
        """The actor and its optimizer, a rollout over the same weights, and the reference policy."""
        torch.manual_seed(self.seed)
        actor_module, actor_optimizer = self._build_model_optimizer(role="actor")
        rollout_generator = torch.Generator(device=self.device).manual_seed(self.seed + self.rank)
        rollout = HFRollout(self.actor_module, self.config, rollout_generator)
        ref_module, _ = self._build_model_optimizer(role="ref")
        self.actor_rollout_wg = ActorRolloutRefWorker(self.config, actor_module, actor_optimizer, ref_module, rollout)

    def _compute_scores(self, batch: DataProto) -> torch.Tensor:
        """The task's score of each response, (bs,)."""
        rollout = Rollout(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                          completion_mask=batch.batch["response_mask"], prompt_len=batch.batch["prompts"].shape[-1],
                          sampler_logp=batch.batch["rollout_log_probs"])
        return self.task.reward(rollout).to(self.device)

    def fit(self) -> None:
        """The training loop: for each batch of prompts, the stages of the dataflow in order, then the step's
        metrics to the logger."""
        self.global_steps = 1
        for batch_dict in self.train_dataloader:
            metrics = {}
            batch = DataProto({key: tensor.to(self.device) for key, tensor in batch_dict.items()}, meta_info={
                "eos_token_id": self.task.eos_id,
                "pad_token_id": self.task.pad_id,
                "temperature": self.config.temperature,
            })

            # generate a batch: rollout.n responses to each prompt, the responses of a prompt sharing its uid
            batch = self.actor_rollout_wg.generate_sequences(batch.repeat(repeat_times=self.config.group_size))
            batch.non_tensor_batch["uid"] = assign_uid(len(batch), self.config.group_size)
            batch.batch["response_mask"] = compute_response_mask(batch, self.config.mask_truncated_completions,
                                                                 self.task.eos_id)

            # reward: the score of each response
            reward_tensor = self._compute_scores(batch)
            metrics.update({"critic/score/mean": reward_tensor.mean().item(),
                            "critic/score/max": reward_tensor.max().item()})
            metrics.update(fit_batch(self.actor_rollout_wg, batch, reward_tensor, self.config))

            self.logger.log(data=metrics, step=self.global_steps)
            self.global_steps += 1


# ---------------------------------------------------------------------------------------------------------------
# entry points


def rollout_to_batch(rollout: Rollout, cfg: GRPOConfig) -> DataProto:
    batch = {
        "input_ids": rollout.input_ids,
        "attention_mask": rollout.attention_mask,
        "responses": rollout.input_ids[:, rollout.prompt_len:],
        "response_mask": rollout.completion_mask,
    }
    if rollout.sampler_logp is not None:
        batch["rollout_log_probs"] = rollout.sampler_logp
    return DataProto(batch, {"uid": assign_uid(len(rollout.input_ids), cfg.group_size)},
                     {"temperature": cfg.temperature})


def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards: torch.Tensor, cfg: GRPOConfig) -> dict:
    """One step's stages after the reward, on a worker over these modules."""
    worker = ActorRolloutRefWorker(cfg, policy, optimizer, ref_policy)
    metrics = fit_batch(worker, rollout_to_batch(rollout, cfg), rewards, cfg)
    return {key: metrics[name] for key, name in METRIC_NAMES.items() if name in metrics}


def run_ppo(config: dict, log=print_metrics) -> list:
    """Build the trainer over the config's model and reward, init its workers, then fit. Returns each step's
    metrics."""
    tracking = Tracking(log)
    actor_rollout_ref = config["actor_rollout_ref"]
    trainer = PPOTrainer(actor_rollout_ref["grpo"], actor_rollout_ref["model"], config["reward_model"], tracking,
                         total_training_steps=config["trainer"]["total_training_steps"],
                         train_batch_size=config["data"]["train_batch_size"], seed=config["data"]["seed"])
    trainer.init_workers()
    trainer.fit()
    return tracking.history


def main(config: dict) -> None:
    run_ppo(config)


def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=print_metrics) -> list:
    return run_ppo({
        "data": {"train_batch_size": batch_size, "seed": seed},
        "actor_rollout_ref": {"model": policy, "grpo": cfg},
        "reward_model": task,
        "trainer": {"total_training_steps": steps},
    }, log)


if __name__ == "__main__":
    from lab import ModelConfig, SumTask, TinyLM

    torch.manual_seed(0)  # the model's initial weights
    main({
        "data": {"train_batch_size": 16, "seed": 0},
        # fp64 on the CPU: the same numbers on every machine
        "actor_rollout_ref": {"model": TinyLM(ModelConfig(), dtype=torch.float64), "grpo": GRPOConfig(num_iterations=2)},
        "reward_model": SumTask(),  # the score of each response
        "trainer": {"total_training_steps": 40},
    })
