"""Stand-in models: logits from a rule instead of a network, recording how they are called.

Both sides know them by name, so a check builds one, the judge sends its rule and parameters, and the worker
builds the same model; afterwards the worker's record of the calls (how many, with grad on or off) comes back
and is added to the check's copy. A dummy weight makes grad mode visible.
"""
import torch
import torch.nn as nn


def constant(input_ids, logits):
    """Every position gets the same next-token logits (V,)."""
    return logits.expand(input_ids.shape[0], input_ids.shape[1], -1).clone()


def eos_after(input_ids, vocab_size, eos_id, prompt_len, k):
    """Uniform over the non-EOS tokens for the first k completion tokens, then EOS with certainty."""
    N, L = input_ids.shape
    out = torch.zeros(N, L, vocab_size)
    out[..., eos_id] = -1e9
    if L - prompt_len >= k:
        out[:, -1] = -1e9
        out[:, -1, eos_id] = 0.0
    return out


RULES = {"constant": constant, "eos_after": eos_after}


class StandIn(nn.Module):
    def __init__(self, rule: str, **params):
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"unknown stand-in rule {rule!r}")
        self.rule, self.params = rule, params
        self.weight = nn.Parameter(torch.zeros(()))
        self.calls = 0
        self.grad_enabled = []

    def forward(self, input_ids, attention_mask):
        self.calls += 1
        self.grad_enabled.append(torch.is_grad_enabled())
        return RULES[self.rule](input_ids, **self.params) + self.weight
