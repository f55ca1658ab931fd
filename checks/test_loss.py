"""Loss: grpo_loss(). Run: pytest checks/test_loss.py [--target FILE]"""
import pytest
import torch

from checks.compare import at_least, close, worst
from checks.stubs import (DRAWS, draw_loss_inputs, loss_and_grad, oracle_loss_and_grad, poisoned, randint, rng,
                          rounded)

pytestmark = pytest.mark.component("loss")


@pytest.mark.parametrize("draw", DRAWS)
def test_loss_matches_the_objective(grpo, seed, draw):
    gen = rng(seed, draw, 41)
    N = randint(gen, 2, 6)
    T = N + randint(gen, 1, 2)  # N != T; the N == T case has its own check
    cfg = grpo.GRPOConfig(clip_eps=[0.2, 0.1, 0.3][draw], beta=[0.04, 0.0, 0.3][draw])
    inputs = draw_loss_inputs(gen, N, T)
    expected, _ = oracle_loss_and_grad(*inputs, cfg)
    loss, _ = loss_and_grad(grpo, *inputs, cfg)
    assert close(loss, expected, atol=1e-5, rtol=1e-4), (
        f"loss: {loss:.5f} where the GRPO objective (mean over rows of each row's masked token mean of "
        f"-min(r*A, clip(r)*A) + beta*kl) is {expected:.5f} (clip_eps {cfg.clip_eps}, beta {cfg.beta})")
    loss32, _ = loss_and_grad(grpo, *(x.float() for x in inputs), cfg)  # the precision a training loop runs in
    assert close(loss32, expected, atol=1e-4, rtol=1e-3), (
        f"loss: on the same inputs in float32 the loss is {loss32:.5f}, in float64 {loss:.5f}; the GRPO objective "
        f"is {expected:.5f} (clip_eps {cfg.clip_eps}, beta {cfg.beta})")


@pytest.mark.parametrize("draw", DRAWS)
def test_loss_gradient_matches_the_objective(grpo, seed, draw):
    gen = rng(seed, draw, 42)
    N = randint(gen, 2, 6)
    T = N + randint(gen, 1, 2)  # N != T; the N == T case has its own check
    cfg = grpo.GRPOConfig(clip_eps=0.2, beta=[0.0, 0.04, 0.2][draw])
    inputs = draw_loss_inputs(gen, N, T)
    _, expected = oracle_loss_and_grad(*inputs, cfg)
    _, grad = loss_and_grad(grpo, *inputs, cfg)
    if not close(grad, expected, atol=1e-6, rtol=1e-4):
        n, t = divmod(worst(grad, expected), T)
        pytest.fail(f"loss: d loss / d logp at row {n}, token {t} is {grad[n, t]:.5f}, expected {expected[n, t]:.5f} "
                    f"(ratio {torch.exp(inputs[0] - inputs[1])[n, t]:.3f}, advantage {inputs[3][n]:+.3f}, "
                    f"mask {int(inputs[4][n, t])})")


@pytest.mark.parametrize("draw", DRAWS)
def test_padding_does_not_enter_the_loss(grpo, seed, draw):
    gen = rng(seed, draw, 43)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    cfg = grpo.GRPOConfig(beta=0.1)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    base, base_grad = loss_and_grad(grpo, logp, old, ref, adv, mask, cfg)
    assert bool(torch.isfinite(base)) and bool(torch.isfinite(base_grad).all()), (
        f"loss: on finite log-probs with {int((mask == 0).sum())} of {N * T} positions under a completion mask of 0, "
        f"the loss is {base:.5f} and its gradient {'is' if torch.isfinite(base_grad).all() else 'is not'} finite; "
        f"expected both finite")
    # scramble everything under the mask, then append more padded columns
    junk = lambda x: torch.where(mask.bool(), x, -torch.rand(N, T, generator=gen, dtype=torch.float64) * 9)
    pad = lambda x: torch.cat([x, -torch.rand(N, 3, generator=gen, dtype=torch.float64) * 9], 1)
    wide = [pad(junk(x)) for x in (logp, old, ref)]
    loss, grad = loss_and_grad(grpo, *wide, adv, torch.cat([mask, torch.zeros(N, 3, dtype=torch.float64)], 1), cfg)
    assert close(loss, base, atol=1e-6, rtol=1e-5), (
        f"loss: changing the log-probs where the completion mask is 0, and adding 3 such columns, moves the loss "
        f"from {base:.5f} to {loss:.5f}; expected it unchanged")
    assert close(grad[:, :T], base_grad, atol=1e-7, rtol=1e-5) and close(grad[:, T:], 0.0, atol=1e-12), (
        "loss: changing only positions where the completion mask is 0 changes the gradient, or gives them one; "
        "expected the same gradient, and 0 where the mask is 0")


@pytest.mark.parametrize("draw", DRAWS)
def test_every_row_weighs_the_same(grpo, seed, draw):
    gen = rng(seed, draw, 44)
    T = randint(gen, 3, 6)
    cfg = grpo.GRPOConfig(beta=0.0)
    old = -torch.rand(2, T, generator=gen, dtype=torch.float64) * 2
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, T, dtype=torch.float64)
    mask[1, 1:] = 0  # row 0 has T tokens, row 1 has one
    loss, grad = loss_and_grad(grpo, old, old, old, adv, mask, cfg)
    # at ratio 1 each row contributes -A * mean over its tokens: the rows cancel exactly
    assert close(loss, 0.0, atol=1e-6), (
        f"loss: at ratio 1 and beta 0, a row of {T} tokens with advantage +1 and a row of 1 token with advantage -1 "
        f"give loss {loss:.4f}; expected 0.0000")
    expected = torch.tensor([-0.5 / T, -0.5 * -1.0], dtype=torch.float64)
    got = torch.stack([grad[0, 0], grad[1, 0]])
    assert close(got, expected, atol=1e-6), (
        f"loss: d loss / d logp of one token in a row of length {T} (advantage +1) and in a row of length 1 "
        f"(advantage -1) is {rounded(got, 4)}; expected {rounded(expected, 4)}")


@pytest.mark.parametrize("draw", DRAWS)
def test_each_row_uses_its_own_advantage(grpo, seed, draw):
    gen = rng(seed, draw, 45)
    N = randint(gen, 3, 6)
    cfg = grpo.GRPOConfig(beta=0.0)
    old = -torch.rand(N, N, generator=gen, dtype=torch.float64)  # N == T: a wrong broadcast still runs
    adv = torch.randn(N, generator=gen, dtype=torch.float64)
    _, grad = loss_and_grad(grpo, old, old, old, adv, torch.ones(N, N, dtype=torch.float64), cfg)
    expected = -adv[:, None].expand(N, N) / (N * N)
    assert close(grad, expected, atol=1e-8), (
        f"loss: with N == T == {N}, d loss / d logp along row 0 (advantage {adv[0]:+.3f}) is "
        f"{rounded(grad[0], 4)}; expected {(-adv[0] / (N * N)).item():.4f} at every token")


@pytest.mark.parametrize("draw", DRAWS)
def test_clipping_stops_the_push_outside_the_trust_region(grpo, seed, draw):
    gen = rng(seed, draw, 47)
    eps = [0.2, 0.1, 0.3][draw]
    cfg = grpo.GRPOConfig(clip_eps=eps, beta=0.0)
    old = -torch.rand(4, 1, generator=gen, dtype=torch.float64) - 0.5
    ratio = torch.tensor([[1 + 2 * eps], [1 + 2 * eps], [1 - 2 * eps], [1 - 2 * eps]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    logp = old + ratio.log()
    _, grad = loss_and_grad(grpo, logp, old, old, adv, torch.ones(4, 1, dtype=torch.float64), cfg)
    expected = torch.tensor([0.0, 1 + 2 * eps, -(1 - 2 * eps), 0.0], dtype=torch.float64) / 4
    labels = ["r > 1+eps, A > 0", "r > 1+eps, A < 0", "r < 1-eps, A > 0", "r < 1-eps, A < 0"]
    for i in range(4):
        if not close(grad[i, 0], expected[i], atol=1e-6):
            pytest.fail(f"loss: with {labels[i]} (clip_eps {eps}) d loss / d logp is {grad[i, 0]:+.4f}; expected "
                        f"{expected[i]:+.4f}")


@pytest.mark.parametrize("draw", DRAWS)
def test_gradient_descent_raises_good_completions(grpo, seed, draw):
    gen = rng(seed, draw, 48)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    cfg = grpo.GRPOConfig(beta=0.0)
    old = -torch.rand(N, T, generator=gen, dtype=torch.float64) - 0.1
    adv = torch.randn(N, generator=gen, dtype=torch.float64)
    _, grad = loss_and_grad(grpo, old, old, old, adv, torch.ones(N, T, dtype=torch.float64), cfg)
    step = -grad.sum(1)  # how a descent step moves each row's total log-prob
    wrong = [n for n in range(N) if not at_least(step[n] * adv[n], 0.0)]
    assert not wrong, (
        f"loss: at ratio 1, a gradient descent step on the loss moves the log-probs of row {wrong[0]}, whose "
        f"advantage is {adv[wrong[0]]:+.3f}, by {step[wrong[0]]:+.4f}; expected them to rise (and to fall where "
        f"the advantage is negative)")


@pytest.mark.parametrize("draw", DRAWS)
def test_loss_types_normalize_as_configured(grpo, seed, draw):
    gen = rng(seed, draw, 49)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    loss_type = ["bnpo", "dr_grpo", "dapo"][draw]
    cfg = grpo.GRPOConfig(loss_type=loss_type, beta=0.04, max_new_tokens=T + 3)  # wider than this batch
    inputs = draw_loss_inputs(gen, N, T)
    kwargs = {"num_tokens": float(inputs[4].sum() + 5)} if loss_type == "dapo" else {}
    expected, expected_grad = oracle_loss_and_grad(*inputs, cfg, **kwargs)
    loss, grad = loss_and_grad(grpo, *inputs, cfg, **kwargs)
    assert close(loss, expected, atol=1e-6, rtol=1e-4), (
        f"loss: with loss_type {loss_type!r}" + (f" and num_tokens {kwargs['num_tokens']:.0f}" if kwargs else "")
        + f" ({int(inputs[4].sum())} completion tokens in {N} rows, max_new_tokens {cfg.max_new_tokens}) the loss "
        f"is {loss:.5f}; expected {expected:.5f} (ratio {loss / expected:.3f})")
    assert close(grad, expected_grad, atol=1e-7, rtol=1e-4), (
        f"loss: with loss_type {loss_type!r} the gradient differs from the expected one by up to "
        f"{(grad - expected_grad).abs().max():.3g}")


@pytest.mark.parametrize("draw", DRAWS)
def test_clip_higher_bounds_only_the_upper_side(grpo, seed, draw):
    gen = rng(seed, draw, 50)
    eps, eps_high = [(0.2, 0.28), (0.1, 0.3), (0.2, 0.4)][draw]
    cfg = grpo.GRPOConfig(clip_eps=eps, clip_eps_high=eps_high, beta=0.0)
    ratios = [1 + (eps + eps_high) / 2, 1 + eps_high + 0.05, 1 - eps - 0.05, 1 - eps / 2]
    advs = [1.0, 1.0, -1.0, -1.0]
    old = -torch.rand(4, 1, generator=gen, dtype=torch.float64) - 0.5
    logp = old + torch.tensor(ratios, dtype=torch.float64)[:, None].log()
    adv = torch.tensor(advs, dtype=torch.float64)
    _, expected = oracle_loss_and_grad(logp, old, old, adv, torch.ones(4, 1, dtype=torch.float64), cfg)
    _, grad = loss_and_grad(grpo, logp, old, old, adv, torch.ones(4, 1, dtype=torch.float64), cfg)
    for i in range(4):
        if not close(grad[i, 0], expected[i, 0], atol=1e-6):
            pytest.fail(f"loss: with clip_eps {eps} and clip_eps_high {eps_high}, a token at ratio {ratios[i]:.3f} "
                        f"with advantage {advs[i]:+.0f} gets gradient {grad[i, 0]:+.4f}; expected "
                        f"{expected[i, 0]:+.4f}")


@pytest.mark.parametrize("draw", DRAWS)
def test_importance_weight_is_capped_and_detached(grpo, seed, draw):
    gen = rng(seed, draw, 57)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    cap = [2.0, 1.5, 3.0][draw]
    cfg = grpo.GRPOConfig(is_cap=cap, beta=0.04)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    sampler = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.8   # weights on both sides of cap
    expected, expected_grad = oracle_loss_and_grad(logp, old, ref, adv, mask, cfg, sampler_logp=sampler)
    loss, grad = loss_and_grad(grpo, logp, old, ref, adv, mask, cfg, sampler_logp=sampler)
    weights = torch.exp(old - sampler).clamp(max=cap)
    assert close(loss, expected, atol=1e-6, rtol=1e-4), (
        f"loss: with is_cap {cap} and sampler log-probs that put the weights pi_old / pi_sampler between "
        f"{float(torch.exp(old - sampler)[mask.bool()].min()):.2f} and "
        f"{float(torch.exp(old - sampler)[mask.bool()].max()):.2f}, the loss is {loss:.5f}; expected {expected:.5f}")
    assert close(grad, expected_grad, atol=1e-7, rtol=1e-4), (
        f"loss: with is_cap {cap} the gradient differs from the expected one by up to "
        f"{(grad - expected_grad).abs().max():.3g} (the per-token weights are {rounded(weights[0], 3)} in row 0)")


@pytest.mark.parametrize("draw", DRAWS)
def test_nonfinite_values_under_the_mask_never_reach_the_loss(grpo, seed, draw):
    gen = rng(seed, draw, 58)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 2, 3)
    cfg = grpo.GRPOConfig(loss_type=["grpo", "dapo", "dr_grpo"][draw], beta=0.1, is_cap=[None, 2.0, None][draw])
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    mask[1:, -1] = 0  # every row but the first has padding at the end
    sampler = old - 0.1
    clean, clean_grad = loss_and_grad(grpo, logp, old, ref, adv, mask, cfg, sampler_logp=sampler)
    poison = [float("inf"), float("-inf"), float("nan")]
    junk = lambda x, k: torch.where(mask.bool(), x, poison[k % 3])
    loss, grad = loss_and_grad(grpo, junk(logp, 0), junk(old, 1), junk(ref, 2), adv, mask, cfg,
                               sampler_logp=junk(sampler, 1))
    assert torch.isfinite(loss) and torch.isfinite(grad).all(), (
        f"loss: with inf, -inf and NaN at the padded positions (completion mask 0) the loss is {loss:.4g} and "
        f"{int((~torch.isfinite(grad)).sum())} gradient entries are not finite (loss_type {cfg.loss_type!r}); "
        f"with ordinary values there the loss is {clean:.5f}")
    assert close(loss, clean, atol=1e-6, rtol=1e-5) and close(grad, clean_grad, atol=1e-7), (
        f"loss: inf, -inf and NaN at the padded positions change the loss from {clean:.5f} to {loss:.5f}")


# ------------------------------------------------------------------ the options of 2026 (TRL 1.16's GRPOConfig)

def held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg, setting, **kwargs):
    """The target's loss and gradient on these inputs with inf, -inf and NaN planted where the completion mask is 0
    (in every (N, T) tensor), against the oracle's on the same inputs; `setting` opens each message."""
    logp, old, ref = (poisoned(x, mask) for x in (logp, old, ref))
    kwargs = {k: poisoned(v, mask) if isinstance(v, torch.Tensor) and v.shape == mask.shape else v
              for k, v in kwargs.items()}
    expected, expected_grad = oracle_loss_and_grad(logp, old, ref, adv, mask, cfg, **kwargs)
    loss, grad = loss_and_grad(grpo, logp, old, ref, adv, mask, cfg, **kwargs)
    bad = int((~torch.isfinite(grad)).sum())
    assert torch.isfinite(loss) and not bad, (
        f"loss: {setting}, with inf, -inf and NaN at the {int((mask == 0).sum())} positions where the completion "
        f"mask is 0, the loss is {loss:.4g} and {bad} gradient entries are not finite; expected {expected:.5f} and a "
        f"finite gradient")
    assert close(loss, expected, atol=1e-6, rtol=1e-4), (
        f"loss: {setting}, the loss is {loss:.5f}; expected {expected:.5f}")
    if not close(grad, expected_grad, atol=1e-7, rtol=1e-4):
        n, t = divmod(worst(grad, expected_grad), mask.shape[1])
        pytest.fail(f"loss: {setting}, d loss / d logp at row {n}, token {t} is {grad[n, t]:+.5f}; expected "
                    f"{expected_grad[n, t]:+.5f} (ratio {float(torch.exp(logp[n, t] - old[n, t])):.3f}, advantage "
                    f"{adv[n]:+.3f}, mask {int(mask[n, t])})")
    return loss, grad


@pytest.mark.parametrize("draw", DRAWS)
def test_a_sequence_level_ratio_is_one_per_row(grpo, seed, draw):
    gen = rng(seed, draw, 61)
    N = randint(gen, 3, 5)
    T = N + randint(gen, 1, 2)
    loss_type = ["grpo", "dapo", "sapo"][draw]
    cfg = grpo.GRPOConfig(importance_sampling_level="sequence", loss_type=loss_type, clip_eps=0.1, beta=0.04)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T, spread=0.6)
    row_ratios = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                       f"with importance_sampling_level 'sequence' and loss_type {loss_type!r} (rows of "
                       f"{mask.sum(1).int().tolist()} tokens, mean log-ratios giving {rounded(row_ratios, 3)})")


@pytest.mark.parametrize("draw", DRAWS)
def test_cispo_weighs_log_probs_by_a_capped_ratio(grpo, seed, draw):
    gen = rng(seed, draw, 62)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    cap = [None, 1.5, 3.0][draw]
    cfg = grpo.GRPOConfig(loss_type="cispo", clip_eps_high=cap, beta=0.04)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T, spread=1.2)  # ratios on both sides of each cap
    kwargs = {"num_tokens": float(mask.sum() + 3)} if draw == 1 else {}
    held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                       f"with loss_type 'cispo', clip_eps_high {cap}" + (f" and num_tokens {kwargs['num_tokens']:.0f}"
                                                                        if kwargs else "")
                       + f" (ratios from {float(torch.exp(logp - old)[mask.bool()].min()):.2f} to "
                       f"{float(torch.exp(logp - old)[mask.bool()].max()):.2f})", **kwargs)


@pytest.mark.parametrize("draw", DRAWS)
def test_sapo_gates_the_ratio_by_the_sign_of_the_advantage(grpo, seed, draw):
    gen = rng(seed, draw, 63)
    N = randint(gen, 3, 5)
    T = N + randint(gen, 1, 2)
    pos, neg = [(1.0, 1.05), (0.5, 2.0), (3.0, 0.7)][draw]
    cfg = grpo.GRPOConfig(loss_type="sapo", sapo_temperature_pos=pos, sapo_temperature_neg=neg, beta=0.04)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T, spread=0.8)
    adv[:2] = torch.tensor([1.0, -1.0], dtype=adv.dtype) * adv[:2].abs()  # both signs
    held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                       f"with loss_type 'sapo', sapo_temperature_pos {pos} and sapo_temperature_neg {neg}")


@pytest.mark.parametrize("draw", DRAWS)
def test_delta_bounds_the_ratio_where_the_clip_does_not(grpo, seed, draw):
    gen = rng(seed, draw, 64)
    delta = [1.5, 2.0, 4.0][draw]
    cfg = grpo.GRPOConfig(delta=delta, clip_eps=0.2, beta=0.0)
    ratios = [delta + 0.5, delta + 0.5, (1.2 + delta) / 2, 0.5]
    advs = [-1.0, 1.0, -1.0, -1.0]
    old = -torch.rand(4, 2, generator=gen, dtype=torch.float64) - 0.5
    logp = old + torch.tensor(ratios, dtype=torch.float64)[:, None].log()
    adv = torch.tensor(advs, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)  # one token a row, then padding
    _, grad = held_to_the_oracle(grpo, logp, old, old, adv, mask, cfg, f"with delta {delta}")
    _, expected = oracle_loss_and_grad(*(poisoned(x, mask) for x in (logp, old, old)), adv, mask, cfg)
    for i in range(4):
        if not close(grad[i, 0], expected[i, 0], atol=1e-6):
            pytest.fail(f"loss: with delta {delta} and clip_eps 0.2, a token at ratio {ratios[i]:.3f} with advantage "
                        f"{advs[i]:+.0f} gets gradient {grad[i, 0]:+.4f}; expected {expected[i, 0]:+.4f}")


@pytest.mark.parametrize("draw", DRAWS)
def test_only_high_entropy_tokens_carry_the_policy_term(grpo, seed, draw):
    gen = rng(seed, draw, 65)
    N = randint(gen, 3, 5)
    T = N + randint(gen, 1, 2)
    quantile = [0.2, 0.5, 0.8][draw]
    cfg = grpo.GRPOConfig(top_entropy_quantile=quantile, beta=0.04)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    entropies = torch.randint(0, 6, (N, T), generator=gen).double() / 2  # few values: ties at the threshold
    held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                       f"with top_entropy_quantile {quantile} (entropies {rounded(entropies[mask.bool()], 1)} on the "
                       f"completion tokens)", entropies=entropies)


@pytest.mark.parametrize("draw", DRAWS)
def test_rollout_correction_truncates_or_masks_the_sampler_weight(grpo, seed, draw):
    gen = rng(seed, draw, 66)
    N = randint(gen, 3, 5)
    T = N + randint(gen, 1, 2)
    low, high = [(None, 2.0), (0.5, 1.5), (0.8, None)][draw]
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    sampler = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.6  # weights on both sides of the bounds
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        cfg = grpo.GRPOConfig(rollout_is_mode=mode, rollout_is_clip_min=low, rollout_is_clip_max=high, beta=0.04)
        per_row = torch.exp(((old - sampler) * mask).sum(1))
        held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                           f"with rollout_is_mode {mode!r}, rollout_is_clip_min {low} and rollout_is_clip_max {high} "
                           f"(pi_old / pi_sampler from {float(torch.exp(old - sampler)[mask.bool()].min()):.2f} to "
                           f"{float(torch.exp(old - sampler)[mask.bool()].max()):.2f} a token, "
                           f"{rounded(per_row, 2)} over each row's tokens)", sampler_logp=sampler)


@pytest.mark.parametrize("draw", DRAWS)
def test_bias_corrected_kl_weighs_the_kl_by_the_ratio(grpo, seed, draw):
    gen = rng(seed, draw, 67)
    N = randint(gen, 2, 5)
    T = N + randint(gen, 1, 2)
    level = ["token", "token", "sequence"][draw]
    cfg = grpo.GRPOConfig(use_bias_correction_kl=True, beta=[0.1, 0.3, 0.2][draw], importance_sampling_level=level)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T, spread=0.6)
    held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                       f"with use_bias_correction_kl, beta {cfg.beta} and importance_sampling_level {level!r}")


@pytest.mark.parametrize("draw", DRAWS)
def test_off_policy_rows_with_negative_advantage_are_dropped(grpo, seed, draw):
    gen = rng(seed, draw, 68)
    N = randint(gen, 4, 6)
    T = N + randint(gen, 1, 2)
    threshold = [0.05, 0.2, 0.1][draw]
    cfg = grpo.GRPOConfig(off_policy_mask_threshold=threshold, beta=0.04)
    logp, old, ref, adv, mask = draw_loss_inputs(gen, N, T)
    adv = adv.abs() * torch.tensor([1.0, -1.0]).repeat(N)[:N].double()                 # signs alternate
    side = torch.tensor([1.0, -1.0, -1.0, 1.0]).repeat(N)[:N].double()

    def drifted(by):  # log-probs whose mean log(them / pi) over each row's tokens is `by` exactly
        x = logp + by[:, None] + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.02
        return x - ((x - logp - by[:, None]) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    drift = threshold + 0.1 * side                                                     # rows on both sides
    if draw == 2:  # no sampler: pi_old sampled the tokens
        old, kwargs = drifted(drift), {}
    else:  # pi_old on the other side of the threshold from the sampler, row by row
        old, kwargs = drifted(threshold - 0.1 * side), {"sampler_logp": drifted(drift)}
    held_to_the_oracle(grpo, logp, old, ref, adv, mask, cfg,
                       f"with off_policy_mask_threshold {threshold}{'' if kwargs else ' and no sampler_logp'} (rows' "
                       f"advantages {rounded(adv, 2)}, mean log(pi_{'sampler' if kwargs else 'old'} / pi) over each "
                       f"row's tokens {rounded(drift, 2)})", **kwargs)
