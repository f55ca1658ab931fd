"""The four GRPO implementations agree: solutions/grpo.py and solutions/codebases/{trainer,script,core}.py.

    .venv/bin/python -m pytest -q tests/test_codebases.py     # CPU, deterministic, a few seconds
    .venv/bin/python -m tests.test_codebases                  # prints grpo_loss per loss_type next to TRL's

Every contract function of every codebase is compared with the reference on seeded random inputs, with inf
and NaN planted where the completion mask is 0. The reference alone is then held to two properties of
gradient accumulation, and each implementation's grpo_loss to a transcription of TRL's GRPOTrainer._compute_loss.
"""
import ast
import copy
import itertools
import math
import sys

import pytest
import torch
import torch.distributed as dist

from grpo_katas import ROOT
from grpo_katas.loader import load_target
from lab import ModelConfig, TinyLM

REFERENCE = load_target(ROOT / "solutions" / "grpo.py")
CODEBASES = {name: load_target(ROOT / "solutions" / "codebases" / f"{name}.py") for name in ("trainer", "script", "core")}
IMPLEMENTATIONS = {"reference": REFERENCE, **CODEBASES}

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
SCALES = ["group", "batch", "none"]
STAT_KEYS = ["loss", "kl", "clip_frac", "grad_norm", "adv_std", "completion_len", "ratio_dev"]
V, EOS, PAD = 12, 1, 0


pytestmark = pytest.mark.usefixtures("one_thread")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def plant_junk(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with +inf, -inf and NaN in turn wherever mask is 0."""
    junk = torch.tensor([math.inf, -math.inf, math.nan], dtype=x.dtype).repeat(x.numel() // 3 + 1)[:x.numel()]
    return torch.where(mask.bool(), x, junk.view_as(x))


def loss_inputs(seed: int, N: int = 6, T: int = 5):
    """float64 logp, old, ref, sampler (N, T) that straddle the clip and the IS cap, rewards (N,) in groups of 3
    (the first group all equal), and a mask with rows of every length, one of them empty."""
    g = gen(seed)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.4
    ref = old + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.5
    sampler = old + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.8  # exp(old - sampler) crosses 2.0
    rewards = torch.rand(N, generator=g)
    rewards[:3] = 0.5
    lengths = torch.tensor([T, 0, 1, 3, T, 2])[:N]
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    return logp, old, ref, sampler, rewards, mask


def loss_and_grad(impl, logp, old, ref, adv, mask, cfg, **kw):
    logp = logp.clone().requires_grad_()
    loss = impl.grpo_loss(logp, old, ref, adv, mask, cfg, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


# ---------------------------------------------------------------------------------------------------- loss

@pytest.mark.parametrize("name", CODEBASES)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("scale", SCALES)
def test_grpo_loss_and_its_gradient_agree(name, loss_type, scale):
    impl = CODEBASES[name]
    for i, (clip_high, is_cap, num_tokens) in enumerate(itertools.product([None, 0.28], [None, 2.0], [None, 17.0])):
        logp, old, ref, sampler, rewards, mask = loss_inputs(100 + i)
        adv = REFERENCE.group_advantages(rewards, 3, 1e-4, scale).double()
        logp, old, ref, sampler = (plant_junk(x, mask) for x in (logp, old, ref, sampler))
        kw = dict(loss_type=loss_type, scale_rewards=scale, clip_eps_high=clip_high, is_cap=is_cap,
                  beta=0.04, max_new_tokens=8, group_size=3)
        got = loss_and_grad(impl, logp, old, ref, adv, mask, impl.GRPOConfig(**kw), num_tokens=num_tokens,
                            sampler_logp=sampler)
        want = loss_and_grad(REFERENCE, logp, old, ref, adv, mask, REFERENCE.GRPOConfig(**kw),
                             num_tokens=num_tokens, sampler_logp=sampler)
        where = f"{name}: clip_eps_high={clip_high}, is_cap={is_cap}, num_tokens={num_tokens}"
        assert torch.isfinite(want[0]) and torch.isfinite(want[1]).all(), f"reference not finite ({where})"
        assert (want[1][mask == 0] == 0).all(), f"reference: masked positions get a gradient ({where})"
        assert torch.allclose(got[0], want[0], atol=1e-6, rtol=0), f"loss {got[0]} vs {want[0]} ({where})"
        assert torch.allclose(got[1], want[1], atol=1e-6, rtol=0), f"gradient differs ({where})"


def test_planted_inputs_reach_the_loss():
    """The loss test above would pass vacuously if nothing depended on the extra options; it does not."""
    logp, old, ref, sampler, rewards, mask = loss_inputs(7)
    adv = REFERENCE.group_advantages(rewards, 3, 1e-4).double()
    values = {}
    for kw in [{}, {"clip_eps_high": 0.28}, {"is_cap": 2.0}]:
        values[str(kw)] = REFERENCE.grpo_loss(logp, old, ref, adv, mask, REFERENCE.GRPOConfig(**kw),
                                              sampler_logp=sampler).item()
    assert len(set(values.values())) == 3, values
    dapo = REFERENCE.GRPOConfig(loss_type="dapo")
    assert REFERENCE.grpo_loss(logp, old, ref, adv, mask, dapo, num_tokens=17.0) != \
        REFERENCE.grpo_loss(logp, old, ref, adv, mask, dapo)


# ---------------------------------------------------------------------------------------------------- pieces

@pytest.mark.parametrize("name", CODEBASES)
def test_group_advantages_agree(name):
    impl = CODEBASES[name]
    for seed, G, scale in itertools.product(range(3), [2, 4], SCALES):
        g = gen(seed)
        rewards = torch.rand(3 * G, generator=g)
        rewards[:G] = 0.25  # an all-equal group
        rewards[G:2 * G] = torch.randint(0, 2, (G,), generator=g).float()
        got = impl.group_advantages(rewards, G, 1e-4, scale)
        want = REFERENCE.group_advantages(rewards, G, 1e-4, scale)
        assert torch.allclose(got.double(), want.double(), atol=1e-6), (name, seed, G, scale, got, want)
    got = impl.group_advantages(rewards, G, 1e-4)  # scale defaults to "group"
    assert torch.allclose(got.double(), REFERENCE.group_advantages(rewards, G, 1e-4, "group").double(), atol=1e-6)


@pytest.mark.parametrize("name", CODEBASES)
def test_completion_mask_agrees(name):
    g = gen(3)
    ids = torch.randint(2, V, (9, 7), generator=g)
    ids[1, 3], ids[2, 0], ids[3, 6] = EOS, EOS, EOS
    ids[4, 2], ids[4, 5] = EOS, EOS                # a second EOS after the first
    ids[5, 4:] = PAD
    ids[5, 3] = EOS
    got = CODEBASES[name].completion_mask(ids, EOS).float()
    assert torch.equal(got, REFERENCE.completion_mask(ids, EOS).float())


@pytest.mark.parametrize("name", CODEBASES)
def test_kl_penalty_agrees(name):
    g = gen(4)
    logp = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 3
    ref = logp + torch.randn(5, 6, generator=g, dtype=torch.float64) * 2
    assert torch.allclose(CODEBASES[name].kl_penalty(logp, ref), REFERENCE.kl_penalty(logp, ref), atol=1e-12)


def tiny_model(seed: int) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(ModelConfig(vocab_size=V, d_model=16, n_layer=1, n_head=2, max_len=32))


def make_batch(seed: int, lengths, P_max: int = 4, T: int = 6):
    """input_ids (N, P+T), attention_mask, completion_mask, P: left-padded prompts, completions that end at an
    EOS after lengths[n] tokens (None: no EOS), pad with attention 0 after it."""
    g = gen(seed)
    N = len(lengths)
    ids = torch.randint(2, V, (N, P_max + T), generator=g)
    att = torch.ones(N, P_max + T, dtype=torch.long)
    plens = torch.randint(1, P_max + 1, (N,), generator=g)
    for n, length in enumerate(lengths):
        ids[n, :P_max - plens[n]] = PAD
        att[n, :P_max - plens[n]] = 0
        if length is not None:
            ids[n, P_max + length - 1] = EOS
            ids[n, P_max + length:] = PAD
            att[n, P_max + length:] = 0
    return ids, att, REFERENCE.completion_mask(ids[:, P_max:], EOS), P_max


@pytest.mark.parametrize("name", CODEBASES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_agree(name, temperature):
    model = tiny_model(5)
    ids, att, mask, P = make_batch(6, [1, None, 3, 6, 2])
    got = CODEBASES[name].token_logprobs(model, ids, att, P, temperature)
    want = REFERENCE.token_logprobs(model, ids, att, P, temperature)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_generate_records_the_sampler_logprobs(name):
    """sampler_logp: the log-prob each token was drawn with, float32, 0 after a row's EOS. The sampler here is the
    policy itself, so it matches token_logprobs at the sampling temperature."""
    impl = IMPLEMENTATIONS[name]
    model = tiny_model(8)
    ids, att, _, P = make_batch(9, [None] * 3)
    prompt_ids, prompt_mask = ids[:, :P], att[:, :P]  # (3, P) left-padded
    cfg = impl.GRPOConfig(group_size=4, max_new_tokens=6, temperature=0.7)
    rollout = impl.generate(model, prompt_ids, prompt_mask, cfg, eos_id=EOS, pad_id=PAD, generator=gen(10))
    mask = rollout.completion_mask.bool()
    scored = REFERENCE.token_logprobs(model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, 0.7)
    assert rollout.sampler_logp.dtype == torch.float32 and rollout.sampler_logp.shape == mask.shape
    assert (~mask).any() and (rollout.sampler_logp[~mask] == 0).all()
    assert torch.allclose(rollout.sampler_logp[mask], scored.detach()[mask], atol=1e-5)


# ---------------------------------------------------------------------------------------------------- update

def step_setup(seed: int, lengths, group_size: int, dtype=torch.float32):
    """policy, a drifted reference, a rollout whose sampler log-probs differ from pi_old, and rewards."""
    policy = tiny_model(seed).to(dtype)
    ref = copy.deepcopy(policy)
    g = gen(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    ids, att, mask, P = make_batch(seed + 2, lengths)
    with torch.no_grad():
        sampler = REFERENCE.token_logprobs(policy, ids, att, P, 1.0)
    sampler = plant_junk(sampler + torch.randn(sampler.shape, generator=g) * 0.5, mask).float()
    rewards = torch.rand(len(lengths), generator=g)
    return policy, ref, (ids, att, mask, P, sampler), rewards


def run_step(impl, policy, ref, batch, rewards, cfg_kw, lr=0.5):
    policy = copy.deepcopy(policy)
    ids, att, mask, P, sampler = batch
    rollout = impl.Rollout(input_ids=ids, attention_mask=att, completion_mask=mask, prompt_len=P, sampler_logp=sampler)
    start = torch.cat([p.detach().reshape(-1) for p in policy.parameters()])
    stats = impl.grpo_step(policy, ref, torch.optim.SGD(policy.parameters(), lr=lr), rollout, rewards,
                           impl.GRPOConfig(**cfg_kw))
    return torch.cat([p.detach().reshape(-1) for p in policy.parameters()]) - start, stats


def relative_error(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


STEP_LENGTHS = [2, None, 1, 4, 6, 3, None, 1]  # N = 8 rows: micro-batches of 3, 3, 2 at grad_accum_steps 3


@pytest.mark.parametrize("name", CODEBASES)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_step_moves_the_policy_like_the_reference(name, loss_type):
    policy, ref, batch, rewards = step_setup(11, STEP_LENGTHS, group_size=4)
    options = [dict(num_iterations=1),
               dict(num_iterations=2, clip_eps_high=0.28, is_cap=2.0, scale_rewards="batch", max_grad_norm=0.5),
               dict(num_iterations=2, scale_rewards="none", beta=0.0, temperature=0.7)]
    for extra, k in itertools.product(options, [1, 2, 3]):
        cfg_kw = dict(group_size=4, loss_type=loss_type, grad_accum_steps=k, max_new_tokens=6, **extra)
        got, got_stats = run_step(CODEBASES[name], policy, ref, batch, rewards, cfg_kw)
        want, want_stats = run_step(REFERENCE, policy, ref, batch, rewards, cfg_kw)
        assert relative_error(got, want) < 1e-4, (name, cfg_kw, relative_error(got, want))
        assert set(STAT_KEYS) <= set(got_stats) and set(STAT_KEYS) <= set(want_stats)
        for key in STAT_KEYS:
            assert math.isclose(got_stats[key], want_stats[key], rel_tol=1e-4, abs_tol=1e-5), (name, cfg_kw, key,
                                                                                             got_stats[key],
                                                                                             want_stats[key])
        assert got_stats["ratio_dev"] == 0.0 and want_stats["ratio_dev"] == 0.0


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_train_logs_the_same_keys(name):
    from lab import SumTask

    impl = IMPLEMENTATIONS[name]
    torch.manual_seed(0)
    policy = TinyLM(ModelConfig(d_model=16, n_layer=1, n_head=2, max_len=16))
    logged = []
    history = impl.train(policy, SumTask(max_target=6), impl.GRPOConfig(group_size=4, max_new_tokens=4,
                                                                          grad_accum_steps=2),
                         steps=2, batch_size=4, seed=0, log=logged.append)
    assert len(history) == 2 and logged == history
    for stats in history:
        assert {"step", "reward_mean", "reward_max", *STAT_KEYS} <= set(stats), sorted(stats)
        assert all(math.isfinite(stats[k]) for k in STAT_KEYS)


# -------------------------------------------------------------------------------- the reference alone

def test_accumulation_matches_the_full_batch_except_for_bnpo():
    """grad_accum_steps=3 over rows 3/3/2 holding 9, 13 and 7 tokens against one full-batch backward. grpo and
    dr_grpo scale each micro-batch's loss by its share of the rows and dapo divides by the whole batch's token
    count, so all three reproduce the full-batch gradient. bnpo keeps TRL's per-micro-batch normalization (each
    micro-batch's token mean, divided by grad_accum_steps): with different token counts per micro-batch the
    tokens are weighted differently from the full batch's token mean, which TRL documents for "bnpo"."""
    policy, ref, batch, rewards = step_setup(21, STEP_LENGTHS, group_size=4, dtype=torch.float64)
    per_micro = [int(m.sum()) for m in batch[2].tensor_split(3)]
    assert len(set(per_micro)) == 3, per_micro
    for loss_type in LOSS_TYPES:
        cfg_kw = dict(group_size=4, loss_type=loss_type, num_iterations=2, clip_eps_high=0.28, is_cap=2.0,
                      max_grad_norm=1e9, max_new_tokens=6)
        full, _ = run_step(REFERENCE, policy, ref, batch, rewards, {**cfg_kw, "grad_accum_steps": 1}, lr=0.1)
        accumulated, _ = run_step(REFERENCE, policy, ref, batch, rewards, {**cfg_kw, "grad_accum_steps": 3}, lr=0.1)
        err = relative_error(accumulated, full)
        if loss_type == "bnpo":
            assert err > 1e-2, f"bnpo: accumulated step within {err:.2e} of the full batch"
        else:
            assert err < 1e-5, f"{loss_type}: accumulated step off the full batch by {err:.2e}"


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_dapo_count_goes_through_torch_distributed(name, tmp_path):
    """Under an initialized process group (gloo, world size 1) the token count is all-reduced and divided by the
    world size; with one rank the step is the same as without a process group."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    policy, ref, batch, rewards = step_setup(31, STEP_LENGTHS, group_size=4)
    cfg_kw = dict(group_size=4, loss_type="dapo", grad_accum_steps=3)
    alone, _ = run_step(IMPLEMENTATIONS[name], policy, ref, batch, rewards, cfg_kw)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        grouped, _ = run_step(IMPLEMENTATIONS[name], policy, ref, batch, rewards, cfg_kw)
    finally:
        dist.destroy_process_group()
    assert relative_error(grouped, alone) < 1e-6


class Unwrapped:
    """Stands in for DistributedDataParallel where ranks are only simulated: the model is used as it is (averaging
    gradients over ranks is not what the test is about, and needs a real process group)."""

    def __new__(cls, model):
        return model


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_dapo_count_is_summed_over_ranks_and_divided_by_the_world_size(name, monkeypatch):
    """Two ranks simulated: all_reduce doubles the count (the other rank holds as many tokens), the world size is 2,
    so the per-rank normalizer is this rank's count again and the step equals the single-process step; dropping
    either the all-reduce or the division by the world size would halve or double it."""
    policy, ref, batch, rewards = step_setup(32, STEP_LENGTHS, group_size=4)
    cfg_kw = dict(group_size=4, loss_type="dapo", grad_accum_steps=2, max_grad_norm=1e9)
    alone, _ = run_step(IMPLEMENTATIONS[name], policy, ref, batch, rewards, cfg_kw)
    reduced = []
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(IMPLEMENTATIONS[name], "DistributedDataParallel", Unwrapped, raising=False)
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: reduced.append(t.mul_(2)))
    two_ranks, _ = run_step(IMPLEMENTATIONS[name], policy, ref, batch, rewards, cfg_kw)
    assert reduced, "the token count was never all-reduced"
    assert relative_error(two_ranks, alone) < 1e-6


# ------------------------------------------------------------------------------- TRL's _compute_loss

def trl_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, mask, sampling_per_token_logps,
             *, loss_type, beta, epsilon_low, epsilon_high, cap, max_completion_length, num_items_in_batch=None):
    """A transcription of huggingface/trl trl/trainer/grpo_trainer.py, GRPOTrainer, as read at main f2cd577
    (2026-07-24, VERSION 1.10.0.dev0), for one process, token-level importance sampling, no entropy terms, and
    current_gradient_accumulation_steps = 1:
      - L2427: num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()
      - L2581-2601 (vllm_importance_sampling_mode="token_truncate"): per_token_logps_diff =
        (old_per_token_logps - sampling_per_token_logps) * mask; ratio = torch.clamp(torch.exp(diff), min=None, max=C)
      - L3066-3073: coef_1 = torch.exp(log_ratio); per_token_kl = exp(ref - logp) - (ref - logp) - 1
      - L3084-3091: coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high); -min(coef_1 * A, coef_2 * A)
      - L3117-3121: per_token_loss * importance_sampling_ratio, then + beta * per_token_kl
      - L3124-3142: the normalization of each loss_type."""
    advantages = advantages.unsqueeze(1)
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    importance_sampling_ratio = torch.clamp(torch.exp((old_per_token_logps - sampling_per_token_logps) * mask),
                                            min=None, max=cap)
    per_token_loss = per_token_loss * importance_sampling_ratio
    per_token_loss = per_token_loss + beta * per_token_kl
    if num_items_in_batch is None:  # this batch is the whole accumulated batch
        num_items_in_batch = mask.sum()
    num_processes, normalizer = 1, 1.0
    if loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / normalizer
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / normalizer
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length) / normalizer
    elif loss_type == "dapo":
        loss = (per_token_loss * mask).sum() / (num_items_in_batch.clamp(min=1.0) / num_processes)
    return loss


def trl_comparison() -> dict:
    """grpo_loss of every implementation and TRL's transcription, per loss_type, on one shared input."""
    logp, old, ref, sampler, rewards, mask = loss_inputs(2024)
    adv = REFERENCE.group_advantages(rewards, 3, 1e-4).double()
    rows = {}
    for loss_type in LOSS_TYPES:
        kw = dict(loss_type=loss_type, beta=0.04, clip_eps=0.2, clip_eps_high=0.28, is_cap=2.0, max_new_tokens=8,
                  group_size=3)
        trl = trl_loss(logp, old, ref, adv, mask, sampler, loss_type=loss_type, beta=0.04, epsilon_low=0.2,
                       epsilon_high=0.28, cap=2.0, max_completion_length=8).item()
        ours = {name: impl.grpo_loss(logp, old, ref, adv, mask, impl.GRPOConfig(**kw), sampler_logp=sampler).item()
                for name, impl in IMPLEMENTATIONS.items()}
        rows[loss_type] = {"trl": trl, **ours}
    return rows


def test_grpo_loss_matches_trls_compute_loss():
    for loss_type, values in trl_comparison().items():
        for name in IMPLEMENTATIONS:
            assert math.isclose(values[name], values["trl"], rel_tol=1e-12, abs_tol=1e-12), (loss_type, values)
    trl = {loss_type: values["trl"] for loss_type, values in trl_comparison().items()}
    # one call, no accumulation: bnpo and dapo both divide by this call's token count; the rest differ
    assert trl["bnpo"] == trl["dapo"] and len({trl["grpo"], trl["bnpo"], trl["dr_grpo"]}) == 3, trl
    # as one micro-batch of a larger accumulated batch, dapo divides by that batch's count (num_items_in_batch)
    logp, old, ref, sampler, rewards, mask = loss_inputs(2024)
    adv = REFERENCE.group_advantages(rewards, 3, 1e-4).double()
    want = trl_loss(logp, old, ref, adv, mask, sampler, loss_type="dapo", beta=0.04, epsilon_low=0.2,
                    epsilon_high=0.28, cap=2.0, max_completion_length=8, num_items_in_batch=torch.tensor(40.0))
    for impl in IMPLEMENTATIONS.values():
        cfg = impl.GRPOConfig(loss_type="dapo", clip_eps_high=0.28, is_cap=2.0, max_new_tokens=8, group_size=3)
        got = impl.grpo_loss(logp, old, ref, adv, mask, cfg, num_tokens=torch.tensor(40.0), sampler_logp=sampler)
        assert math.isclose(got.item(), want.item(), rel_tol=1e-12)



@pytest.mark.parametrize("path", [ROOT / "solutions" / "grpo.py", *sorted((ROOT / "solutions" / "codebases").glob("*.py")),
                                  *sorted((ROOT / "katas").glob("*/grpo.py"))], ids=lambda p: p.parent.name + "/" + p.name)
def test_a_codebase_imports_only_what_make_setup_installs(path):
    """The standard library, torch and lab: numpy comes only with the optional extras (transformers), so a loop
    that imports it runs here and dies on a candidate's fresh set-up."""
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    foreign = sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"torch", "lab"})
    assert not foreign, f"{path.relative_to(ROOT)} imports {foreign}"

if __name__ == "__main__":
    print(f"{'loss_type':10s} {'TRL':>12s} " + " ".join(f"{n:>12s}" for n in IMPLEMENTATIONS))
    for loss_type, values in trl_comparison().items():
        print(f"{loss_type:10s} {values['trl']:+12.8f} " + " ".join(f"{values[n]:+12.8f}" for n in IMPLEMENTATIONS))
