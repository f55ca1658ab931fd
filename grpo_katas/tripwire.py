"""Notice a submission that tampers with what judges it.

Snapshot the callables the checks and pytest's reporting rely on before the submission is imported; compare
them after every check. Any difference is reported by name. This catches monkeypatching by ordinary code; a
submission that also finds and patches this module can hide, which is why the README's threat model says to
grade untrusted code in a container.
"""
import builtins
import inspect
import math
import sys
from pathlib import Path

import _pytest.reports
import _pytest.runner
import pytest
import torch

CONTRACT = ["GRPOConfig", "Rollout", "generate", "completion_mask", "group_advantages", "token_logprobs",
            "kl_penalty", "grpo_loss", "grpo_step", "train"]

WATCHED = [
    (torch, ["allclose", "isclose", "equal", "isfinite", "isnan", "stack", "cat", "zeros_like", "full_like",
             "softmax", "log_softmax", "bincount", "autograd"]),
    (torch.autograd, ["grad", "backward"]),
    (torch.Tensor, ["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__abs__", "__sub__", "__float__",
                    "abs", "max", "min", "sum", "mean", "norm", "all", "any", "item", "tolist", "double", "float",
                    "backward", "clone", "detach"]),
    (torch.nn.utils, ["clip_grad_norm_"]),
    (math, ["isfinite", "isclose"]),
    (builtins, ["abs", "all", "any", "float", "isinstance", "len", "max", "min", "sum", "print", "open"]),
    (pytest, ["fail", "approx", "raises"]),
    (_pytest.runner, ["call_and_report", "runtestprotocol", "check_interactive_exception", "call_runtest_hook"]),
    (_pytest.reports.TestReport, ["from_item_and_call", "__init__"]),
    (_pytest.reports.BaseReport, ["passed", "failed", "outcome"]),
]


class Tripwire:
    def __init__(self):
        self.snapshot = {self._name(owner, attr): owner.__dict__.get(attr, getattr(owner, attr, None))
                         if isinstance(owner, type) else getattr(owner, attr, None)
                         for owner, attrs in WATCHED for attr in attrs}
        self.owners = {self._name(owner, attr): (owner, attr) for owner, attrs in WATCHED for attr in attrs}
        self.tampered = []

    @staticmethod
    def _name(owner, attr):
        return f"{getattr(owner, '__module__', '') + '.' if isinstance(owner, type) else ''}{owner.__name__}.{attr}"

    def check(self) -> list:
        for name, (owner, attr) in self.owners.items():
            now = owner.__dict__.get(attr, getattr(owner, attr, None)) if isinstance(owner, type) \
                else getattr(owner, attr, None)
            if now is not self.snapshot[name] and name not in self.tampered:
                self.tampered.append(name)
        return self.tampered


def foreign_origins(module, forbidden_roots) -> list:
    """Contract names the submission does not define itself, and loaded modules from forbidden places."""
    problems = []
    own = Path(module.__file__).resolve()
    for name in CONTRACT:
        obj = getattr(module, name, None)
        if obj is None:
            continue
        try:
            src = Path(inspect.getfile(inspect.unwrap(obj))).resolve()
        except (TypeError, OSError):
            continue
        if src != own:
            problems.append(f"{name} is defined in {src}, not in the submission")
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and any(Path(f).resolve().is_relative_to(r) for r in forbidden_roots):
            problems.append(f"the submission loaded {Path(f).resolve()}")
    return sorted(set(problems))
