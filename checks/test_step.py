"""Update: grpo_step(). Run: pytest checks/test_step.py [--target FILE]"""
import copy
import math

import pytest
import torch

from checks import oracle
from checks.stubs import DRAWS, random_batch, randint, rng, sgd, tiny_lm

pytestmark = pytest.mark.component("update")
V = 12


def setup(grpo, gen, **cfg):
    policy = tiny_lm(gen, V)
    ref = copy.deepcopy(policy)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)  # the policy has drifted from the reference
    N_prompts, G = randint(gen, 2, 3), randint(gen, 2, 4)
    ids, att, comp_mask, P = random_batch(gen, N_prompts * G, V, randint(gen, 2, 3))  # T < N
    rollout = grpo.Rollout(input_ids=ids, attention_mask=att, completion_mask=comp_mask, prompt_len=P)
    # every group well spread (std >= 0.3), so eps is a rounding error next to it
    rewards = torch.stack([torch.randperm(G, generator=gen) for _ in range(N_prompts)]).float().view(-1) / (G - 1)
    rewards = rewards + 0.05 * torch.rand(N_prompts * G, generator=gen)
    return policy, ref, rollout, rewards, grpo.GRPOConfig(group_size=G, **cfg)


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run_both(grpo, policy, ref, rollout, rewards, cfg, lr, stale_grads=False):
    """The update the target makes, and the one the oracle makes, from the same start."""
    twin = copy.deepcopy(policy)
    if stale_grads:
        for p in policy.parameters():
            p.grad = torch.full_like(p, 3.0)  # left over from somewhere else
    start = params(policy)
    opt = sgd(policy, lr)
    stats = grpo.grpo_step(policy, ref, opt, rollout, rewards, cfg)
    oracle.grpo_step(twin, ref, lr, rollout, rewards, cfg)
    return params(policy) - start, params(twin) - start, opt, stats


def relative_error(got, expected):
    return ((got - expected).norm() / expected.norm().clamp(min=1e-12)).item()


@pytest.mark.parametrize("draw", DRAWS)
def test_one_step_moves_the_policy_like_the_oracle(grpo, seed, draw):
    gen = rng(seed, draw, 51)
    mu, beta = [1, 2, 3][draw], [0.04, 0.0, 0.1][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, num_iterations=mu, beta=beta, max_grad_norm=0.5)
    got, expected, _, stats = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=2.0)
    err = relative_error(got, expected)
    assert err < 2e-3, (
        f"update: one grpo_step (num_iterations {mu}, beta {beta}) moves the parameters {got.norm():.4f} where the "
        f"oracle's step moves them {expected.norm():.4f}; they differ by {err:.1%} of the step")
    assert isinstance(stats, dict) and all(k in stats for k in ("loss", "kl")), (
        "update: grpo_step should return a dict with at least 'loss' and 'kl'")
    assert all(isinstance(stats[k], float) and math.isfinite(stats[k]) for k in ("loss", "kl")), (
        f"update: grpo_step reports loss {stats['loss']!r} and kl {stats['kl']!r}; both should be finite floats")


@pytest.mark.parametrize("draw", DRAWS)
def test_stale_gradients_are_cleared(grpo, seed, draw):
    gen = rng(seed, draw, 52)
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, max_grad_norm=1e6)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.01, stale_grads=True)
    err = relative_error(got, expected)
    assert err < 2e-3, (
        f"update: with gradients left over in the parameters before the call, the step is off by {err:.0%} "
        f"({got.norm():.4f} vs {expected.norm():.4f}); each optimizer step should use this loss's gradient alone")


@pytest.mark.parametrize("draw", DRAWS)
def test_gradient_is_clipped_before_the_step(grpo, seed, draw):
    gen = rng(seed, draw, 53)
    max_norm = [1e-3, 1e-2, 3e-3][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, max_grad_norm=max_norm, beta=0.1)
    got, _, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=1.0)
    assert got.norm() <= max_norm * 1.001 + 1e-9, (
        f"update: with max_grad_norm {max_norm} and SGD at lr 1 the step has norm {got.norm():.4g}; the "
        f"gradient should be clipped to max_grad_norm before the optimizer steps")


@pytest.mark.parametrize("draw", DRAWS)
def test_one_optimizer_step_per_iteration(grpo, seed, draw):
    gen = rng(seed, draw, 54)
    mu = [2, 3, 4][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, num_iterations=mu)
    _, _, opt, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.05)
    assert opt.steps == mu, (
        f"update: with num_iterations {mu} the optimizer stepped {opt.steps} time(s); each batch of rollouts "
        f"should give num_iterations policy updates")


@pytest.mark.parametrize("draw", DRAWS)
def test_policy_gradient_flows_through_the_ratio(grpo, seed, draw):
    gen = rng(seed, draw, 55)
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, beta=0.0, max_grad_norm=1e6)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.1)
    assert got.norm() > 0.1 * expected.norm(), (
        f"update: with beta 0 one step moves the policy by {got.norm():.3g} where the policy gradient moves it "
        f"by {expected.norm():.3g}; the ratio pi / pi_old carries no gradient (is pi_old a constant?)")


def test_reference_is_never_updated(grpo, seed):
    gen = rng(seed, 0, 56)
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, num_iterations=2, beta=0.1)
    before = params(ref)
    grpo.grpo_step(policy, ref, sgd(policy, 0.1), rollout, rewards, cfg)
    assert torch.equal(params(ref), before), "update: grpo_step changed the reference policy's weights"
    grads = [p.grad for p in ref.parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert not grads, (
        f"update: {len(grads)} reference parameter(s) received gradients; pi_ref is frozen, so its log-probs "
        f"should be computed under no_grad")
