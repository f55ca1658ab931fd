"""GRPO trainer for small causal language models.

[`GRPOTrainer`] trains a policy with Group Relative Policy Optimization (DeepSeekMath,
https://huggingface.co/papers/2402.03300). Completions are sampled and scored once per generation batch,
`num_generations` per prompt; the batch is buffered and served in `steps_per_generation` micro-batches, one per call
of `training_step`, for `num_iterations` optimizer steps, and the training loop steps the optimizer once the
gradients of every micro-batch of the batch are accumulated. The functions at module level (`generate`,
`completion_mask`, `group_advantages`, `token_logprobs`, `kl_penalty`, `grpo_loss`, `grpo_step`, `train`) are the
functional interface to the same code.
"""

import contextlib
import copy
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class GRPOConfig:
    r"""
    Configuration class for the [`GRPOTrainer`].

    Parameters:
        > Parameters that control generation

        group_size (`int`, *optional*, defaults to `8`):
            Number of completions to generate for each prompt. Must be at least 2.
        max_new_tokens (`int`, *optional*, defaults to `8`):
            Maximum length of a generated completion.
        temperature (`float`, *optional*, defaults to `1.0`):
            Temperature for sampling. The higher the temperature, the more random the completions.

        > Parameters that control the training

        lr (`float`, *optional*, defaults to `3e-3`):
            Learning rate of the default `AdamW` optimizer.
        max_grad_norm (`float`, *optional*, defaults to `1.0`):
            Maximum gradient norm for gradient clipping.
        num_iterations (`int`, *optional*, defaults to `1`):
            Number of iterations per batch (denoted as μ in the algorithm).
        grad_accum_steps (`int`, *optional*, defaults to `1`):
            Number of micro-batches a generation batch is split into; each optimizer step accumulates the
            gradients of all of them.
        beta (`float`, *optional*, defaults to `0.04`):
            KL coefficient. If `0.0`, the KL term does not enter the loss.
        clip_eps (`float`, *optional*, defaults to `0.2`):
            Epsilon value for clipping.
        clip_eps_high (`float`, *optional*):
            Upper-bound epsilon value for clipping. If not specified, it defaults to the same value as the
            lower-bound specified in argument `clip_eps`. Paper [DAPO](https://huggingface.co/papers/2503.14476)
            recommends `0.28`.
        adv_eps (`float`, *optional*, defaults to `1e-4`):
            Numerical-stability constant used when scaling the advantages.
        scale_rewards (`str`, *optional*, defaults to `"group"`):
            Specifies the scaling strategy for rewards. Supported values are:

            - `"group"` (default): rewards are scaled by the standard deviation within each group.
            - `"batch"`: rewards are scaled by the standard deviation across the entire batch.
            - `"none"`: no scaling is applied ([Dr. GRPO](https://huggingface.co/papers/2503.20783)).
        loss_type (`str`, *optional*, defaults to `"grpo"`):
            Specifies the loss formulation to use. Supported values are:

            - `"grpo"`: Aggregates token-level losses by normalizing over sequence length.
            - `"bnpo"`: Aggregates token-level losses by normalizing with the number of active tokens in the
              local batch (the micro-batch).
            - `"dr_grpo"`: Aggregates token-level losses by normalizing with a global constant, `max_new_tokens`.
            - `"dapo"`: Aggregates token-level losses by normalizing with the number of active tokens in the
              global accumulated batch.
            - `"cispo"`: Clips the importance sampling weights instead of the advantage scaled importance weights;
              the clipped weights, held constant, multiply the advantages and the log-probs. Aggregated as `"dapo"`
              ([MiniMax-M1](https://huggingface.co/papers/2506.13585)).
            - `"sapo"`: A smooth, temperature-controlled gate in place of the hard clip. Aggregated as `"grpo"`
              ([SAPO](https://huggingface.co/papers/2511.20347)).
        is_cap (`float`, *optional*):
            Truncation cap for the per-token importance sampling correction between the policy that scores the
            batch and the sampler that generated it. If `None`, no correction is applied.
            Equivalent to `rollout_is_mode="token_truncate"` with `rollout_is_clip_max=is_cap`.
        importance_sampling_level (`str`, *optional*, defaults to `"token"`):
            Controls whether importance sampling ratios are computed at the `"token"` or `"sequence"` level.
            `"sequence"` averages the log-probability ratios across valid tokens to produce a single ratio per
            sequence ([GSPO](https://huggingface.co/papers/2507.18071)).
        sapo_temperature_pos (`float`, *optional*, defaults to `1.0`):
            Temperature of the `sapo` gate for tokens with positive advantage.
        sapo_temperature_neg (`float`, *optional*, defaults to `1.05`):
            Temperature of the `sapo` gate for tokens with non-positive advantage.
        delta (`float`, *optional*):
            Bounds the importance ratio of the unclipped term too, two-sided GRPO loss, when set to a float above 1.
            If `None`, standard GRPO clipping is used ([INTELLECT-2](https://huggingface.co/papers/2505.07291)).
        top_entropy_quantile (`float`, *optional*, defaults to `1.0`):
            Keeps in the policy loss term only the top-ρ quantile of tokens by entropy of the probability
            distribution at each position ([Beyond the 80/20 Rule](https://huggingface.co/papers/2506.01939)
            recommends `0.2`); `1.0` keeps all tokens.
        mask_truncated_completions (`bool`, *optional*, defaults to `False`):
            When enabled, completions that never produced the end-of-sequence token are excluded from the loss
            ([DAPO](https://huggingface.co/papers/2503.14476)).
        rollout_is_mode (`str`, *optional*):
            Importance sampling correction for the sampler that generated the batch: `"token_truncate"`,
            `"token_mask"`, `"sequence_truncate"` or `"sequence_mask"`. If `None`, no correction is applied.
        rollout_is_clip_min (`float`, *optional*):
            Lower bound of the importance sampling ratio used by `rollout_is_mode`.
        rollout_is_clip_max (`float`, *optional*, defaults to `3.0`):
            Upper bound of the importance sampling ratio used by `rollout_is_mode`.
        use_bias_correction_kl (`bool`, *optional*, defaults to `False`):
            Whether to multiply the KL term by the importance sampling ratio
            ([DeepSeek-V3.2](https://huggingface.co/papers/2512.02556)).
        off_policy_mask_threshold (`float`, *optional*):
            Threshold for off-policy sequence masking: sequences with negative advantages whose mean log-ratio of
            the sampler to the policy is above it are masked out. If `None`, no masking.
    """

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
    clip_eps_high: Optional[float] = None
    grad_accum_steps: int = 1
    is_cap: Optional[float] = None
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    delta: Optional[float] = None
    top_entropy_quantile: float = 1.0
    mask_truncated_completions: bool = False
    rollout_is_mode: Optional[str] = None
    rollout_is_clip_min: Optional[float] = None
    rollout_is_clip_max: Optional[float] = 3.0
    use_bias_correction_kl: bool = False
    off_policy_mask_threshold: Optional[float] = None

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"GRPO requires at least 2 generations per prompt, got group_size={self.group_size}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}.")
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"):
            raise ValueError(f"Unknown loss type: {self.loss_type}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(
                f"Invalid value for scale_rewards: {self.scale_rewards}. Must be one of 'batch', 'group', or 'none'."
            )
        if self.num_iterations < 1 or self.grad_accum_steps < 1:
            raise ValueError(
                f"num_iterations and grad_accum_steps must be at least 1, got {self.num_iterations} and "
                f"{self.grad_accum_steps}."
            )
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                f"Unknown importance sampling level: {self.importance_sampling_level}. Possible values are 'token' "
                "and 'sequence'."
            )
        if self.sapo_temperature_pos <= 0 or self.sapo_temperature_neg <= 0:
            raise ValueError("sapo_temperature_pos and sapo_temperature_neg must be positive.")
        if self.delta is not None and self.delta <= 1.0:
            raise ValueError(f"delta must be above 1 when set, got {self.delta}.")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0.0, 1.0], got {self.top_entropy_quantile}.")
        if not isinstance(self.mask_truncated_completions, bool) or not isinstance(self.use_bias_correction_kl, bool):
            raise ValueError("mask_truncated_completions and use_bias_correction_kl must be booleans.")
        if self.rollout_is_mode not in (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
            raise ValueError(
                f"Unknown rollout_is_mode: {self.rollout_is_mode}. Possible values are 'token_truncate', "
                "'token_mask', 'sequence_truncate' and 'sequence_mask'."
            )
        if self.is_cap is not None and self.rollout_is_mode is not None:
            raise ValueError(
                "is_cap is rollout_is_mode='token_truncate' with rollout_is_clip_max=is_cap; set only one of them."
            )
        clip_min, clip_max = self.rollout_is_clip_min, self.rollout_is_clip_max
        if clip_min is not None and clip_max is not None and clip_min >= clip_max:
            raise ValueError(f"rollout_is_clip_min ({clip_min}) must be below rollout_is_clip_max ({clip_max}).")
        if self.rollout_is_mode is not None and clip_min is None and clip_max is None:
            raise ValueError(
                f"rollout_is_mode={self.rollout_is_mode} needs rollout_is_clip_min or rollout_is_clip_max."
            )
        if self.off_policy_mask_threshold is not None and self.off_policy_mask_threshold <= 0:
            raise ValueError(f"off_policy_mask_threshold must be positive, got {self.off_policy_mask_threshold}.")


@dataclass
class Rollout:
    """
    A batch of generated completions.

    Attributes:
        input_ids (`torch.Tensor` of shape `(N, P + T)`):
            Prompt ids (left-padded) followed by the completion ids.
        attention_mask (`torch.Tensor` of shape `(N, P + T)`):
            Attention mask over `input_ids`.
        completion_mask (`torch.Tensor` of shape `(N, T)`):
            Mask of the completion tokens that are trained on.
        prompt_len (`int`):
            Number of prompt columns, P.
        sampler_logp (`torch.Tensor` of shape `(N, T)`, *optional*):
            Log-probabilities of the sampled tokens under the sampling distribution.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int
    sampler_logp: Optional[torch.Tensor] = None


@dataclass
class GenerationConfig:
    """
    The settings [`sample`] decodes with.

    Attributes:
        max_new_tokens (`int`):
            Maximum number of tokens to generate.
        eos_token_id (`int`, *optional*):
            Token that ends a sequence.
        pad_token_id (`int`, *optional*, defaults to `0`):
            Token that fills a sequence after it has ended.
        do_sample (`bool`, *optional*, defaults to `False`):
            Whether or not to use sampling; use greedy decoding otherwise.
        temperature (`float`, *optional*, defaults to `1.0`):
            The value used to modulate the next token probabilities.
        use_cache (`bool`, *optional*, defaults to `True`):
            Whether or not the model should use its KV cache (if it has one) to speed up decoding.
    """

    max_new_tokens: int
    eos_token_id: Optional[int] = None
    pad_token_id: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    use_cache: bool = True


# ----------------------------------------------------------------------------------------------------------------------
# Utilities


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """
    A memory-efficient implementation of the common `log_softmax -> gather` operation.

    Args:
        logits (`torch.Tensor`):
            Logits tensor of shape `(..., num_classes)`.
        index (`torch.Tensor`):
            Index tensor of shape `(...)`, specifying the positions to gather from the log-softmax output.

    Returns:
        `torch.Tensor`:
            Gathered log probabilities with the same shape as `index`.
    """
    selected_logits = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
    # loop to reduce peak mem consumption
    logsumexp_values = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
    return selected_logits - logsumexp_values  # log_softmax(x_i) = x_i - logsumexp(x)


def nanstd(tensor: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """
    Computes the standard deviation of a tensor, ignoring NaNs, with Bessel's correction.

    Args:
        tensor (`torch.Tensor`):
            Input tensor.
        dim (`int`, *optional*):
            Dimension to reduce. If `None`, all dimensions are reduced.

    Returns:
        `torch.Tensor`:
            Standard deviation of the tensor, ignoring NaNs.
    """
    variance = torch.nanmean((tensor - torch.nanmean(tensor, dim=dim, keepdim=True)) ** 2, dim=dim)
    count = torch.sum(~torch.isnan(tensor), dim=dim)  # Count of non-NaN values
    return torch.sqrt(variance * count / (count - 1))  # Bessel's correction


class Accelerator:
    """
    The data-parallel processes this one trains with, read from `torch.distributed`: a single process (index 0) when
    no process group is initialized.
    """

    def __init__(self):
        if dist.is_available() and dist.is_initialized():
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
        else:
            self.num_processes = 1
            self.process_index = 0

    def reduce(self, tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        """
        Reduces a copy of `tensor` across all processes, by `reduction` ("sum" or "mean"); with a single process, the
        copy is returned as it is.
        """
        cloned_tensor = tensor.clone()
        if self.num_processes == 1:
            return cloned_tensor
        dist.all_reduce(cloned_tensor, op=dist.ReduceOp.SUM)
        if reduction == "mean":
            cloned_tensor /= self.num_processes
        return cloned_tensor


def create_reference_model(model: torch.nn.Module) -> torch.nn.Module:
    """
    Creates a static reference copy of a model. Note that model will be in `.eval()` mode.

    Args:
        model (`torch.nn.Module`): The model to be copied.

    Returns:
        `torch.nn.Module`
    """
    parameter_names = [n for n, _ in model.named_parameters()]
    ref_model = copy.deepcopy(model)
    for param_name in parameter_names:
        param = ref_model.get_parameter(param_name)
        param.requires_grad = False
    return ref_model.eval()


def split_tensor_dict(tensor_dict: dict, num_chunks: int) -> list[dict]:
    """
    Splits a dictionary of tensors along the first dimension into `num_chunks` parts whose sizes differ by at most
    one (`torch.tensor_split`), so a batch that does not divide evenly keeps every row (chunks of `len // num_chunks`
    rows would drop the remainder). Scalars and 0-dim tensors are passed to every chunk unchanged.

    Example:
    ```python
    >>> split_tensor_dict({"x": torch.arange(5)}, 2)
    [{"x": tensor([0, 1, 2])}, {"x": tensor([3, 4])}]
    ```
    """
    chunks = [{} for _ in range(num_chunks)]
    for key, value in tensor_dict.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            for chunk, part in zip(chunks, torch.tensor_split(value, num_chunks, dim=0), strict=True):
                chunk[key] = part
        else:
            for chunk in chunks:
                chunk[key] = value
    return chunks


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """
    Mask of the completion tokens up to the end-of-sequence token.

    Args:
        completion_ids (`torch.Tensor` of shape `(N, T)`):
            Generated token ids.
        eos_id (`int`):
            End-of-sequence token id.

    Returns:
        `torch.Tensor` of shape `(N, T)`: float mask, 1 for the tokens that belong to the completion.
    """
    is_eos = completion_ids == eos_id
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long, device=completion_ids.device)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    sequence_indices = torch.arange(is_eos.size(1), device=completion_ids.device).expand(is_eos.size(0), -1)
    return (sequence_indices <= eos_idx.unsqueeze(1)).float()


def _prepare_cache_for_generation(model, generation_config: GenerationConfig, model_kwargs: dict) -> None:
    """
    Prepares the cache for generation (if applicable): if `generation_config.use_cache` and the model supports a KV
    cache (it has a `make_cache()` method), writes a new one to `model_kwargs` under `"cache"`.
    """
    # Quick escape route 1: if the user specifies no cache is to be used
    if not generation_config.use_cache:
        return
    # Quick escape route 2: a model without a cache of its own is called on the whole sequence at every step
    if not callable(getattr(model, "make_cache", None)):
        return
    model_kwargs["cache"] = model.make_cache()


def sample(model, input_ids, attention_mask, generation_config: GenerationConfig, generator=None) -> tuple:
    """
    Extends every row of `input_ids` one token at a time until each row has produced `eos_token_id` or
    `max_new_tokens` tokens. A row that has ended is extended with `pad_token_id`, which is not attended to.

    Args:
        model (`torch.nn.Module`):
            Model to decode with. If it has a `make_cache()` method, its KV cache is used (see
            `GenerationConfig.use_cache`).
        input_ids (`torch.Tensor` of shape `(N, P)`):
            Left-padded prompt ids.
        attention_mask (`torch.Tensor` of shape `(N, P)`):
            Attention mask of the prompts.
        generation_config ([`GenerationConfig`]):
            Decoding settings.
        generator (`torch.Generator`, *optional*):
            Random generator for sampling.

    Returns:
        `tuple`: the sequences `(N, P + T)`, their attention mask `(N, P + T)`, and the log-probability of each
        generated token under the distribution it was chosen from, `(N, T)`, 0 once a row has ended.
    """
    pad_token_id = generation_config.pad_token_id
    has_eos_stopping_criteria = generation_config.eos_token_id is not None
    unfinished_sequences = torch.ones(input_ids.size(0), dtype=torch.long, device=input_ids.device)
    model_kwargs = {}
    _prepare_cache_for_generation(model, generation_config, model_kwargs)
    use_cache = "cache" in model_kwargs
    model_inputs = input_ids
    token_logps = []
    for _ in range(generation_config.max_new_tokens):
        outputs = model(model_inputs, attention_mask, **model_kwargs)
        next_token_logits = outputs[:, -1, :].to(copy=True, dtype=torch.promote_types(outputs.dtype, torch.float32))

        # pre-process distribution
        next_token_scores = next_token_logits / generation_config.temperature

        # token selection
        if generation_config.do_sample:
            probs = torch.softmax(next_token_scores, dim=-1)
            next_tokens = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
        else:
            next_tokens = torch.argmax(next_token_scores, dim=-1)
        token_logps.append(selective_log_softmax(next_token_scores, next_tokens) * unfinished_sequences)

        # finished sentences should have their next token be a padding token
        if has_eos_stopping_criteria:
            next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)

        # update generated ids, model inputs, and attention mask for next step
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        attention_mask = torch.cat([attention_mask, unfinished_sequences[:, None].to(attention_mask.dtype)], dim=-1)
        model_inputs = next_tokens[:, None] if use_cache else input_ids  # a cache holds every earlier column

        if has_eos_stopping_criteria:
            unfinished_sequences = unfinished_sequences & ~(next_tokens == generation_config.eos_token_id)
        if unfinished_sequences.max() == 0:
            break
    return input_ids, attention_mask, torch.stack(token_logps, dim=1)


@torch.no_grad()
def generate(
    policy, prompt_ids, prompt_mask, cfg: GRPOConfig, *, eos_id: int, pad_id: int, generator=None
) -> Rollout:
    """
    Samples `cfg.group_size` completions for every prompt.

    Args:
        policy (`torch.nn.Module`):
            Model to sample from.
        prompt_ids (`torch.Tensor` of shape `(B, P)`):
            Left-padded prompt ids.
        prompt_mask (`torch.Tensor` of shape `(B, P)`):
            Attention mask of the prompts.
        cfg ([`GRPOConfig`]):
            Generation settings (`group_size`, `max_new_tokens`, `temperature`).
        eos_id (`int`):
            End-of-sequence token id.
        pad_id (`int`):
            Padding token id.
        generator (`torch.Generator`, *optional*):
            Random generator for sampling.

    Returns:
        [`Rollout`]: `B * group_size` rows, the completions of each prompt next to each other.
    """
    # every prompt `group_size` times in a row: [p0, p0, ..., p1, p1, ...]
    indexes = [index for index in range(prompt_ids.size(0)) for _ in range(cfg.group_size)]
    generation_config = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        do_sample=True,
        temperature=cfg.temperature,
    )
    prompt_completion_ids, attention_mask, sampling_per_token_logps = sample(
        policy, prompt_ids[indexes], prompt_mask[indexes], generation_config, generator
    )
    prompt_length = prompt_ids.size(1)
    completion_ids = prompt_completion_ids[:, prompt_length:]
    rollout_completion_mask = completion_mask(completion_ids, eos_id)

    # If mask_truncated_completions is enabled, zero out truncated completions in completion_mask
    if cfg.mask_truncated_completions:
        is_truncated = ~(completion_ids == eos_id).any(dim=1)
        rollout_completion_mask = rollout_completion_mask * (~is_truncated).unsqueeze(1).float()

    return Rollout(
        input_ids=prompt_completion_ids,
        attention_mask=attention_mask,
        completion_mask=rollout_completion_mask,
        prompt_len=prompt_length,
        sampler_logp=sampling_per_token_logps,
    )


@torch.no_grad()
def group_advantages(rewards: torch.Tensor, group_size: int, eps: float, scale: str = "group") -> torch.Tensor:
    """
    Group-relative advantages of a batch of rewards.

    Args:
        rewards (`torch.Tensor` of shape `(N,)`):
            One reward per completion.
        group_size (`int`):
            Number of completions per prompt.
        eps (`float`):
            Numerical-stability constant.
        scale (`str`, *optional*, defaults to `"group"`):
            `"group"`, `"batch"` or `"none"`; see `GRPOConfig.scale_rewards`.

    Returns:
        `torch.Tensor` of shape `(N,)`: the advantages.
    """
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, group_size), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(group_size, dim=0)
    if scale in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, group_size), dim=1)
        std_rewards = std_rewards.repeat_interleave(group_size, dim=0)
    elif scale == "batch":
        std_rewards = nanstd(rewards, dim=0).expand_as(rewards)
    else:
        raise ValueError(f"Invalid value for scale_rewards: {scale}. Must be one of 'batch', 'group', or 'none'.")

    advantages = rewards - mean_grouped_rewards
    if scale != "none":
        advantages = advantages / (std_rewards + eps)
    return advantages


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """
    Compute the Shannon entropy (in nats) for each row of *logits*.

    Args:
        logits (`torch.Tensor`):
            Logits tensor of shape `(..., num_classes)`. Entropy is taken along the last axis.

    Returns:
        `torch.Tensor`: Entropy values with shape `logits.shape[:-1]`.
    """
    per_row_entropies = []
    for row_logits in logits:  # loop to reduce peak mem consumption
        row_logps = torch.log_softmax(row_logits, dim=-1)
        per_row_entropies.append(-(torch.exp(row_logps) * row_logps).sum(-1))
    return torch.stack(per_row_entropies)


def token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """
    Per-token log-probabilities of the completion tokens.

    Args:
        model (`torch.nn.Module`):
            Model to score with.
        input_ids (`torch.Tensor` of shape `(N, P + T)`):
            Prompt and completion ids.
        attention_mask (`torch.Tensor` of shape `(N, P + T)`):
            Attention mask.
        prompt_len (`int`):
            Number of prompt columns, P.
        temperature (`float`):
            Sampling temperature of the completions.

    Returns:
        `torch.Tensor` of shape `(N, T)`, float32 (float64 for a float64 model).
    """
    return token_logprobs_and_entropies(model, input_ids, attention_mask, prompt_len, temperature)[0]


def token_entropies(model, input_ids, attention_mask, prompt_len: int, temperature: float) -> torch.Tensor:
    """
    Entropy of the distribution each completion token is scored under, `(N, T)`; arguments as [`token_logprobs`].
    """
    return token_logprobs_and_entropies(model, input_ids, attention_mask, prompt_len, temperature, True)[1]


def token_logprobs_and_entropies(
    model, input_ids, attention_mask, prompt_len: int, temperature: float, compute_entropy: bool = False
) -> tuple:
    """
    Per-token log-probabilities of the completion tokens, and if `compute_entropy` the entropy at each of them (else
    `None`), from one forward pass; arguments as [`token_logprobs`].
    """
    logits_to_keep = input_ids.size(1) - prompt_len  # we only need to compute the logits for the completion tokens
    logits = model(input_ids, attention_mask)
    # Exclude the last value: it corresponds to the next token pred
    logits = logits[:, :-1, :]  # (N, L-1, V)
    # Only keep the last logits_to_keep
    logits = logits[:, -logits_to_keep:, :]  # (N, T, V)
    if logits.dtype not in [torch.float32, torch.float64]:
        logits = logits.float()
    # Divide logits by sampling temperature
    logits.div_(temperature)
    completion_ids = input_ids[:, -logits_to_keep:]
    logps = selective_log_softmax(logits, completion_ids)
    entropies = None
    if compute_entropy:
        with torch.no_grad():
            entropies = entropy_from_logits(logits)
    return logps, entropies


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """
    Per-token KL divergence between the model and the reference model
    ([Schulman, 2020](http://joschu.net/blog/kl-approx.html)).

    Args:
        logp (`torch.Tensor` of shape `(N, T)`):
            Log-probabilities under the model.
        ref_logp (`torch.Tensor` of shape `(N, T)`):
            Log-probabilities under the reference model.
    """
    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1


def get_high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """
    Returns a binary mask identifying tokens whose entropy exceeds a given quantile threshold.

    Args:
        entropies (`torch.Tensor`):
            Tensor of shape `(N, T)` with per-token entropy values.
        mask (`torch.Tensor`):
            Binary mask of the same shape as `entropies`, where `1` indicates valid tokens and `0` padding.
        threshold (`float`):
            Quantile threshold between `0.0` and `1.0` to select high-entropy tokens.

    Returns:
        `torch.Tensor`: Boolean mask of shape `(N, T)`, where `True` indicates tokens with entropy >= threshold.
    """
    local = entropies[mask.bool()]
    if local.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(local, threshold)
    entropy_mask = entropies >= entropy_threshold
    return entropy_mask & mask.bool()  # ensure padding tokens are always masked out


def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold: float):
    """
    Computes the Off-Policy Sequence Mask from the DeepSeek-V3.2 paper. Returns a `(N, 1)` tensor where 1.0 indicates
    "Keep" and 0.0 indicates "Drop".
    """
    # forward KL div: log(pi_old) - log(pi_theta)
    kl_div = (sampling_per_token_logps - per_token_logps.detach()).masked_fill(~mask.bool(), 0.0)
    # Sequence-level Mean KL (ignoring prompt+padding)
    seq_kl_sum = kl_div.sum(dim=1, keepdim=True)
    avg_seq_kl = seq_kl_sum / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    # Keep if (Advantage >= 0) OR (KL <= delta)
    is_pos_adv = advantages >= 0
    is_low_kl = avg_seq_kl <= off_policy_threshold
    return (is_pos_adv | is_low_kl).to(dtype=kl_div.dtype)  # (N, 1)


def get_importance_sampling_ratio(per_token_logps, sampling_per_token_logps, mask, args: GRPOConfig):
    """
    Importance sampling ratio of the batch against the sampler that generated it, `(N, T)` or `(N, 1)`, as
    `args.rollout_is_mode` asks (`args.is_cap` is `"token_truncate"` capped at `is_cap`).
    """
    mode, clip_min, clip_max = args.rollout_is_mode, args.rollout_is_clip_min, args.rollout_is_clip_max
    if args.is_cap is not None:
        mode, clip_min, clip_max = "token_truncate", None, args.is_cap
    per_token_logps_diff = (per_token_logps - sampling_per_token_logps).masked_fill(~mask, 0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    importance_sampling_ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        importance_sampling_ratio = torch.clamp(importance_sampling_ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -float("inf")
        max_val = clip_max if clip_max is not None else float("inf")
        invalid_mask = (importance_sampling_ratio < min_val) | (importance_sampling_ratio > max_val)
        importance_sampling_ratio = importance_sampling_ratio.masked_fill(invalid_mask, value=0.0)
    return importance_sampling_ratio.detach()


def compute_grpo_loss(
    per_token_logps,
    old_per_token_logps,
    ref_per_token_logps,
    advantages,
    completion_mask,
    args: GRPOConfig,
    *,
    num_tokens=None,
    sampler_logp=None,
    entropies=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    GRPO loss of a batch, aggregated according to `args.loss_type`.

    Args:
        per_token_logps (`torch.Tensor` of shape `(N, T)`):
            Log-probabilities under the model being optimized.
        old_per_token_logps (`torch.Tensor` of shape `(N, T)`):
            Log-probabilities under the old policy.
        ref_per_token_logps (`torch.Tensor` of shape `(N, T)`):
            Log-probabilities under the reference model.
        advantages (`torch.Tensor` of shape `(N,)`):
            One advantage per completion.
        completion_mask (`torch.Tensor` of shape `(N, T)`):
            Mask of the tokens that enter the loss.
        args ([`GRPOConfig`]):
            Loss settings.
        num_tokens (`torch.Tensor` or `float`, *optional*):
            Number of active tokens in the global accumulated batch, per process, used by `loss_type="dapo"`.
            Defaults to the number of active tokens in this batch.
        sampler_logp (`torch.Tensor` of shape `(N, T)`, *optional*):
            Log-probabilities under the sampler, for the importance sampling correction (`args.is_cap`,
            `args.rollout_is_mode`) and the off-policy mask.
        entropies (`torch.Tensor` of shape `(N, T)`, *optional*):
            Entropy of the model at each token, for `args.top_entropy_quantile`.

    Returns:
        `tuple`: the scalar loss, and the importance ratio `coef_1` (`(N, T)`, or `(N, 1)` at the sequence level) and
        the per-token KL `(N, T)` it was computed from, for the logs.
    """
    mask = completion_mask.bool()
    if num_tokens is None:  # not part of an accumulated batch
        num_tokens = mask.sum().clamp(min=1.0)
    advantages = advantages.unsqueeze(1)
    epsilon_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps

    if args.top_entropy_quantile < 1.0 and entropies is not None:
        entropy_mask = get_high_entropy_mask(entropies, mask, 1 - args.top_entropy_quantile)
    else:
        entropy_mask = None

    if args.off_policy_mask_threshold is not None:
        # the sampler's log-probs where there are any, else the old policy's
        sampling_per_token_logps = sampler_logp if sampler_logp is not None else old_per_token_logps
        off_policy_mask = get_off_policy_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, args.off_policy_mask_threshold
        )

    log_ratio = (per_token_logps - old_per_token_logps).masked_fill(~mask, 0.0)
    if args.importance_sampling_level == "token":
        log_importance_weights = log_ratio
    elif args.importance_sampling_level == "sequence":
        log_importance_weights = log_ratio.mean(-1)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    else:
        raise ValueError(f"Unknown importance sampling level: {args.importance_sampling_level}")
    coef_1 = torch.exp(log_importance_weights)

    per_token_kl = kl_penalty(per_token_logps.masked_fill(~mask, 0.0), ref_per_token_logps.masked_fill(~mask, 0.0))
    if args.use_bias_correction_kl:
        per_token_kl = per_token_kl * coef_1

    # From here, coef_1's shape depends on importance_sampling_level: (N, T) for "token", (N, 1) for "sequence"
    if args.loss_type == "cispo":
        cispo_cap = args.clip_eps_high if args.clip_eps_high is not None else 5.0  # ScaleRL's epsilon_max
        clamped_ratios = torch.clamp(coef_1, max=cispo_cap).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps.masked_fill(~mask, 0.0)
    elif args.loss_type == "sapo":
        temperatures = torch.where(
            advantages > 0,
            coef_1.new_tensor(args.sapo_temperature_pos),
            coef_1.new_tensor(args.sapo_temperature_neg),
        )
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * advantages
    else:
        coef_2 = torch.clamp(coef_1, 1 - args.clip_eps, 1 + epsilon_high)
        # Two-sided clipping
        upper_coef_1 = torch.clamp(coef_1, max=args.delta) if args.delta is not None else coef_1
        per_token_loss1 = upper_coef_1 * advantages
        per_token_loss2 = coef_2 * advantages
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)

    if args.off_policy_mask_threshold is not None:
        per_token_loss = per_token_loss * off_policy_mask

    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask

    if (args.is_cap is not None or args.rollout_is_mode is not None) and sampler_logp is not None:
        importance_sampling_ratio = get_importance_sampling_ratio(old_per_token_logps, sampler_logp, mask, args)
        per_token_loss = per_token_loss * importance_sampling_ratio

    if args.beta != 0.0:
        per_token_loss = per_token_loss + args.beta * per_token_kl

    mask = mask.to(per_token_loss.dtype)
    if args.loss_type in ["grpo", "sapo"]:
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif args.loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif args.loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * args.max_new_tokens)
    elif args.loss_type in ["cispo", "dapo"]:
        loss = (per_token_loss * mask).sum() / num_tokens
    else:
        raise ValueError(f"Unknown loss type: {args.loss_type}")
    return loss, coef_1, per_token_kl


def grpo_loss(
    per_token_logps,
    old_per_token_logps,
    ref_per_token_logps,
    advantages,
    completion_mask,
    args: GRPOConfig,
    *,
    num_tokens=None,
    sampler_logp=None,
    entropies=None,
) -> torch.Tensor:
    """The scalar loss of [`compute_grpo_loss`], which documents the arguments."""
    return compute_grpo_loss(
        per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask, args,
        num_tokens=num_tokens, sampler_logp=sampler_logp, entropies=entropies,
    )[0]


# ----------------------------------------------------------------------------------------------------------------------
# Trainer


class GRPOTrainer:
    """
    Trainer for the Group Relative Policy Optimization (GRPO) method, introduced in [DeepSeekMath: Pushing the Limits
    of Mathematical Reasoning in Open Language Models](https://huggingface.co/papers/2402.03300).

    Args:
        model (`torch.nn.Module`):
            Model to be trained, called as `model(input_ids, attention_mask)` and returning logits of shape
            `(batch_size, sequence_length, vocab_size)`.
        reward_funcs (`Callable`):
            Reward function, called with a [`Rollout`] and returning one reward per completion.
        args ([`GRPOConfig`], *optional*):
            Configuration for this trainer. If `None`, a default configuration is used.
        train_dataset (iterable, *optional*):
            The generation batches to train on: each a `(prompt_ids, prompt_mask)` pair of `(B, P)` tensors, or
            whatever `rollout_func` takes.
        processing_class (*optional*):
            Provides `eos_id` and `pad_id`, the token ids generation stops and pads with.
        ref_model (`torch.nn.Module`, *optional*):
            Reference model for the KL penalty. If `None`, a copy of `model` made before training.
        optimizers (`tuple[torch.optim.Optimizer, None]`, *optional*):
            The optimizer (and an unused scheduler slot). If `None`, `torch.optim.AdamW` at learning rate `args.lr`.
        rollout_func (`Callable`, *optional*):
            Called as `rollout_func(generation_batch, trainer)` to produce the [`Rollout`] of a generation batch
            instead of sampling it from `model`.
        callbacks (`list[Callable]`, *optional*):
            Called with the logs of every optimizer step.
    """

    def __init__(
        self,
        model,
        reward_funcs: Callable,
        args: Optional[GRPOConfig] = None,
        train_dataset=None,
        processing_class=None,
        ref_model=None,
        optimizers: tuple = (None, None),
        rollout_func: Optional[Callable] = None,
        callbacks: Optional[list] = None,
    ):
        self.args = args if args is not None else GRPOConfig()
        args = self.args
        self.model = model
        self.accelerator = Accelerator()
        # With several processes the model is trained through DistributedDataParallel (gradients are averaged across
        # processes); generation and the old log-probs use the model itself.
        wrap = self.accelerator.num_processes > 1 and not isinstance(model, DistributedDataParallel)
        self.model_wrapped = DistributedDataParallel(model) if wrap else model
        self.reward_funcs = reward_funcs
        self.train_dataset = train_dataset
        self.processing_class = processing_class
        self.rollout_func = rollout_func
        self.callbacks = callbacks or []

        # Reference model: the model as training starts, which nothing updates
        if ref_model is not None:
            self.ref_model = ref_model
        else:
            # If no reference model is given, create one based on the initial model
            self.ref_model = create_reference_model(model)
        optimizer = optimizers[0]
        self.optimizer = optimizer if optimizer is not None else torch.optim.AdamW(model.parameters(), lr=args.lr)

        # Training arguments
        self.num_generations = args.group_size
        self.temperature = args.temperature
        self.loss_type = args.loss_type
        self.scale_rewards = args.scale_rewards
        self.epsilon_low = args.clip_eps
        self.epsilon_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps
        self.use_importance_sampling_correction = args.is_cap is not None or args.rollout_is_mode is not None
        self.importance_sampling_level = args.importance_sampling_level
        self.top_entropy_quantile = args.top_entropy_quantile
        self.off_policy_mask_threshold = args.off_policy_mask_threshold

        # Multi-step
        self.num_iterations = args.num_iterations  # = 𝜇 in the GRPO paper
        self.current_gradient_accumulation_steps = args.grad_accum_steps
        self.steps_per_generation = args.grad_accum_steps  # one generation batch per optimizer step
        # Tracks the number of iterations (forward + backward passes), including those within a grad accum cycle
        self._step = 0
        # Buffer the batch to reuse generated outputs across multiple updates; see `_prepare_inputs`
        self._buffered_inputs = None

        # Logging: metrics per step, token sums over the accumulation window for the token-level ones
        self._metrics = {"train": defaultdict(list)}
        self._window_token_sums = None
        self._window_ratio_deviation = 0.0
        self._sync_gradients = True
        self.global_step = 0
        self.log_history = []

    def get_train_dataloader(self):
        """
        Yields each generation batch of `train_dataset` once for every call of `training_step` that trains on it,
        `num_iterations * steps_per_generation` times: the first call samples and scores it, the others are served
        from the buffer.
        """
        for generation_batch in self.train_dataset:
            for _ in range(self.num_iterations * self.steps_per_generation):
                yield generation_batch

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep, num_chunks=1) -> torch.Tensor:
        """Per-token log-probabilities of the last `logits_to_keep` tokens, computed in `num_chunks` chunks."""
        return self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, num_chunks)[0]

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, num_chunks=1, compute_entropy=False
    ) -> tuple:
        """Per-token log-probabilities of the last `logits_to_keep` tokens, and if `compute_entropy` the entropy at
        each of them (else `None`), computed in `num_chunks` chunks."""
        all_logps, all_entropies = [], []
        for input_ids_batch, attention_mask_batch in zip(
            torch.tensor_split(input_ids, num_chunks), torch.tensor_split(attention_mask, num_chunks), strict=True
        ):
            if input_ids_batch.size(0) > 0:
                prompt_length = input_ids_batch.size(1) - logits_to_keep
                logps, entropies = token_logprobs_and_entropies(
                    model, input_ids_batch, attention_mask_batch, prompt_length, self.temperature, compute_entropy
                )
                all_logps.append(logps)
                all_entropies.append(entropies)
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        return logps, entropies

    def _prepare_inputs(self, generation_batch) -> dict:
        # Samples and scores the generation batch at the first of the `num_iterations * steps_per_generation` calls
        # that receive it, splits it into `steps_per_generation` micro-batches and buffers them; every call returns
        # the micro-batch of its accumulation step.
        generate_every = self.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            generation_batch = self._generate_and_score_completions(generation_batch)
            if generation_batch["num_completions"] < self.steps_per_generation:
                raise ValueError(
                    f"A generation batch of {generation_batch['num_completions']} completions cannot be split into "
                    f"grad_accum_steps={self.steps_per_generation} micro-batches."
                )
            self._buffered_inputs = split_tensor_dict(generation_batch, self.steps_per_generation)
        return self._buffered_inputs[self._step % self.steps_per_generation]

    def _generate(self, generation_batch) -> Rollout:
        if self.rollout_func is not None:
            return self.rollout_func(generation_batch, self)
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = generation_batch
        return generate(
            self.model,
            prompt_ids.to(device),
            prompt_mask.to(device),
            self.args,
            eos_id=self.processing_class.eos_id,
            pad_id=self.processing_class.pad_id,
        )

    def _generate_and_score_completions(self, generation_batch) -> dict:
        rollout = self._generate(generation_batch)
        prompt_length = rollout.prompt_len
        prompt_ids, completion_ids = rollout.input_ids[:, :prompt_length], rollout.input_ids[:, prompt_length:]
        prompt_mask, completion_mask = rollout.attention_mask[:, :prompt_length], rollout.completion_mask

        num_items_in_batch = self.accelerator.reduce(completion_mask.sum().float(), reduction="sum")

        prompt_completion_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (N, P+T)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (N, P+T)
        logits_to_keep = completion_ids.size(1)  # we only need to compute the logits for the completion tokens

        with torch.no_grad():
            # If generation does not occur at the end of a full optimizer step (gradient accumulation steps not a
            # multiple of generate_every), the samples may come from an earlier version of the model, and the old
            # log-probs are needed for the importance ratio. If the steps are aligned they are the log-probs of the
            # training pass and are left to `_compute_loss`. The sampler correction needs them either way.
            generate_every = self.steps_per_generation * self.num_iterations  # generation frequency
            misaligned = self.current_gradient_accumulation_steps % generate_every != 0
            old_per_token_logps = (
                self._get_per_token_logps(
                    self.model, prompt_completion_ids, attention_mask, logits_to_keep, self.steps_per_generation
                )
                if misaligned or self.use_importance_sampling_correction
                else None
            )
            ref_per_token_logps = self._get_per_token_logps(
                self.ref_model, prompt_completion_ids, attention_mask, logits_to_keep, self.steps_per_generation
            )

        rewards = self.reward_funcs(rollout).to(completion_ids.device)
        advantages = group_advantages(rewards, self.num_generations, self.args.adv_eps, self.scale_rewards)

        # Log the metrics
        self._metrics["train"]["completions/mean_length"].append(completion_mask.sum(1).float().mean().item())
        self._metrics["train"]["reward"].append(rewards.mean().item())
        self._metrics["train"]["reward_max"].append(rewards.max().item())
        self._metrics["train"]["advantages/std"].append(advantages.std().item())

        output = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": advantages,
            "ref_per_token_logps": ref_per_token_logps,
            "num_items_in_batch": num_items_in_batch,
            "num_completions": completion_ids.size(0),
        }
        if old_per_token_logps is not None:
            output["old_per_token_logps"] = old_per_token_logps
        if (self.use_importance_sampling_correction or self.off_policy_mask_threshold is not None) and (
            rollout.sampler_logp is not None
        ):
            output["sampling_per_token_logps"] = rollout.sampler_logp
        return output

    def _compute_loss(self, model, inputs) -> torch.Tensor:
        # Compute the per-token log probabilities for the model
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)  # we only need to compute the logits for the completion tokens

        # Compute the per_token_logps and, for the entropy mask, the entropy at each position in the completion
        per_token_logps, entropies = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=self.top_entropy_quantile < 1.0
        )

        old_per_token_logps = inputs.get("old_per_token_logps")
        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps

        loss, coef_1, per_token_kl = compute_grpo_loss(
            per_token_logps,
            old_per_token_logps,
            inputs["ref_per_token_logps"],
            inputs["advantages"],
            completion_mask,
            self.args,
            num_tokens=inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes,
            sampler_logp=inputs.get("sampling_per_token_logps"),
            entropies=entropies,
        )
        # Scale for gradient accumulation. `split_tensor_dict` may leave the micro-batches one completion apart, so a
        # loss averaged over completions is divided by as many micro-batches as the generation batch would hold at
        # this one's size (`current_gradient_accumulation_steps` when they are of equal size)
        if self.loss_type in ["grpo", "sapo", "dr_grpo"]:
            normalizer = inputs["num_completions"] / completion_ids.size(0)
            loss = loss / normalizer
        elif self.loss_type == "bnpo":
            normalizer = self.current_gradient_accumulation_steps
            loss = loss / normalizer

        # Log the metrics
        mask = completion_mask.bool()
        advantages = inputs["advantages"].unsqueeze(1)
        coef_1, per_token_kl = coef_1.detach().expand_as(mask), per_token_kl.detach()
        if self.loss_type == "cispo":
            # the tokens whose weight the cap holds
            cispo_cap = self.args.clip_eps_high if self.args.clip_eps_high is not None else 5.0
            is_low_clipped = torch.zeros_like(mask)
            is_high_clipped = coef_1 > cispo_cap
        elif self.loss_type == "sapo":
            # a soft gate, nothing is clipped
            is_low_clipped = is_high_clipped = torch.zeros_like(mask)
        else:
            # Compute the clipped probability ratios
            upper_coef_1 = torch.clamp(coef_1, max=self.args.delta) if self.args.delta is not None else coef_1
            is_low_clipped = (upper_coef_1 < 1 - self.epsilon_low) & (advantages < 0)
            is_high_clipped = (upper_coef_1 > 1 + self.epsilon_high) & (advantages > 0)
        is_region_clipped = is_low_clipped | is_high_clipped
        token_sums = torch.stack(
            [
                x.to(per_token_kl.dtype)[mask].sum()
                for x in (per_token_kl, is_low_clipped, is_high_clipped, is_region_clipped, mask)
            ]
        )
        self._log_token_metrics(token_sums, (coef_1 - 1).abs().max().item())
        return loss

    def _log_token_metrics(self, token_sums, ratio_deviation) -> None:
        # Micro-batches hold different numbers of tokens, so the token sums are accumulated over the window of one
        # optimizer step and turned into means when it is taken
        if self._window_token_sums is None:
            self._window_token_sums = token_sums
        else:
            self._window_token_sums = self._window_token_sums + token_sums
        self._window_ratio_deviation = max(self._window_ratio_deviation, ratio_deviation)
        if self._sync_gradients:
            kl, low, high, region, num_tokens = self._window_token_sums.tolist()
            num_tokens = max(num_tokens, 1.0)
            self._metrics["train"]["kl"].append(kl / num_tokens)
            self._metrics["train"]["clip_ratio/low_mean"].append(low / num_tokens)
            self._metrics["train"]["clip_ratio/high_mean"].append(high / num_tokens)
            self._metrics["train"]["clip_ratio/region_mean"].append(region / num_tokens)
            self._metrics["train"]["ratio_deviation/max"].append(self._window_ratio_deviation)
            self._window_token_sums, self._window_ratio_deviation = None, 0.0

    def training_step(self, model, inputs) -> torch.Tensor:
        """
        Forward and backward pass of one micro-batch; the training loop steps the optimizer once every
        `current_gradient_accumulation_steps` calls.

        Args:
            model (`torch.nn.Module`):
                The model to train, wrapped for data parallelism if there are several processes.
            inputs:
                The generation batch this micro-batch belongs to, as `get_train_dataloader` yields it.

        Returns:
            `torch.Tensor`: the detached loss of the micro-batch.
        """
        inputs = self._prepare_inputs(inputs)
        loss = self._compute_loss(model, inputs)
        loss.backward()
        self._step += 1
        return loss.detach()

    def log(self, logs: dict) -> None:
        """Adds the mean of every metric since the last log to `logs`, records them and passes them to the callbacks."""
        metrics = {key: sum(val) / len(val) for key, val in self._metrics["train"].items()}
        logs = {**logs, **metrics, "step": self.global_step}
        self._metrics["train"].clear()
        self.log_history.append(logs)
        for callback in self.callbacks:
            callback(logs)

    def train(self) -> None:
        """
        Main training entry point: one `training_step` per micro-batch, and at the end of every accumulation window
        the gradient is clipped, the optimizer steps and the gradients are zeroed.
        """
        model = self.model_wrapped
        model.zero_grad()
        tr_loss = 0.0
        for step, inputs in enumerate(self.get_train_dataloader()):
            do_sync_step = (step + 1) % self.current_gradient_accumulation_steps == 0
            self._sync_gradients = do_sync_step
            # the processes synchronize their gradients only on the backward pass of the last micro-batch
            no_sync = not do_sync_step and isinstance(model, DistributedDataParallel)
            with model.no_sync() if no_sync else contextlib.nullcontext():
                tr_loss += self.training_step(model, inputs)

            if do_sync_step:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
                self.optimizer.step()
                model.zero_grad()
                self.global_step += 1
                self.log({"loss": float(tr_loss), "grad_norm": grad_norm.item()})
                tr_loss = 0.0


# ----------------------------------------------------------------------------------------------------------------------
# Functional interface


def generation_batch_stats(step_logs: list[dict]) -> dict:
    """
    The stats of one generation batch from the logs of its `num_iterations` optimizer steps: the loss, the KL and the
    largest |ratio - 1| of the first step, the clip ratio and the gradient norm of the last.
    """
    first, last = step_logs[0], step_logs[-1]
    return {
        "reward_mean": first["reward"],
        "reward_max": first["reward_max"],
        "loss": first["loss"],
        "kl": first["kl"],
        "ratio_dev": first["ratio_deviation/max"],
        "clip_frac": last["clip_ratio/region_mean"],
        "grad_norm": last["grad_norm"],
        "adv_std": first["advantages/std"],
        "completion_len": first["completions/mean_length"],
    }


def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards: torch.Tensor, cfg: GRPOConfig) -> dict:
    """
    Trains on one generation batch that was already sampled and rewarded, as [`GRPOTrainer`] trains on each of its
    own: `num_iterations` optimizer steps. Returns its [`generation_batch_stats`].
    """
    trainer = GRPOTrainer(
        policy,
        reward_funcs=lambda completions: rewards,
        args=cfg,
        train_dataset=[rollout],
        ref_model=ref_policy,
        optimizers=(optimizer, None),
        rollout_func=lambda generation_batch, trainer: generation_batch,
    )
    trainer.train()
    return generation_batch_stats(trainer.log_history)


def print_logs(logs: dict) -> None:
    print(
        f"{{'step': {logs['step']}, 'reward': {logs['reward_mean']:.4f}, 'kl': {logs['kl']:.4f}, "
        f"'loss': {logs['loss']:.4f}, 'clip_ratio': {logs['clip_frac']:.4f}, 'grad_norm': {logs['grad_norm']:.4f}, "
        f"'completion_length': {logs['completion_len']:.2f}}}",
        flush=True,
    )


def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=print_logs) -> list[dict]:
    """
    Trains `policy` on `task` with a fresh [`GRPOTrainer`] for `steps` generation batches of `batch_size` prompts
    each, and returns the [`generation_batch_stats`] of every one.
    """
    accelerator = Accelerator()
    # every process samples its own prompts (the task samples them on the CPU) and its own completions
    torch.manual_seed(seed + accelerator.process_index)
    generator = torch.Generator().manual_seed(seed + accelerator.process_index)
    train_dataset = (task.sample_prompts(batch_size, generator) for _ in range(steps))

    history, step_logs = [], []

    def on_log(logs):
        step_logs.append(logs)
        if len(step_logs) == cfg.num_iterations:
            history.append({"step": len(history) + 1, **generation_batch_stats(step_logs)})
            step_logs.clear()
            log(history[-1])

    trainer = GRPOTrainer(
        policy, reward_funcs=task.reward, args=cfg, train_dataset=train_dataset, processing_class=task,
        callbacks=[on_log],
    )
    trainer.train()
    return history


if __name__ == "__main__":
    from lab import ModelConfig, SumTask, TinyLM

    # Set seed before initializing model
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(), dtype=torch.float64)  # float64 on the CPU: the same numbers on every machine
    task = SumTask()

    # Load the dataset: 40 generation batches of 16 prompts
    generator = torch.Generator().manual_seed(0)
    dataset = (task.sample_prompts(16, generator) for _ in range(40))

    # Set seed again before training: the sampling draws from it
    torch.manual_seed(0)

    # Initialize the GRPO trainer
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=task.reward,
        args=GRPOConfig(num_iterations=2),
        train_dataset=dataset,
        processing_class=task,
        callbacks=[print],
    )

    # Train the model
    trainer.train()
