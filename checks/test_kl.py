"""KL penalty: kl_penalty(). Run: pytest checks/test_kl.py [--target FILE]"""
import pytest
import torch

from checks import oracle
from checks.compare import at_least, close, shaped, worst
from checks.stubs import DRAWS, draw_loss_inputs, loss_and_grad, oracle_loss_and_grad, randint, rng

pytestmark = pytest.mark.component("kl")


@pytest.mark.parametrize("draw", DRAWS)
def test_kl_is_the_k3_estimator(grpo, seed, draw):
    gen = rng(seed, draw, 21)
    N, T = randint(gen, 1, 5), randint(gen, 1, 6)
    logp = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
    ref = logp + torch.randn(N, T, generator=gen, dtype=torch.float64)
    got = grpo.kl_penalty(logp, ref).detach().double()
    expected = oracle.kl_k3(logp, ref)
    assert got.shape == expected.shape, f"kl: shape {tuple(got.shape)}, expected {tuple(expected.shape)} (one per token)"
    if not close(got, expected, atol=1e-5, rtol=1e-4):
        i = worst(got, expected)
        d = (ref - logp).reshape(-1)[i].item()
        pytest.fail(f"kl: for log pi_ref - log pi = {d:+.3f} the penalty is {got.reshape(-1)[i]:.4f}; the k3 "
                    f"estimate of KL(pi || pi_ref) there is exp(d) - d - 1 = {expected.reshape(-1)[i]:.4f}")
    got32 = grpo.kl_penalty(logp.float(), ref.float()).detach().double()  # the precision a training loop runs in
    if not close(got32, expected, atol=1e-4, rtol=1e-3):
        i = worst(got32, expected)
        pytest.fail(f"kl: in float32, for log pi_ref - log pi = {(ref - logp).reshape(-1)[i]:+.3f} the penalty is "
                    f"{got32.reshape(-1)[i]:.4f} (in float64 {got.reshape(-1)[i]:.4f}); the k3 estimate there is "
                    f"{expected.reshape(-1)[i]:.4f}")


@pytest.mark.parametrize("draw", DRAWS)
def test_kl_is_never_negative_and_zero_at_the_reference(grpo, seed, draw):
    gen = rng(seed, draw, 22)
    logp = -torch.rand(4, 6, generator=gen) * 4
    ref = logp + torch.randn(4, 6, generator=gen) * 2
    got = shaped(grpo.kl_penalty(logp, ref), logp.shape, "kl: kl_penalty returned a tensor").detach()
    assert at_least(got, -1e-6), (
        f"kl: the penalty is {got.min():.3f} at its lowest over 24 tokens; expected never below 0")
    same = shaped(grpo.kl_penalty(logp, logp.clone()), logp.shape, "kl: kl_penalty returned a tensor").detach()
    assert close(same, 0.0, atol=1e-6), (
        f"kl: where log pi == log pi_ref the penalty is {same.abs().max():.3g}; expected 0")


@pytest.mark.parametrize("draw", DRAWS)
def test_kl_term_enters_with_beta(grpo, seed, draw):
    gen = rng(seed, draw, 46)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    beta = [0.04, 0.1, 0.5][draw]
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    with_kl, _ = loss_and_grad(grpo, logp, old, ref, adv, mask, grpo.GRPOConfig(beta=beta))
    without, _ = loss_and_grad(grpo, logp, old, ref, adv, mask, grpo.GRPOConfig(beta=0.0))
    kl = oracle.kl_k3(logp, ref)
    expected = beta * ((kl * mask).sum(1) / mask.sum(1)).mean()
    change = with_kl - without
    if not close(change, expected, atol=1e-6, rtol=1e-4):
        pytest.fail(f"kl: raising beta from 0 to {beta} changes the loss by {change:+.5f}; expected "
                    f"{expected:+.5f}, beta times the mean over rows of each row's mean k3 KL")


@pytest.mark.parametrize("draw", DRAWS)
def test_kl_gradient_pulls_towards_the_reference(grpo, seed, draw):
    gen = rng(seed, draw, 23)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    beta = [0.04, 0.1, 0.5][draw]
    logp, old, ref, _, mask = draw_loss_inputs(gen, N, T)
    adv = torch.zeros(N, dtype=torch.float64)  # no policy-gradient term: only the KL term can move logp
    cfg = grpo.GRPOConfig(beta=beta)
    _, expected = oracle_loss_and_grad(logp, old, ref, adv, mask, cfg)
    _, grad = loss_and_grad(grpo, logp, old, ref, adv, mask, cfg)
    if not close(grad, expected, atol=1e-7, rtol=1e-4):
        n, t = divmod(worst(grad, expected), T)
        pytest.fail(f"kl: with every advantage 0 and beta {beta}, d loss / d logp at row {n}, token {t} is "
                    f"{grad[n, t]:+.5f}; expected {expected[n, t]:+.5f} (log pi - log pi_ref there is "
                    f"{logp[n, t] - ref[n, t]:+.3f})")
