"""Advantages: group_advantages(). Run: pytest checks/test_advantages.py [--target FILE]"""
import pytest
import torch

from checks import oracle
from checks.compare import close, shaped, worst
from checks.stubs import DRAWS, randint, rng, rounded

pytestmark = pytest.mark.component("advantages")


def advantages(grpo, rewards, G, eps=1e-4):
    a = shaped(grpo.group_advantages(rewards, G, eps), rewards.shape, "advantages: group_advantages returned a tensor")
    return a.detach().double().cpu()


@pytest.mark.parametrize("draw", DRAWS)
def test_each_group_is_its_own_baseline(grpo, seed, draw):
    gen = rng(seed, draw, 11)
    B, G = randint(gen, 2, 5), randint(gen, 2, 6)
    level = torch.randn(B, 1, generator=gen) * 3           # groups sit at very different reward levels
    rewards = (level + torch.rand(B, G, generator=gen)).view(-1)
    a = advantages(grpo, rewards, G).view(B, G)
    means = a.mean(dim=1)
    g = worst(means, 0.0)
    assert close(means, 0.0, atol=1e-4), (
        f"advantages: the advantages of rows {g * G}..{g * G + G - 1} (group {g} of {B}, group_size "
        f"{G}) have mean {means[g]:.3f}; expected 0.000 for every group")


@pytest.mark.parametrize("draw", DRAWS)
def test_groups_are_contiguous_runs(grpo, seed, draw):
    gen = rng(seed, draw, 12)
    B, G = randint(gen, 2, 4), randint(gen, 2, 5)
    level = torch.randint(0, 2, (B, 1), generator=gen).float()
    level[:2, 0] = torch.tensor([0.0, 1.0])                # at least one solved and one failed prompt
    rewards = level.expand(B, G).reshape(-1)                # constant within each prompt's group
    a = advantages(grpo, rewards, G)
    assert close(a, 0.0, atol=1e-6), (
        f"advantages: rewards constant within each run of {G} rows ({rounded(rewards, 3)}) give advantages "
        f"{rounded(a, 3)}; expected all 0")


@pytest.mark.parametrize("draw", DRAWS)
def test_std_is_the_unbiased_group_std(grpo, seed, draw):
    gen = rng(seed, draw, 13)
    lo, hi = sorted(torch.rand(2, generator=gen).tolist())
    a = advantages(grpo, torch.tensor([lo, hi, hi, lo]), 2, eps=0.0)
    expected = torch.tensor([-1, 1, 1, -1], dtype=torch.float64) * 2 ** -0.5
    assert close(a, expected, atol=1e-4), (
        f"advantages: rewards [{lo:.3f}, {hi:.3f}] with group_size 2 and eps 0 give {rounded(a[:2], 4)}; "
        f"expected [-0.7071, 0.7071]")


@pytest.mark.parametrize("draw", DRAWS)
def test_equal_rewards_give_zero_not_nan(grpo, seed, draw):
    gen = rng(seed, draw, 14)
    G = randint(gen, 2, 8)
    value = float(torch.rand((), generator=gen))
    rewards = torch.cat([torch.full((G,), value), torch.rand(G, generator=gen)])
    a = advantages(grpo, rewards, G)
    assert torch.isfinite(a).all(), (
        f"advantages: a group whose {G} rewards are all {value:.3f} gives {rounded(a[:G], 6)}; expected "
        f"finite values (0)")
    assert close(a[:G], 0.0, atol=1e-3), (
        f"advantages: a group whose {G} rewards are all {value:.3f} gives advantages up to "
        f"{a[:G].abs().max():.3g} in size; expected 0")


@pytest.mark.parametrize("draw", DRAWS)
def test_advantages_match_the_formula(grpo, seed, draw):
    gen = rng(seed, draw, 15)
    B, G = randint(gen, 1, 4), randint(gen, 2, 6)
    eps = [1e-4, 1e-2, 0.5][draw]
    rewards = torch.where(torch.rand(B * G, generator=gen) < 0.5, torch.rand(B * G, generator=gen),
                          torch.randint(0, 2, (B * G,), generator=gen).float())
    a = advantages(grpo, rewards, G, eps)
    expected = oracle.group_advantages(rewards, G, eps)
    assert a.shape == expected.shape, f"advantages: shape {tuple(a.shape)}, expected {tuple(expected.shape)} (one per row)"
    assert close(a, expected, atol=1e-4, rtol=1e-4), (
        f"advantages: with group_size {G} and eps {eps}, rewards {rounded(rewards, 3)} give "
        f"{rounded(a, 3)}; expected {rounded(expected, 3)}")


def test_no_gradient_flows_out_of_the_advantages(grpo, seed):
    gen = rng(seed, 0, 16)
    rewards = torch.rand(8, generator=gen).requires_grad_()
    a = shaped(grpo.group_advantages(rewards, 4, 1e-4), rewards.shape, "advantages: group_advantages returned a tensor")
    assert not a.requires_grad, (
        "advantages: for rewards that require grad, group_advantages returns a tensor that requires grad; "
        "expected one that does not")


@pytest.mark.parametrize("draw", DRAWS)
def test_rewards_scale_as_configured(grpo, seed, draw):
    gen = rng(seed, draw, 17)
    B, G = randint(gen, 2, 4), randint(gen, 2, 5)
    scale = ["batch", "none", "batch"][draw]
    level = torch.randn(B, 1, generator=gen) * 2             # groups at different levels and spreads
    rewards = (level + torch.rand(B, G, generator=gen) * torch.rand(B, 1, generator=gen) * 3).view(-1)
    a = grpo.group_advantages(rewards, G, 1e-4, scale=scale).detach().double().cpu()
    expected = oracle.group_advantages(rewards, G, 1e-4, scale)
    assert a.shape == expected.shape and close(a, expected, atol=1e-4, rtol=1e-4), (
        f"advantages: with scale_rewards {scale!r}, group_size {G}, rewards {rounded(rewards, 3)} give "
        f"{rounded(a, 3)}; expected {rounded(expected, 3)}")
