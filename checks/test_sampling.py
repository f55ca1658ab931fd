"""Sampling: generate() and completion_mask(). Run: pytest checks/test_sampling.py [--target FILE]"""
import pytest
import torch

from checks import oracle
from checks.compare import close
from checks.stubs import DRAWS, constant_lm, eos_after_lm, left_padded_prompts, randint, rng, rounded, seed_cpu

pytestmark = pytest.mark.component("sampling")
PAD, EOS, V = 0, 1, 8


def sample(grpo, policy, prompt_ids, prompt_mask, gen, **cfg):
    cfg = grpo.GRPOConfig(**cfg)
    seed_cpu(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    return grpo.generate(policy, prompt_ids, prompt_mask, cfg, eos_id=EOS, pad_id=PAD,
                         generator=torch.Generator().manual_seed(randint(gen, 0, 10**6)))


def eos_prone_logits(gen):
    logits = torch.randn(V, generator=gen)
    logits[EOS] = logits.max()  # EOS is among the likeliest tokens, so rows end at many lengths
    return logits


@pytest.mark.parametrize("draw", DRAWS)
def test_groups_are_contiguous(grpo, seed, draw):
    gen = rng(seed, draw, 1)
    B, G = randint(gen, 2, 4), randint(gen, 2, 4)
    prompt_ids, prompt_mask = left_padded_prompts(gen, B, V)
    r = sample(grpo, constant_lm(eos_prone_logits(gen)), prompt_ids, prompt_mask, gen,
               group_size=G, max_new_tokens=3)
    P = prompt_ids.shape[1]
    assert r.input_ids.shape[0] == B * G, (
        f"sampling: {r.input_ids.shape[0]} completions for {B} prompts with group_size {G}; expected B*G = {B * G}")
    assert r.prompt_len == P, f"sampling: prompt_len is {r.prompt_len}, the prompts have {P} columns"
    for n in range(B * G):
        i = n // G
        if not (torch.equal(r.input_ids[n, :P].cpu(), prompt_ids[i]) and
                torch.equal(r.attention_mask[n, :P].cpu().long(), prompt_mask[i])):
            pytest.fail(f"sampling: with {B} prompts and group_size {G}, row {n} of the rollout does not hold "
                        f"prompt {i}; expected rows {i * G}..{i * G + G - 1} to hold prompt {i}")


@pytest.mark.parametrize("draw", DRAWS)
def test_tokens_follow_softmax_at_temperature(grpo, seed, draw):
    gen = rng(seed, draw, 2)
    temperature = [0.5, 1.0, 1.6][draw]
    logits = torch.randn(V, generator=gen) * 1.5
    B, G = 4, 2048
    prompt_ids, prompt_mask = left_padded_prompts(gen, B, V)
    r = sample(grpo, constant_lm(logits), prompt_ids, prompt_mask, gen,
               group_size=G, max_new_tokens=1, temperature=temperature)
    first = r.input_ids[:, r.prompt_len].cpu()
    freq = torch.bincount(first, minlength=V).double() / first.numel()
    expected = torch.softmax(logits.double() / temperature, -1)
    tv = 0.5 * (freq - expected).abs().sum().item()
    assert close(tv, 0.0, atol=0.06), (
        f"sampling: at temperature {temperature} the sampled tokens are {tv:.2f} (total variation) away from "
        f"softmax(logits / temperature); observed {rounded(freq, 2)}, "
        f"expected {rounded(expected, 2)}")


@pytest.mark.parametrize("draw", DRAWS)
def test_rows_end_at_their_first_eos(grpo, seed, draw):
    gen = rng(seed, draw, 3)
    B, G, T = randint(gen, 2, 3), randint(gen, 3, 6), randint(gen, 4, 7)
    prompt_ids, prompt_mask = left_padded_prompts(gen, B, V)
    r = sample(grpo, constant_lm(eos_prone_logits(gen)), prompt_ids, prompt_mask, gen,
               group_size=G, max_new_tokens=T)
    P = r.prompt_len
    comp, att = r.input_ids[:, P:].cpu(), r.attention_mask[:, P:].cpu()
    for n in range(comp.shape[0]):
        ended = False
        for t in range(comp.shape[1]):
            tok, a = int(comp[n, t]), int(att[n, t])
            if ended and (tok != PAD or a != 0):
                pytest.fail(f"sampling: row {n} holds token {tok} with attention {a} at completion column {t}, "
                            f"after its EOS; expected pad ({PAD}) with attention 0 after a row's first EOS")
            if not ended and a != 1:
                pytest.fail(f"sampling: row {n} has attention 0 at completion column {t}, before its EOS; "
                            f"expected 1")
            ended = ended or tok == EOS
    expected = oracle.completion_mask(comp, EOS)
    got = r.completion_mask.cpu().float()
    assert close(got, expected), (
        f"sampling: the rollout's completion_mask differs from the expected one in {int((got != expected).sum())} "
        f"places (row 0: {got[0].int().tolist()} for tokens {comp[0].tolist()}, expected "
        f"{expected[0].int().tolist()})")


@pytest.mark.parametrize("draw", DRAWS)
def test_generation_stops_once_every_row_has_ended(grpo, seed, draw):
    gen = rng(seed, draw, 4)
    prompt_ids, prompt_mask = left_padded_prompts(gen, 2, V)
    k = randint(gen, 0, 3)
    r = sample(grpo, eos_after_lm(V, EOS, prompt_ids.shape[1], k), prompt_ids, prompt_mask, gen,
               group_size=3, max_new_tokens=k + 5)
    T = r.input_ids.shape[1] - r.prompt_len
    assert T == k + 1, (
        f"sampling: a model that ends every row with EOS at completion token {k + 1} gives a rollout of {T} "
        f"completion columns (max_new_tokens {k + 5}); expected {k + 1}")


def test_sampling_runs_without_grad(grpo, seed):
    gen = rng(seed, 0, 5)
    policy = constant_lm(eos_prone_logits(gen))
    prompt_ids, prompt_mask = left_padded_prompts(gen, 2, V)
    with torch.enable_grad():
        sample(grpo, policy, prompt_ids, prompt_mask, gen, group_size=2, max_new_tokens=3)
    assert policy.grad_enabled and not any(policy.grad_enabled), (
        f"sampling: called with grad enabled around it, generate ran {sum(policy.grad_enabled)} of its "
        f"{len(policy.grad_enabled)} forward passes with grad enabled; expected none")


@pytest.mark.parametrize("draw", DRAWS)
def test_completion_mask_keeps_the_first_eos(grpo, seed, draw):
    gen = rng(seed, draw, 6)
    N, T = randint(gen, 3, 8), randint(gen, 3, 8)
    ids = torch.randint(2, V, (N, T), generator=gen)
    for n in range(N):
        if n % 3:  # a third of the rows never end
            ids[n, randint(gen, 0, T - 1):] = PAD
            ids[n, randint(gen, 0, T - 1)] = EOS
            if n % 2:
                ids[n, -1] = EOS  # a second EOS after the first
    got = grpo.completion_mask(ids, EOS).float()
    expected = oracle.completion_mask(ids, EOS)
    if not close(got, expected):
        n = int((got != expected).any(1).nonzero()[0])
        pytest.fail(f"sampling: completion_mask of row {n} is {got[n].int().tolist()} for tokens "
                    f"{ids[n].tolist()} (EOS = {EOS}); expected {expected[n].int().tolist()}")


@pytest.mark.parametrize("draw", DRAWS)
def test_sampler_logp_is_the_sampling_distribution(grpo, seed, draw):
    gen = rng(seed, draw, 7)
    temperature = [0.7, 1.0, 1.5][draw]
    logits = eos_prone_logits(gen)
    prompt_ids, prompt_mask = left_padded_prompts(gen, 2, V)
    r = sample(grpo, constant_lm(logits), prompt_ids, prompt_mask, gen, group_size=3, max_new_tokens=4,
               temperature=temperature)
    sampler_logp = getattr(r, "sampler_logp", None)
    assert isinstance(sampler_logp, torch.Tensor), (
        f"sampling: the rollout's sampler_logp is {sampler_logp!r}; expected the log-prob of each "
        f"sampled token under the distribution it was drawn from, (N, T)")
    comp = r.input_ids[:, r.prompt_len:].cpu()
    assert tuple(sampler_logp.shape) == tuple(comp.shape), (
        f"sampling: sampler_logp has shape {tuple(sampler_logp.shape)}; the completions are {tuple(comp.shape)}")
    expected = torch.log_softmax(logits.double() / temperature, -1)[comp]          # (N, T)
    keep = r.completion_mask.cpu().bool()
    err = (sampler_logp.detach().cpu().double() - expected)[keep].abs().max().item()
    assert close(sampler_logp.detach().cpu().double()[keep], expected[keep], atol=1e-4), (
        f"sampling: at temperature {temperature} the recorded sampler_logp is up to {err:.3f} away from the "
        f"log-prob of the sampled tokens under the sampling distribution (row 0: {rounded(sampler_logp[0], 3)}, "
        f"expected {rounded(expected[0], 3)})")


@pytest.mark.parametrize("draw", DRAWS)
def test_truncated_rows_leave_the_loss_when_asked(grpo, seed, draw):
    gen = rng(seed, draw, 8)
    B, G, T = randint(gen, 2, 3), randint(gen, 4, 6), randint(gen, 2, 4)
    prompt_ids, prompt_mask = left_padded_prompts(gen, B, V)
    P = prompt_ids.shape[1]
    models = {"a model that ends rows at random": constant_lm(eos_prone_logits(gen)),
              f"a model that ends every row with EOS at completion token {T}": eos_after_lm(V, EOS, P, T - 1),
              f"a model that never ends a row within {T} tokens": eos_after_lm(V, EOS, P, T + 2)}
    for what, policy in models.items():
        r = sample(grpo, policy, prompt_ids, prompt_mask, gen, group_size=G, max_new_tokens=T,
                   mask_truncated_completions=True)
        comp = r.input_ids[:, r.prompt_len:].cpu()
        expected = oracle.rollout_mask(comp, EOS, True)
        got = r.completion_mask.cpu().float()
        assert tuple(got.shape) == tuple(comp.shape), (
            f"sampling: the rollout's completion_mask has shape {tuple(got.shape)}; the completions have "
            f"{tuple(comp.shape)}")
        if not close(got, expected):
            n = int((got != expected).any(1).nonzero()[0])
            pytest.fail(f"sampling: with mask_truncated_completions and max_new_tokens {T}, {what}: the "
                        f"completion_mask of row {n} is {got[n].int().tolist()} for tokens {comp[n].tolist()} "
                        f"(EOS = {EOS}); expected {expected[n].int().tolist()}")
