"""Update: grpo_step(). Run: pytest checks/test_step.py [--target FILE]"""
import copy
import math

import pytest
import torch

from checks import oracle
from checks.compare import at_least, close
from checks.stubs import DRAWS, memo, random_batch, randint, rng, sgd, tiny_lm

pytestmark = pytest.mark.component("update")
V = 12


def setup(grpo, gen, sampler_drift=0.0, dtype=torch.float64, uneven=False, ref_drift=0.05, **cfg):
    """A policy that has drifted from its reference, a rollout of whole groups and well-spread rewards. The
    models are float64 so that steps compare to the oracle's far below any bug's effect; the check of the first
    ratio uses float32, the precision a training loop runs in. `uneven`: the first row ends at its first token,
    so that rows of one length cannot hide how a loss type weighs them."""
    policy = tiny_lm(gen, V, dtype)
    ref = copy.deepcopy(policy)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * ref_drift)  # the policy has drifted from the reference
    N_prompts, G = randint(gen, 2, 3), randint(gen, 2, 4)
    ids, att, comp_mask, P = random_batch(gen, N_prompts * G, V, randint(gen, 2, 3))  # T < N
    if uneven:  # row 0 is its EOS alone; row 1, like every odd row, runs to T >= 2 tokens
        ids[0, P], ids[0, P + 1:], att[0, P + 1:], comp_mask[0, 1:] = 1, 0, 0, 0
    # a sampler that was not quite the policy, as an inference engine in lower precision or a step behind:
    # tokens alternately less and more likely under it, so some weights pi_old / pi_sampler pass any cap of 2
    sampler = memo(oracle.token_logprobs, policy, ids, att, P, cfg.get("temperature", 1.0)).nan_to_num()
    pattern = torch.arange(sampler.numel()).view(sampler.shape) % 2                    # (N, T) 0, 1, 0, ...
    sampler = (sampler + sampler_drift * torch.where(pattern == 0, -1.0, 0.4)).float()
    rollout = grpo.Rollout(input_ids=ids, attention_mask=att, completion_mask=comp_mask, prompt_len=P,
                           sampler_logp=sampler)
    # every group well spread (std >= 0.3), so eps is a rounding error next to it
    rewards = torch.stack([torch.randperm(G, generator=gen) for _ in range(N_prompts)]).float().view(-1) / (G - 1)
    rewards = rewards + 0.05 * torch.rand(N_prompts * G, generator=gen)
    return policy, ref, rollout, rewards, grpo.GRPOConfig(group_size=G, **cfg)


def unequal_micro_batches(grpo, cfg, n: int) -> tuple:
    """The config again with grad_accum_steps 3 or 5, whichever does not divide n rows: micro-batches of unequal rows
    (and so of unequal token counts). Returns (k, cfg)."""
    k = 3 if n % 3 else 5
    return k, grpo.GRPOConfig(**{**cfg.overrides, "grad_accum_steps": k})


def params(model) -> dict:
    return {name: p.detach().reshape(-1).clone() for name, p in model.named_parameters()}


def oracle_step(policy, ref, lr, rollout, rewards, cfg) -> dict:
    """How the oracle's step moves each parameter, from the policy's current weights."""
    twin = copy.deepcopy(policy)
    oracle.grpo_step(twin, ref, lr, rollout, rewards, cfg)
    start = params(policy)
    return {name: p - start[name] for name, p in params(twin).items()}


def target_step(grpo, policy, ref, rollout, rewards, cfg, lr, stale_grads=False):
    """The update the target makes, {name: delta}, with the optimizer it was given and its stats."""
    if stale_grads:
        for p in policy.parameters():
            p.grad = torch.full_like(p, 3.0)  # left over from somewhere else
    start = params(policy)
    opt = sgd(policy, lr)
    stats = grpo.grpo_step(policy, ref, opt, rollout, rewards, cfg)
    return {name: p - start[name] for name, p in params(policy).items()}, opt, stats


def run_both(grpo, policy, ref, rollout, rewards, cfg, lr, stale_grads=False):
    """The update the target makes, and the one the oracle makes, from the same start: {name: delta} each."""
    expected = memo(oracle_step, policy, ref, lr, rollout, rewards, cfg)
    got, opt, stats = target_step(grpo, policy, ref, rollout, rewards, cfg, lr, stale_grads)
    return got, expected, opt, stats


def flat(step: dict) -> torch.Tensor:
    return torch.cat(list(step.values()))


def relative_error(got, expected):
    return ((flat(got) - flat(expected)).norm() / flat(expected).norm().clamp(min=1e-12)).item()


def describe(got: dict, expected: dict) -> str:
    """How two steps differ: size, direction, and where the difference sits."""
    g, e = flat(got), flat(expected)
    cosine = float(torch.dot(g, e) / (g.norm() * e.norm()).clamp(min=1e-12))
    diff = {name: float((got[name] - expected[name]).norm() ** 2) for name in got}
    total = sum(diff.values()) or 1.0
    where = max(diff, key=diff.get)
    return (f"size {g.norm():.4g} against the oracle's {e.norm():.4g}, cosine {cosine:+.3f}; "
            f"{diff[where] / total:.0%} of the difference is in {where}")


@pytest.mark.parametrize("draw", DRAWS)
def test_one_step_moves_the_policy_like_the_oracle(grpo, seed, draw):
    gen = rng(seed, draw, 51)
    mu, beta = [1, 2, 3][draw], [0.04, 0.0, 0.1][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, num_iterations=mu, beta=beta, max_grad_norm=0.5)
    policy32, ref32 = copy.deepcopy(policy).float(), copy.deepcopy(ref).float()
    got, expected, _, stats = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=2.0)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: one grpo_step (num_iterations {mu}, beta {beta}) differs from the oracle's step by {err:.1%} of "
        f"its size ({describe(got, expected)})")
    got32, _, _ = target_step(grpo, policy32, ref32, rollout, rewards, cfg, lr=2.0)  # as a training loop runs
    got32 = {name: d.double() for name, d in got32.items()}
    err = relative_error(got32, expected)
    assert close(err, 0.0, atol=5e-3), (
        f"update: the same grpo_step on float32 models (num_iterations {mu}, beta {beta}) differs from the oracle's "
        f"step by {err:.1%} of its size ({describe(got32, expected)}), where the float64 step agrees")
    assert isinstance(stats, dict) and all(k in stats for k in ("loss", "kl")), (
        f"update: grpo_step returned {sorted(stats) if isinstance(stats, dict) else stats!r}; expected a dict "
        f"with at least 'loss' and 'kl'")
    assert all(isinstance(stats[k], float) and math.isfinite(stats[k]) for k in ("loss", "kl")), (
        f"update: grpo_step reports loss {stats['loss']!r} and kl {stats['kl']!r}; expected finite floats")


@pytest.mark.parametrize("draw", DRAWS)
def test_stale_gradients_are_cleared(grpo, seed, draw):
    gen = rng(seed, draw, 52)
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, max_grad_norm=1e6)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.01, stale_grads=True)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with gradients of 3.0 left in every parameter before the call, the step differs from the "
        f"oracle's by {err:.0%} of its size ({describe(got, expected)})")


@pytest.mark.parametrize("draw", DRAWS)
def test_gradient_is_clipped_before_the_step(grpo, seed, draw):
    gen = rng(seed, draw, 53)
    max_norm = [1e-3, 1e-2, 3e-3][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, max_grad_norm=max_norm, beta=0.1)
    got, _, _ = target_step(grpo, policy, ref, rollout, rewards, cfg, lr=1.0)
    size = flat(got).norm()
    assert close(size, 0.0, atol=max_norm * 1.001 + 1e-9), (
        f"update: with max_grad_norm {max_norm} and SGD at lr 1, one grpo_step moves the parameters by "
        f"{size:.4g}; expected at most {max_norm}")


@pytest.mark.parametrize("draw", DRAWS)
def test_one_optimizer_step_per_iteration(grpo, seed, draw):
    gen = rng(seed, draw, 54)
    mu = [2, 3, 4][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, num_iterations=mu)
    _, opt, _ = target_step(grpo, policy, ref, rollout, rewards, cfg, lr=0.05)
    assert opt.steps == mu, (
        f"update: with num_iterations {mu}, one grpo_step stepped the optimizer {opt.steps} time(s); expected {mu}")


@pytest.mark.parametrize("draw", DRAWS)
def test_policy_gradient_flows_through_the_ratio(grpo, seed, draw):
    gen = rng(seed, draw, 55)
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, beta=0.0, max_grad_norm=1e6)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.1)
    assert at_least(flat(got).norm(), 0.1 * flat(expected).norm()), (
        f"update: with beta 0 (no KL term), one grpo_step moves the parameters by {flat(got).norm():.3g}; the "
        f"oracle's step moves them by {flat(expected).norm():.3g}")


def test_reference_is_never_updated(grpo, seed):
    gen = rng(seed, 0, 56)
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, num_iterations=2, beta=0.1)
    before = flat(params(ref))
    grpo.grpo_step(policy, ref, sgd(policy, 0.1), rollout, rewards, cfg)
    moved = (flat(params(ref)) - before).norm()
    assert close(moved, 0.0), f"update: grpo_step moved the reference policy's weights by {moved:.3g}; expected 0"
    grads = [name for name, p in ref.named_parameters() if p.grad is not None and not close(p.grad, 0.0)]
    assert not grads, (
        f"update: after grpo_step {len(grads)} reference parameter(s) hold a nonzero .grad ({grads[0]}, ...); "
        f"expected none")


@pytest.mark.parametrize("draw", DRAWS)
def test_one_step_follows_the_configured_objective(grpo, seed, draw):
    gen = rng(seed, draw, 57)
    settings = [dict(loss_type="bnpo", scale_rewards="batch", grad_accum_steps=2),
                dict(loss_type="dr_grpo", scale_rewards="none", clip_eps_high=0.28),
                dict(loss_type="dapo", is_cap=2.0)][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, sampler_drift=1.0, max_grad_norm=1e6, **settings)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.5)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with {', '.join(f'{k}={v!r}' for k, v in settings.items())}, one grpo_step differs from the "
        f"oracle's step by {err:.1%} of its size ({describe(got, expected)})")


@pytest.mark.parametrize("draw", DRAWS)
def test_gradient_accumulation_matches_the_full_batch(grpo, seed, draw):
    gen = rng(seed, draw, 58)
    loss_type = ["grpo", "dapo", "dr_grpo"][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, loss_type=loss_type, max_grad_norm=1e6)
    k, cfg = unequal_micro_batches(grpo, cfg, len(rewards))
    tokens = [int(rollout.completion_mask[rows].sum()) for rows in oracle.micro_batches(len(rewards), k)]
    got, expected, opt, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.5)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with loss_type {loss_type!r} and grad_accum_steps {k} (micro-batches of {tokens} completion "
        f"tokens), one grpo_step differs from the same step on the whole batch by {err:.1%} of its size "
        f"({describe(got, expected)})")
    assert opt.steps == 1, f"update: with grad_accum_steps {k} the optimizer stepped {opt.steps} times; expected 1"


@pytest.mark.parametrize("draw", DRAWS)
def test_first_update_sees_a_ratio_of_one(grpo, seed, draw):
    gen = rng(seed, draw, 59)
    clip_eps = [1e-4, 1e-3, 1e-4][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, clip_eps=clip_eps, beta=0.0, max_grad_norm=1e6,
                                               dtype=torch.float32)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.5)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with num_iterations 1 and clip_eps {clip_eps}, one grpo_step of a float32 policy differs from the "
        f"oracle's step by {err:.1%} of its size ({describe(got, expected)})")


def two_rank_batch(grpo, gen):
    """A policy, its reference and a batch of whole groups for two data-parallel ranks, rank 1's completions
    much shorter than rank 0's (so that a normalizer counted per rank shows)."""
    policy = tiny_lm(gen, V, torch.float64)
    ref = copy.deepcopy(policy)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    B, G, T = 4, randint(gen, 2, 3), 3          # two whole groups on each rank
    ids, att, mask, P = random_batch(gen, B * G, V, T)
    half = B * G // 2
    ids[half:, P] = 1                          # rank 1: every completion is its EOS alone
    ids[half:, P + 1:], att[half:, P + 1:], mask[half:, 1:] = 0, 0, 0
    rewards = torch.stack([torch.randperm(G, generator=gen) for _ in range(B)]).float().view(-1) / (G - 1)
    rewards = rewards + 0.1 * torch.rand(B * G, generator=gen)  # no two groups alike, none symmetric
    return policy, ref, grpo.Rollout(ids, att, mask, P), rewards, G, half


def shard(rollout, rows):
    return type(rollout)(rollout.input_ids[rows], rollout.attention_mask[rows], rollout.completion_mask[rows],
                         rollout.prompt_len)


@pytest.mark.parametrize("draw", DRAWS)
def test_two_ranks_step_as_one(grpo, seed, draw):
    gen = rng(seed, draw, 60)
    policy, ref, rollout, rewards, G, half = two_rank_batch(grpo, gen)
    tokens = [int(rollout.completion_mask[:half].sum()), int(rollout.completion_mask[half:].sum())]
    for loss_type in [("grpo", "bnpo"), ("dapo",), ("dr_grpo",)][draw]:
        cfg = grpo.GRPOConfig(group_size=G, loss_type=loss_type, beta=0.04, max_grad_norm=1e6)
        expected = memo(oracle_ranks_step, policy, ref, 0.5, rollout, rewards, cfg)
        copies = [copy.deepcopy(policy) for _ in range(2)]
        shares = [slice(0, half), slice(half, None)]
        grpo.distributed("grpo_step", [((m, copy.deepcopy(ref), sgd(m, 0.5), shard(rollout, rows), rewards[rows], cfg),
                                        {}) for m, rows in zip(copies, shares)], wrap="ddp")
        start = params(policy)
        steps = [{n: p - start[n] for n, p in params(m).items()} for m in copies]
        apart = relative_error(steps[1], steps[0])
        assert close(apart, 0.0, atol=1e-6), (
            f"update: after one grpo_step on 2 data-parallel ranks (policy in DistributedDataParallel, "
            f"loss_type {loss_type!r}) the two ranks' steps differ by {apart:.1%}; expected the same step")
        err = relative_error(steps[0], expected)
        assert close(err, 0.0, atol=2e-3), (
            f"update: with loss_type {loss_type!r}, one grpo_step on 2 data-parallel ranks holding "
            f"{half // G} group(s) each ({tokens[0]} and {tokens[1]} completion tokens) differs from "
            + ("the average of each rank's own token-mean step" if loss_type == "bnpo" else
               "the same step on one process with the whole batch")
            + f" by {err:.1%} of its size ({describe(steps[0], expected)})")


def oracle_ranks_step(policy, ref, lr, rollout, rewards, cfg) -> dict:
    twin = copy.deepcopy(policy)
    oracle.grpo_step(twin, ref, lr, rollout, rewards, cfg, world=2)
    start = params(policy)
    return {name: p - start[name] for name, p in params(twin).items()}


# ------------------------------------------------------------------ the options of 2026 (TRL 1.16's GRPOConfig)

@pytest.mark.parametrize("draw", DRAWS)
def test_one_step_follows_the_sequence_and_sampler_options(grpo, seed, draw):
    gen = rng(seed, draw, 71)
    # the dapo draw's KL to a far reference moves ratios both ways, whatever the advantage's sign, so that the min
    # of PPO's two terms is seen at every seed
    settings = [dict(importance_sampling_level="sequence", loss_type="cispo", off_policy_mask_threshold=0.1,
                     num_iterations=2),
                dict(loss_type="sapo", rollout_is_mode="sequence_mask", rollout_is_clip_min=0.5,
                     rollout_is_clip_max=2.0, use_bias_correction_kl=True, beta=0.1),
                dict(loss_type="dapo", delta=1.05, rollout_is_mode="token_mask", rollout_is_clip_max=1.5,
                     num_iterations=3, clip_eps=0.01, beta=1.0)][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, sampler_drift=1.0, uneven=True, ref_drift=0.5,
                                               max_grad_norm=1e6, **settings)
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.5)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with {', '.join(f'{k}={v!r}' for k, v in settings.items())} and sampler log-probs that differ from "
        f"pi_old, one grpo_step differs from the oracle's step by {err:.1%} of its size ({describe(got, expected)})")


@pytest.mark.parametrize("draw", DRAWS)
def test_one_step_trains_on_the_high_entropy_tokens(grpo, seed, draw):
    gen = rng(seed, draw, 72)
    quantile, k, mu, temperature = [(0.2, 1, 2, 1.0), (0.5, 2, 1, 0.7), (0.3, None, 2, 1.3)][draw]
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, top_entropy_quantile=quantile, grad_accum_steps=k or 1,
                                               num_iterations=mu, temperature=temperature, max_grad_norm=1e6)
    if k is None:
        k, cfg = unequal_micro_batches(grpo, cfg, len(rewards))
    got, expected, _, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.5)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with top_entropy_quantile {quantile}, grad_accum_steps {k}, num_iterations {mu} and temperature "
        f"{temperature}, one grpo_step differs from the oracle's step by {err:.1%} of its size "
        f"({describe(got, expected)})")


@pytest.mark.parametrize("draw", DRAWS)
def test_gradient_accumulation_matches_the_full_batch_for_cispo_sapo_and_gspo(grpo, seed, draw):
    gen = rng(seed, draw, 73)
    settings = [dict(loss_type="cispo", clip_eps_high=1.2), dict(loss_type="sapo"),
                dict(loss_type="grpo", importance_sampling_level="sequence", off_policy_mask_threshold=0.05,
                     num_iterations=1)][draw]  # GSPO's ratio is 1 in value here, its gradient the row's mean
    policy, ref, rollout, rewards, cfg = setup(grpo, gen, sampler_drift=0.5, uneven=True, max_grad_norm=1e6,
                                               **{"num_iterations": 2, **settings})
    k, cfg = unequal_micro_batches(grpo, cfg, len(rewards))
    tokens = [int(rollout.completion_mask[rows].sum()) for rows in oracle.micro_batches(len(rewards), k)]
    got, expected, opt, _ = run_both(grpo, policy, ref, rollout, rewards, cfg, lr=0.5)
    err = relative_error(got, expected)
    assert close(err, 0.0, atol=2e-3), (
        f"update: with {', '.join(f'{k}={v!r}' for k, v in settings.items())} and grad_accum_steps {k} "
        f"(micro-batches of {tokens} completion tokens), one grpo_step differs from the same step on the whole batch "
        f"by {err:.1%} of its size ({describe(got, expected)})")
