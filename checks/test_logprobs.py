"""Log-probs: token_logprobs(). Run: pytest checks/test_logprobs.py [--target FILE]"""
import pytest
import torch

from checks import oracle
from checks.compare import close
from checks.stubs import DRAWS, memo, random_batch, randint, rng, tiny_lm

pytestmark = pytest.mark.component("log-probs")
V = 12


def compare(grpo, gen, temperature, min_prompt, max_prompt):
    model = tiny_lm(gen, V)
    N, T = randint(gen, 2, 5), randint(gen, 2, 5)
    ids, att, comp_mask, P = random_batch(gen, N, V, T, min_prompt=min_prompt, max_prompt=max_prompt)
    expected = memo(oracle.token_logprobs, model, ids, att, P, temperature)
    got = grpo.token_logprobs(model, ids, att, P, temperature)
    assert tuple(got.shape) == (N, T), f"log-probs: shape {tuple(got.shape)}, expected (N, T) = {(N, T)}"
    assert got.dtype == torch.float32, f"log-probs: token_logprobs returned dtype {got.dtype}; expected float32"
    keep = comp_mask.bool()
    return got.detach().double()[keep], expected[keep]


@pytest.mark.parametrize("draw", DRAWS)
def test_logprobs_score_the_next_token(grpo, seed, draw):
    got, expected = compare(grpo, rng(seed, draw, 31), 1.0, 3, 3)
    err = (got - expected).abs().max().item()
    assert close(got, expected, atol=1e-4), (
        f"log-probs: at temperature 1, unpadded prompts, the log-probs are up to {err:.3f} away from "
        f"log pi(token | the tokens before it), scored one prefix at a time; "
        f"mean {got.mean():.3f} vs expected {expected.mean():.3f}")


@pytest.mark.parametrize("draw", DRAWS)
def test_logprobs_use_the_sampling_temperature(grpo, seed, draw):
    temperature = [0.5, 0.7, 2.0][draw]
    got, expected = compare(grpo, rng(seed, draw, 32), temperature, 3, 3)
    err = (got - expected).abs().max().item()
    assert close(got, expected, atol=1e-4), (
        f"log-probs: at temperature {temperature} the log-probs are up to {err:.3f} away from "
        f"log_softmax(logits / temperature) at the sampled tokens; mean {got.mean():.3f} vs {expected.mean():.3f}")


@pytest.mark.parametrize("draw", DRAWS)
def test_left_padding_does_not_change_logprobs(grpo, seed, draw):
    got, expected = compare(grpo, rng(seed, draw, 33), 1.0, 1, 5)
    err = (got - expected).abs().max().item()
    assert close(got, expected, atol=1e-4), (
        f"log-probs: with left-padded prompts of different lengths the log-probs are up to {err:.3f} away from "
        f"the same rows scored without padding; expected the same values")


@pytest.mark.parametrize("draw", DRAWS)
def test_a_float64_model_gets_float64_logprobs(grpo, seed, draw):
    gen = rng(seed, draw, 34)
    model = tiny_lm(gen, V, dtype=torch.float64)
    N, T = randint(gen, 2, 5), randint(gen, 2, 5)
    ids, att, comp_mask, P = random_batch(gen, N, V, T, min_prompt=1, max_prompt=5)
    expected = memo(oracle.token_logprobs, model, ids, att, P, 0.7)
    got = grpo.token_logprobs(model, ids, att, P, 0.7)
    assert tuple(got.shape) == (N, T), f"log-probs: shape {tuple(got.shape)}, expected (N, T) = {(N, T)}"
    assert got.dtype == torch.float64, (
        f"log-probs: a float64 model's log-probs came back as {got.dtype}; expected float64")
    keep = comp_mask.bool()
    got, expected = got.detach().double()[keep], expected[keep]
    err = (got - expected).abs().max().item()
    assert close(got, expected, atol=1e-10), (
        f"log-probs: with a float64 model the log-probs are up to {err:.2e} away from the same model's "
        f"log_softmax(logits / temperature), scored one prefix at a time in float64; expected agreement to 1e-10")


@pytest.mark.parametrize("draw", DRAWS)
def test_entropies_are_those_of_the_sampling_distribution(grpo, seed, draw):
    gen = rng(seed, draw, 35)
    temperature = [1.0, 0.7, 2.0][draw]
    model = tiny_lm(gen, V)
    N, T = randint(gen, 2, 5), randint(gen, 2, 5)
    ids, att, comp_mask, P = random_batch(gen, N, V, T, min_prompt=1, max_prompt=5)
    expected = memo(oracle.token_entropies, model, ids, att, P, temperature)
    got = grpo.token_entropies(model, ids, att, P, temperature)
    assert tuple(got.shape) == (N, T), f"log-probs: token_entropies has shape {tuple(got.shape)}; expected {(N, T)}"
    assert got.dtype == torch.float32, f"log-probs: token_entropies returned dtype {got.dtype}; expected float32"
    keep = comp_mask.bool()
    got, expected = got.detach().double()[keep], expected[keep]
    err = (got - expected).abs().max().item()
    assert close(got, expected, atol=1e-4), (
        f"log-probs: at temperature {temperature}, with left-padded prompts, the entropies are up to {err:.3f} away "
        f"from those of softmax(logits / temperature) over each completion token's prefix, scored one prefix at a "
        f"time; mean {got.mean():.3f} vs expected {expected.mean():.3f}")
