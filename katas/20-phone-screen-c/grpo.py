"""GRPO trainer for small causal language models.

A `GRPOTrainer` owns the policy, the reference model and the optimizer, and runs the Group Relative
Policy Optimization loop (DeepSeekMath, https://huggingface.co/papers/2402.03300): generate a group of
completions per prompt, score them, turn the rewards into advantages, and optimize the clipped surrogate
objective with a KL penalty. The functions at module level (`generate`, `group_advantages`, `token_logprobs`,
`kl_penalty`, `grpo_loss`, `grpo_step`, `train`) are the functional interface to the same code.
"""
# style: Hugging Face TRL, trl/trainer/grpo_trainer.py (GRPOTrainer) and trl/trainer/utils.py: a trainer class, docstrings in the transformers format.

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
            Number of completions to generate for each prompt (`num_generations` in TRL). Must be at least 2.
        max_new_tokens (`int`, *optional*, defaults to `8`):
            Maximum length of a generated completion (`max_completion_length` in TRL).
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
            Number of micro-batches the generation batch is split into for the backward passes of one update.
        beta (`float`, *optional*, defaults to `0.04`):
            KL coefficient. If `0.0`, the KL term does not enter the loss.
        clip_eps (`float`, *optional*, defaults to `0.2`):
            Epsilon value for clipping (`epsilon` in TRL).
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
        is_cap (`float`, *optional*):
            Truncation cap for the per-token importance sampling correction between the policy that scores the
            batch and the sampler that generated it (`vllm_importance_sampling_clip_max` in TRL, `token_truncate`
            mode). If `None`, no correction is applied.
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

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"GRPO requires at least 2 generations per prompt, got group_size={self.group_size}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}.")
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo"):
            raise ValueError(f"Unknown loss type: {self.loss_type}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(
                f"Invalid value for scale_rewards: {self.scale_rewards}. Must be one of 'batch', 'group', or 'none'."
            )
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be at least 1, got {self.grad_accum_steps}.")


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


def split_tensor_dict(tensor_dict: dict, num_chunks: int) -> list[dict]:
    """
    Splits a dictionary of tensors along the first dimension into `num_chunks` contiguous parts whose sizes differ by
    at most one (`torch.tensor_split`). Scalars and `None` values are passed to every chunk unchanged.

    Example:
    ```python
    >>> split_tensor_dict({"x": torch.arange(5)}, 2)
    [{"x": tensor([0, 1, 2])}, {"x": tensor([3, 4])}]
    ```
    """
    chunks = [{} for _ in range(num_chunks)]
    for key, value in tensor_dict.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            for chunk, part in zip(chunks, torch.tensor_split(value, num_chunks, dim=0)):
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
    return (sequence_indices < eos_idx.unsqueeze(1)).float()


@torch.no_grad()
def generate(
    policy, prompt_ids, prompt_mask, cfg: GRPOConfig, *, eos_id: int, pad_id: int, generator=None
) -> Rollout:
    """
    Samples `cfg.group_size` completions for every prompt.

    Args:
        policy (`torch.nn.Module`):
            Model to sample from. If it has a `make_cache()` method, its KV cache is used.
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
        [`Rollout`]: `B * group_size` rows.
    """
    input_ids = prompt_ids.repeat_interleave(cfg.group_size, dim=0)
    attention_mask = prompt_mask.repeat_interleave(cfg.group_size, dim=0)
    prompt_len = input_ids.size(1)
    is_finished = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)
    cache = policy.make_cache() if hasattr(policy, "make_cache") else None
    next_input_ids = input_ids
    sampling_logps = []
    for _ in range(cfg.max_new_tokens):
        if cache is not None:
            logits = policy(next_input_ids, attention_mask, cache=cache)[:, -1, :]
        else:
            logits = policy(input_ids, attention_mask)[:, -1, :]
        logits = logits.float() / cfg.temperature
        next_tokens = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
        sampling_logps.append(selective_log_softmax(logits, next_tokens).masked_fill(is_finished, 0.0))
        next_tokens = next_tokens.masked_fill(is_finished, pad_id)
        input_ids = torch.cat([input_ids, next_tokens.unsqueeze(1)], dim=1)
        attention_mask = torch.cat([attention_mask, (~is_finished).to(attention_mask.dtype).unsqueeze(1)], dim=1)
        is_finished = is_finished | (next_tokens == eos_id)
        next_input_ids = next_tokens.unsqueeze(1)
        if is_finished.all():
            break
    return Rollout(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask(input_ids[:, prompt_len:], eos_id),
        prompt_len=prompt_len,
        sampler_logp=torch.stack(sampling_logps, dim=1),
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
    rewards = rewards.detach().float()
    mean_grouped_rewards = rewards.view(-1, group_size).mean(dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(group_size, dim=0)
    if scale in ["group", "none"]:
        # If scale = "none", std_rewards is not used
        std_rewards = rewards.view(-1, group_size).std(dim=1, correction=0)
        std_rewards = std_rewards.repeat_interleave(group_size, dim=0)
    elif scale == "batch":
        std_rewards = rewards.std().expand_as(rewards)
    else:
        raise ValueError(f"Invalid value for scale_rewards: {scale}. Must be one of 'batch', 'group', or 'none'.")

    advantages = rewards - mean_grouped_rewards
    if scale != "none":
        advantages = advantages / (std_rewards + eps)
    return advantages


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
        `torch.Tensor` of shape `(N, T)`, float32.
    """
    logits_to_keep = input_ids.size(1) - prompt_len  # we only need to compute the logits for the completion tokens
    logits = model(input_ids, attention_mask).float()
    logits = logits[:, :-1, :]  # (N, L-1, V)
    logits = logits[:, -logits_to_keep:, :]  # (N, T, V)
    logits.div(temperature)
    completion_ids = input_ids[:, -logits_to_keep:]
    return selective_log_softmax(logits, completion_ids)


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
) -> torch.Tensor:
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
            Number of active tokens in the global accumulated batch (`num_items_in_batch / num_processes` in TRL),
            used by `loss_type="dapo"`. Defaults to the number of active tokens in this batch.
        sampler_logp (`torch.Tensor` of shape `(N, T)`, *optional*):
            Log-probabilities under the sampler, for the importance sampling correction (`args.is_cap`).

    Returns:
        `torch.Tensor`: scalar loss.
    """
    mask = completion_mask.bool()
    per_token_logps = per_token_logps.masked_fill(~mask, 0.0)
    old_per_token_logps = old_per_token_logps.masked_fill(~mask, 0.0)
    advantages = advantages.unsqueeze(1)
    epsilon_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps

    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - args.clip_eps, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)

    if args.is_cap is not None and sampler_logp is not None:
        per_token_logps_diff = (old_per_token_logps - sampler_logp).masked_fill(~mask, 0.0)
        importance_sampling_ratio = torch.clamp(torch.exp(per_token_logps_diff), max=args.is_cap)
        per_token_loss = per_token_loss * importance_sampling_ratio.detach()

    if args.beta != 0.0:
        per_token_kl = kl_penalty(per_token_logps, ref_per_token_logps.masked_fill(~mask, 0.0))
        per_token_loss = per_token_loss - args.beta * per_token_kl

    mask = mask.to(per_token_loss.dtype)
    if args.loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif args.loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif args.loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * args.max_new_tokens)
    elif args.loss_type == "dapo":
        normalizer = mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens
        loss = (per_token_loss * mask).sum() / normalizer
    else:
        raise ValueError(f"Unknown loss type: {args.loss_type}")
    return loss


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
        args ([`GRPOConfig`], *optional*):
            Configuration for this trainer. If `None`, a default configuration is used.
        ref_model (`torch.nn.Module`, *optional*):
            Reference model for the KL penalty. If `None`, it is created from `model`.
        optimizer (`torch.optim.Optimizer`, *optional*):
            Optimizer for `model`. If `None`, `torch.optim.AdamW` with learning rate `args.lr`.
    """

    def __init__(self, model, args: Optional[GRPOConfig] = None, ref_model=None, optimizer=None):
        self.model = model
        self.args = args if args is not None else GRPOConfig()
        args = self.args
        self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model).requires_grad_(False)
        self.optimizer = optimizer if optimizer is not None else torch.optim.AdamW(model.parameters(), lr=args.lr)
        # With several processes the model is trained through DistributedDataParallel, as `accelerator.prepare`
        # would wrap it (gradients are averaged across processes); generation uses the bare model.
        wrap = self.num_processes > 1 and not isinstance(model, DistributedDataParallel)
        self.model_wrapped = DistributedDataParallel(model) if wrap else model

        # Training arguments
        self.num_generations = args.group_size
        self.max_completion_length = args.max_new_tokens
        self.temperature = args.temperature
        self.beta = args.beta
        self.epsilon_low = args.clip_eps
        self.epsilon_high = args.clip_eps_high if args.clip_eps_high is not None else args.clip_eps
        self.loss_type = args.loss_type
        self.scale_rewards = args.scale_rewards
        self.num_iterations = args.num_iterations
        self.current_gradient_accumulation_steps = args.grad_accum_steps
        self.use_importance_sampling_correction = args.is_cap is not None

        self._metrics = defaultdict(list)
        self._step = 0

    @property
    def num_processes(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep) -> torch.Tensor:
        """Per-token log-probabilities of the last `logits_to_keep` tokens, computed micro-batch by micro-batch."""
        prompt_len = input_ids.size(1) - logits_to_keep
        all_logps = []
        for ids, mask in zip(
            torch.tensor_split(input_ids, self.current_gradient_accumulation_steps),
            torch.tensor_split(attention_mask, self.current_gradient_accumulation_steps),
        ):
            if ids.size(0) > 0:
                all_logps.append(token_logprobs(model, ids, mask, prompt_len, self.temperature))
        return torch.cat(all_logps, dim=0)

    def _compute_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_advantages(rewards, self.num_generations, self.args.adv_eps, self.scale_rewards)

    def _score_completions(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        """
        Turns a generation batch and its rewards into the inputs of [`training_step`]: advantages, the old and the
        reference per-token log-probabilities, and the number of active tokens in the global batch.
        """
        prompt_completion_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        logits_to_keep = prompt_completion_ids.size(1) - rollout.prompt_len
        advantages = self._compute_advantages(rewards)

        with torch.no_grad():
            old_per_token_logps = self._get_per_token_logps(
                self.model, prompt_completion_ids, attention_mask, logits_to_keep
            )
            ref_per_token_logps = self._get_per_token_logps(
                self.ref_model, prompt_completion_ids, attention_mask, logits_to_keep
            )

        num_items_in_batch = rollout.completion_mask.sum().float()
        if self.num_processes > 1:
            dist.all_reduce(num_items_in_batch)

        self._metrics["adv_std"].append(advantages.std().item())
        self._metrics["completion_len"].append(rollout.completion_mask.sum(dim=1).float().mean().item())
        return {
            "prompt_completion_ids": prompt_completion_ids,
            "attention_mask": attention_mask,
            "completion_mask": rollout.completion_mask,
            "advantages": advantages,
            "old_per_token_logps": old_per_token_logps,
            "ref_per_token_logps": ref_per_token_logps,
            "sampling_per_token_logps": rollout.sampler_logp if self.use_importance_sampling_correction else None,
            "num_items_in_batch": num_items_in_batch,
            "num_sequences": torch.tensor(prompt_completion_ids.size(0)),
        }

    def _generate_and_score_completions(self, prompt_ids, prompt_mask, reward_func: Callable, eos_token_id: int,
                                        pad_token_id: int, generator=None) -> tuple[dict, torch.Tensor]:
        """Generates `num_generations` completions per prompt, scores them with `reward_func` and prepares them."""
        rollout = generate(self.model, prompt_ids, prompt_mask, self.args, eos_id=eos_token_id, pad_id=pad_token_id,
                           generator=generator)
        rewards = reward_func(rollout).to(prompt_ids.device)
        return self._score_completions(rollout, rewards), rewards

    def compute_loss(self, model, inputs: dict) -> torch.Tensor:
        """Loss of one micro-batch."""
        completion_mask = inputs["completion_mask"]
        logits_to_keep = completion_mask.size(1)
        per_token_logps = token_logprobs(
            model,
            inputs["prompt_completion_ids"],
            inputs["attention_mask"],
            inputs["prompt_completion_ids"].size(1) - logits_to_keep,
            self.temperature,
        )
        loss = grpo_loss(
            per_token_logps,
            per_token_logps,
            inputs["ref_per_token_logps"],
            inputs["advantages"],
            completion_mask,
            self.args,
            num_tokens=inputs["num_items_in_batch"].clamp(min=1.0) / self.num_processes,
            sampler_logp=inputs["sampling_per_token_logps"],
        )
        if self.loss_type in ["grpo", "dr_grpo"]:
            loss = loss * per_token_logps.size(0) / inputs["num_sequences"]
        elif self.loss_type == "bnpo":
            loss = loss / self.current_gradient_accumulation_steps
        self._log_micro_batch_metrics(per_token_logps.detach(), inputs)
        return loss

    @torch.no_grad()
    def _log_micro_batch_metrics(self, per_token_logps, inputs):
        mask = inputs["completion_mask"].bool()
        advantages = inputs["advantages"].unsqueeze(1)
        per_token_logps = per_token_logps.masked_fill(~mask, 0.0)
        coef_1 = torch.exp(per_token_logps - inputs["old_per_token_logps"].masked_fill(~mask, 0.0))
        per_token_kl = kl_penalty(per_token_logps, inputs["ref_per_token_logps"].masked_fill(~mask, 0.0))
        is_low_clipped = (coef_1 < 1 - self.epsilon_low) & (advantages < 0)
        is_high_clipped = (coef_1 > 1 + self.epsilon_high) & (advantages > 0)
        is_region_clipped = (is_low_clipped | is_high_clipped) & mask
        self._metrics["kl_sum"].append(per_token_kl[mask].sum().item())
        self._metrics["clipped_sum"].append(is_region_clipped.sum().item())
        self._metrics["token_count"].append(mask.sum().item())
        self._metrics["ratio_dev"].append((coef_1 - 1).abs().max().item() if coef_1.numel() else 0.0)

    def training_step(self, inputs: dict) -> dict:
        """
        Performs `num_iterations` optimization steps on one generation batch, accumulating gradients over
        `grad_accum_steps` micro-batches.

        Returns:
            `dict`: `loss` and `kl` of the first iteration, `ratio_dev` (the largest |ratio - 1| over the completion
            tokens of the first iteration), `clip_frac` and `grad_norm` of the last iteration, `adv_std` and
            `completion_len`.
        """
        logs = {}
        for iteration in range(self.num_iterations):
            for key in ("kl_sum", "clipped_sum", "token_count", "ratio_dev"):
                self._metrics[key].clear()
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for micro_batch in split_tensor_dict(inputs, self.current_gradient_accumulation_steps):
                if micro_batch["completion_mask"].size(0) == 0:
                    continue
                loss = self.compute_loss(self.model_wrapped, micro_batch)
                loss.backward()
                total_loss += loss.detach().item()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
            self.optimizer.step()

            num_tokens = max(sum(self._metrics["token_count"]), 1.0)
            if iteration == 0:
                logs["loss"] = total_loss
                logs["kl"] = sum(self._metrics["kl_sum"]) / num_tokens
                logs["ratio_dev"] = max(self._metrics["ratio_dev"])
            logs["clip_frac"] = sum(self._metrics["clipped_sum"]) / num_tokens
            logs["grad_norm"] = grad_norm.item()
        logs["adv_std"] = self._metrics["adv_std"][-1]
        logs["completion_len"] = self._metrics["completion_len"][-1]
        self._step += 1
        return logs

    def train(self, task, *, steps: int, batch_size: int, seed: int, log: Optional[Callable] = None) -> list[dict]:
        """
        Main training entry point.

        Args:
            task:
                Provides `sample_prompts(batch_size, generator)`, `reward(rollout)`, `eos_id` and `pad_id`.
            steps (`int`):
                Number of generation batches to train on.
            batch_size (`int`):
                Number of prompts per generation batch.
            seed (`int`):
                Seed for the prompt and sampling generators.
            log (`Callable`, *optional*):
                Called with the metrics of every step.

        Returns:
            `list[dict]`: the metrics of every step.
        """
        device = next(self.model.parameters()).device
        process_index = dist.get_rank() if self.num_processes > 1 else 0
        # the task samples prompts on the CPU; every process draws its own prompts and completions
        prompt_generator = torch.Generator().manual_seed(seed + process_index)
        sampling_generator = torch.Generator(device=device).manual_seed(seed + process_index)
        history = []
        for step in range(1, steps + 1):
            prompt_ids, prompt_mask = task.sample_prompts(batch_size, prompt_generator)
            inputs, rewards = self._generate_and_score_completions(
                prompt_ids.to(device), prompt_mask.to(device), task.reward, task.eos_id, task.pad_id,
                generator=sampling_generator,
            )
            logs = self.training_step(inputs)
            logs = {"step": step, "reward_mean": rewards.mean().item(), "reward_max": rewards.max().item(), **logs}
            history.append(logs)
            if log is not None:
                log(logs)
        return history


# ----------------------------------------------------------------------------------------------------------------------
# Functional interface


def grpo_step(policy, ref_policy, optimizer, rollout: Rollout, rewards: torch.Tensor, cfg: GRPOConfig) -> dict:
    """One [`GRPOTrainer.training_step`] on a generation batch that was already sampled and rewarded."""
    trainer = GRPOTrainer(policy, cfg, ref_model=ref_policy, optimizer=optimizer)
    return trainer.training_step(trainer._score_completions(rollout, rewards))


def print_logs(logs: dict) -> None:
    print(
        f"{{'step': {logs['step']}, 'reward': {logs['reward_mean']:.4f}, 'kl': {logs['kl']:.4f}, "
        f"'loss': {logs['loss']:.4f}, 'clip_ratio': {logs['clip_frac']:.4f}, 'grad_norm': {logs['grad_norm']:.4f}, "
        f"'completion_length': {logs['completion_len']:.2f}}}",
        flush=True,
    )


def train(policy, task, cfg: GRPOConfig, *, steps: int, batch_size: int, seed: int, log=print_logs) -> list[dict]:
    """Trains `policy` on `task` with a fresh [`GRPOTrainer`] and returns the metrics of every step."""
    torch.manual_seed(seed)
    trainer = GRPOTrainer(policy, cfg)
    return trainer.train(task, steps=steps, batch_size=batch_size, seed=seed, log=log)


if __name__ == "__main__":
    from lab import ModelConfig, SumTask, TinyLM

    torch.manual_seed(0)
    train(TinyLM(ModelConfig()), SumTask(), GRPOConfig(num_iterations=2), steps=40, batch_size=16, seed=0)
