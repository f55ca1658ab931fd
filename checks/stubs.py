"""Seeded draws, small models and stand-ins whose behaviour is known exactly, for the checks."""
import ctypes
import hashlib
import math

import torch

from checks import oracle
from grpo_katas.judge import contract
from grpo_katas.judge.client import Optimizer
from grpo_katas.judge.standins import StandIn
from lab import ModelConfig, TinyLM

DRAWS = range(3)  # every randomised check runs on three independent draws


def rng(seed: int, draw: int, salt: int) -> torch.Generator:
    """One generator per (run seed, draw, check): checks never share a random stream. The three numbers are
    hashed, since Mersenne Twister streams from neighbouring seeds start out alike."""
    digest = hashlib.blake2b(f"{seed}/{draw}/{salt}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def seed_cpu(seed: int) -> None:
    """torch.manual_seed for the CPU generator alone: the checks' tensors all live on the CPU, and
    torch.manual_seed also queues a CUDA seeding, which records a stack trace each time (milliseconds)."""
    torch.random.default_generator.manual_seed(seed)


def randint(gen, low, high) -> int:
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def tiny_lm(gen, vocab_size=12, dtype=torch.float32) -> TinyLM:
    seed_cpu(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    return TinyLM(ModelConfig(vocab_size=vocab_size, d_model=16, n_layer=1, n_head=2, max_len=32)).to(dtype)


def left_padded_prompts(gen, B, vocab_size, min_len=1, max_len=4, avoid=(0, 1)):
    """(B, P) ids and mask, left-padded, prompts of random lengths drawn from the non-special tokens."""
    lens = torch.randint(min_len, max_len + 1, (B,), generator=gen)
    P = int(lens.max())
    ids = torch.zeros(B, P, dtype=torch.long)
    mask = torch.zeros(B, P, dtype=torch.long)
    for b in range(B):
        k = int(lens[b])
        ids[b, P - k:] = torch.randint(len(avoid), vocab_size, (k,), generator=gen)
        mask[b, P - k:] = 1
    return ids, mask


def constant_lm(logits: torch.Tensor) -> StandIn:
    """Every position gets the same next-token logits (V,)."""
    return StandIn("constant", logits=logits)


def eos_after_lm(vocab_size: int, eos_id: int, prompt_len: int, k: int) -> StandIn:
    """Uniform over the non-EOS tokens for the first k completion tokens, then EOS with certainty."""
    return StandIn("eos_after", vocab_size=vocab_size, eos_id=eos_id, prompt_len=prompt_len, k=k)


def sgd(model, lr: float) -> Optimizer:
    """Plain SGD over the model's parameters, so the size of the gradient shows in the update; `.steps` counts
    the optimizer steps the implementation took."""
    return Optimizer("SGD", model, lr=lr)


def random_batch(gen, N, vocab_size, T, eos_id=1, pad_id=0, min_prompt=1, max_prompt=4):
    """A rollout-shaped batch: left-padded prompts, completions that end at an EOS (pad after it, attention 0)
    or run to T. Returns input_ids (N, P+T), attention_mask (N, P+T), completion_mask (N, T), P."""
    prompt_ids, prompt_mask = left_padded_prompts(gen, N, vocab_size, min_prompt, max_prompt)
    comp = torch.randint(2, vocab_size, (N, T), generator=gen)
    comp_att = torch.ones(N, T, dtype=torch.long)
    comp_mask = torch.ones(N, T)
    for n in range(N):
        if n % 2 == 0:
            e = randint(gen, 0, T - 1)
            comp[n, e] = eos_id
            comp[n, e + 1:] = pad_id
            comp_att[n, e + 1:] = 0
            comp_mask[n, e + 1:] = 0
    return (torch.cat([prompt_ids, comp], 1), torch.cat([prompt_mask, comp_att], 1), comp_mask,
            prompt_ids.shape[1])


def draw_loss_inputs(gen, N, T, spread=0.4):
    """logp, old_logp, ref_logp (N, T) float64; advantages (N,); a mask with rows of different lengths."""
    old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
    logp = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * spread  # ratios on both sides of the clip
    ref = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.5
    adv = torch.randn(N, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (N,), generator=gen)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    return logp, old, ref, adv, mask


def poisoned(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with +inf, -inf and NaN in turn wherever mask is 0: what a padded position may hold."""
    junk = torch.tensor([math.inf, -math.inf, math.nan], dtype=x.dtype).repeat(x.numel() // 3 + 1)[:x.numel()]
    return torch.where(mask.bool(), x, junk.view_as(x))


def loss_and_grad(grpo, logp, old, ref, adv, mask, cfg, **kwargs):
    """The target's loss and its gradient with respect to logp (zero where the loss does not depend on it)."""
    loss, (grad,) = grpo.value_and_grad("grpo_loss", (logp, old, ref, adv, mask, cfg), wrt=(0,), kwargs=kwargs)
    assert loss.dim() == 0, f"loss: grpo_loss returned shape {tuple(loss.shape)}; it should be a scalar"
    assert grad is None or grad.shape == logp.shape, (
        f"loss: the gradient of the loss has shape {tuple(grad.shape)}, the log-probs {tuple(logp.shape)}")
    return loss.detach().double(), (torch.zeros_like(logp) if grad is None else grad.double())


def oracle_loss_and_grad(logp, old, ref, adv, mask, cfg, **kwargs):
    """The oracle's loss and its gradient with respect to logp."""
    return memo(_oracle_loss_and_grad, logp, old, ref, adv, mask, cfg, kwargs)


def _oracle_loss_and_grad(logp, old, ref, adv, mask, cfg, kwargs):
    logp = logp.clone().requires_grad_()
    loss = oracle.grpo_loss(logp, old, ref, adv, mask, cfg, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def rounded(x: torch.Tensor, digits: int = 3) -> list:
    """A tensor as (nested) lists of rounded floats, for messages."""
    def r(v):
        return [r(u) for u in v] if isinstance(v, list) else round(float(v), digits)
    return r(x.detach().cpu().double().tolist())


_memo = {}


def memo(fn, *args):
    """fn(*args), computed once per distinct input. The oracle's answers do not depend on the target, and
    `make verify` judges hundreds of targets on the same draws, so each answer is worked out once per process."""
    key = (fn.__qualname__, digest(args))
    if key not in _memo:
        _memo[key] = fn(*args)
    return _memo[key]


class Unanswered(BaseException):
    """Raised by a Rehearsal's contract calls (a BaseException, so that no check's own handler can catch it)."""


class Rehearsal:
    """A target that answers nothing, for rehearsing the checks before any target runs: a check run against it
    draws its inputs and works out the oracle's answers it needs before its first contract call, then stops."""
    GRPOConfig = staticmethod(contract.Config)
    Rollout = contract.Rollout

    def __getattr__(self, name):  # every contract function, value_and_grad, distributed
        raise Unanswered(name)


def rehearse(calls) -> None:
    """Run each check function with the Rehearsal as its target, (function, {argument: value}) without `grpo`,
    so that the oracle's answers are in the memo before the worker is ready (judge.client.Worker.ready). The
    global RNG is as it was afterwards, so the real run draws exactly what it would have drawn without this."""
    state = torch.get_rng_state()
    try:
        for fn, kwargs in calls:
            try:
                fn(grpo=Rehearsal(), **kwargs)
            except KeyboardInterrupt:
                raise
            except BaseException:  # Unanswered at its first contract call, or whatever the check made of that
                continue
    finally:
        torch.set_rng_state(state)


def digest(value) -> bytes:
    """A fingerprint of the data in value: tensors by their bytes, models by their state, the rest by repr."""
    h = hashlib.blake2b(digest_size=16)

    def feed(v):
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b"")
        elif isinstance(v, torch.nn.Module):
            h.update(type(v).__name__.encode())
            for name, t in v.state_dict().items():
                h.update(name.encode())
                feed(t)
        elif isinstance(v, (list, tuple)):
            for x in v:
                feed(x)
        elif isinstance(v, dict):
            for k in sorted(v, key=repr):
                h.update(repr(k).encode())
                feed(v[k])
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            for k, x in sorted(vars(v).items()):
                h.update(k.encode())
                feed(x)
        else:
            h.update(repr(v).encode())
    feed(value)
    return h.digest()
