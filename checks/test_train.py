"""Training: train(). Run: pytest checks/test_train.py [--target FILE]

A learning curve is a noisy statistic, so this end-to-end check trains at one fixed seed whatever --seed
says (the unit checks vary their draws with --seed). The improvement is measured by this file's own sampler
on a fixed set of prompts, before and after training: a measure of the policy, not of the sampler under test.
"""
import math

import pytest
import torch

from checks.oracle import expected_reward
from checks.stubs import memo
from lab import ModelConfig, SumTask, TinyLM, encode, left_pad

pytestmark = pytest.mark.component("training")
STEPS, SEED = 32, 0
TASK = SumTask(max_target=6)
EVAL_PROMPTS = left_pad([encode(f"{t}=") for t in range(1, 7)])


def evaluate(policy) -> float:
    return expected_reward(policy, TASK, *EVAL_PROMPTS, samples=64, max_new_tokens=4, seed=SEED)


@pytest.fixture(scope="module")
def run(grpo):
    torch.manual_seed(SEED)
    policy = TinyLM(ModelConfig(d_model=32, n_layer=1, n_head=2, max_len=16))
    cfg = grpo.GRPOConfig(group_size=8, max_new_tokens=4, lr=1e-2)
    before = memo(evaluate, policy)
    history = grpo.train(policy, TASK, cfg, steps=STEPS, batch_size=8, seed=SEED)
    finite = all(torch.isfinite(p).all() for p in policy.parameters())
    return before, evaluate(policy) if finite else float("nan"), history


def test_history_has_one_entry_per_step(run):
    _, _, history = run
    assert isinstance(history, list) and len(history) == STEPS, (
        f"training: train(steps={STEPS}) returned {len(history) if isinstance(history, list) else history!r} "
        f"entries; expected one stats dict per step")
    for key in ("reward_mean", "kl", "loss"):
        values = [h.get(key) for h in history]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in values), (
            f"training: the per-step {key!r} values are {values}; expected finite numbers every step")


def test_training_raises_the_reward(run):
    before, after, _ = run
    assert math.isfinite(after), f"training: after {STEPS} steps the policy's weights hold NaN or inf"
    assert after > before + 0.15, (
        f"training: {STEPS} steps on the sum task took the policy's mean reward from {before:.2f} to {after:.2f}; "
        f"a working GRPO loop gains well over 0.15 here (the reference gains about 0.45)")


def test_reference_stays_frozen_while_the_policy_moves(run):
    kls = [h["kl"] for h in run[2]]
    assert max(kls[1:]) > 1e-4, (
        f"training: the KL to the reference stays at {max(kls[1:]):.2g} while the policy trains; the reference "
        f"should be a frozen copy of the starting policy, not the policy itself or a copy refreshed every step")
