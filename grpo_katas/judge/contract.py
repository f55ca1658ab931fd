"""The contract as the judge holds it: the config's defaults, the rollout's fields, what each function returns.

The checks build configs and rollouts from these, never from the implementation under test; only a config's
overrides travel to the worker, where the implementation builds its own GRPOConfig from them. So the checks'
oracle and the implementation agree on every value the check set, and an implementation whose own defaults
depart from the contract's is judged by the contract's.
"""
from dataclasses import dataclass, fields

import torch

DEFAULTS = {
    "group_size": 8, "max_new_tokens": 8, "temperature": 1.0, "beta": 0.04, "clip_eps": 0.2, "adv_eps": 1e-4,
    "num_iterations": 1, "lr": 3e-3, "max_grad_norm": 1.0,
    # TRL's names and meanings; the defaults are the textbook loop above
    "loss_type": "grpo", "scale_rewards": "group", "clip_eps_high": None, "grad_accum_steps": 1, "is_cap": None,
    "importance_sampling_level": "token", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "delta": None,
    "top_entropy_quantile": 1.0, "mask_truncated_completions": False, "rollout_is_mode": None,
    "rollout_is_clip_min": None, "rollout_is_clip_max": 3.0, "use_bias_correction_kl": False,
    "off_policy_mask_threshold": None,
}

FUNCTIONS = ("generate", "completion_mask", "group_advantages", "token_logprobs", "token_entropies", "kl_penalty",
             "grpo_loss", "grpo_step", "train")

# what each function must return: a tensor, a rollout (an object with the Rollout fields), a dict, a list
RETURNS = {"generate": "rollout", "completion_mask": "tensor", "group_advantages": "tensor",
           "token_logprobs": "tensor", "token_entropies": "tensor", "kl_penalty": "tensor", "grpo_loss": "tensor",
           "grpo_step": "dict", "train": "list"}


class Config:
    """GRPOConfig as a check sees it: the contract's defaults with the check's overrides."""

    def __init__(self, **overrides):
        unknown = sorted(set(overrides) - set(DEFAULTS))
        if unknown:
            raise TypeError(f"GRPOConfig has no field(s) {unknown}")
        self.overrides = dict(overrides)
        self.__dict__.update({**DEFAULTS, **overrides})

    def __setattr__(self, name, value):
        if name != "overrides" and "overrides" in self.__dict__:
            raise AttributeError("a Config is frozen")
        super().__setattr__(name, value)

    def __repr__(self):
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in self.overrides.items())})"


@dataclass
class Rollout:
    input_ids: torch.Tensor        # (N, P+T)
    attention_mask: torch.Tensor   # (N, P+T)
    completion_mask: torch.Tensor  # (N, T)
    prompt_len: int                # P
    sampler_logp: torch.Tensor | None = None  # (N, T) log-prob of each token under the distribution it came from


ROLLOUT_FIELDS = tuple(f.name for f in fields(Rollout))[:4]   # required of every rollout; sampler_logp is optional


def check_return(fn: str, value) -> str | None:
    """Why `value` cannot be what `fn` returns under the contract, or None when its type fits."""
    kind = RETURNS[fn]
    if kind == "tensor" and not isinstance(value, torch.Tensor):
        return f"{fn} returned {_describe(value)}; the contract returns a tensor"
    if kind == "dict" and not isinstance(value, dict):
        return f"{fn} returned {_describe(value)}; the contract returns a dict of statistics"
    if kind == "list" and not isinstance(value, list):
        return f"{fn} returned {_describe(value)}; the contract returns a list with one dict per step"
    if kind == "rollout":
        missing = [f for f in ROLLOUT_FIELDS if not hasattr(value, f)]
        if missing:
            return f"{fn} returned {_describe(value)} without {', '.join(missing)}; the contract returns a Rollout"
    return None


def _describe(value) -> str:
    return "None" if value is None else f"a {type(value).__name__}" if not hasattr(value, "_type") \
        else f"a {value._type}"
