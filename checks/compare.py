"""How every check compares what a target returned with what it expects: NaN and inf never pass.

A test written as "fail if abs(got - expected) > tol" passes a NaN, since every comparison with NaN is false;
so does "fail if any (step * adv < 0)", and so does max() over a list that holds one. Every comparison in
checks/ is therefore one of these, each true only on evidence:

    close(got, expected, atol, rtol)   every element within atol + rtol * |expected| (expected broadcasts to got)
    matches(got, expected, atol, rtol) the same, element by element, for a message that names where it fails
    at_least(got, bound)               every element finite and >= bound
    shaped(got, shape)                 got itself, where it is a tensor of the contract's shape

Where the expected value is finite, a NaN or an infinity in got never matches it; where the expected value is
itself NaN or infinite, only the same value matches. Nothing is true of an answer with no element ("every element
is close" holds of an empty tensor), and only a single number stands for every element: an expected value of any
other shape must be got's shape exactly. An empty or mis-shaped answer fails the check that compares it, with a
message naming both shapes (Unshaped, an AssertionError: the check's own verdict, whatever message it had ready).
"""
import torch


class Unshaped(AssertionError):
    """An answer with no element, or of another shape than the value it is compared with."""


def answer(got, expected=None) -> tuple:
    """(got, expected) as float64 tensors on the CPU, expected spread over got's shape; Unshaped when got has no
    element or expected is neither a single number nor of got's shape."""
    got = torch.as_tensor(got).detach().cpu().double()
    if expected is not None:
        expected = torch.as_tensor(expected).detach().cpu().double()
        if expected.dim() and expected.shape != got.shape:
            raise Unshaped(f"an answer of shape {tuple(got.shape)} where one of shape {tuple(expected.shape)} was "
                           f"expected")
    if got.numel() == 0:
        raise Unshaped(f"an empty answer (shape {tuple(got.shape)}) where "
                       + (f"one of shape {tuple(expected.shape)}" if expected is not None and expected.dim()
                          else "at least one number") + " was expected")
    return got, None if expected is None else expected.expand_as(got)


def shaped(got, shape, what: str = "an answer"):
    """got, when it is a tensor of the contract's `shape`; else Unshaped naming both shapes."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(shape):
        found = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
        raise Unshaped(f"{what} of {found} where the contract's shape is {tuple(shape)}")
    return got


def matches(got, expected, atol: float = 0.0, rtol: float = 0.0) -> torch.Tensor:
    """Element by element (got's shape): got within atol + rtol * |expected| of expected; NaN or inf never is,
    unless expected holds the same."""
    got, expected = answer(got, expected)
    within = (got - expected).abs() <= atol + rtol * expected.abs()                 # NaN and inf in got: False
    same = (got == expected) | (got.isnan() & expected.isnan())
    return torch.where(torch.isfinite(expected), within & torch.isfinite(got), same)


def close(got, expected, atol: float = 0.0, rtol: float = 0.0) -> bool:
    """Every element of got within atol + rtol * |expected| of expected (a single number stands for every
    element)."""
    return bool(matches(got, expected, atol, rtol).all())


def at_least(got, bound: float) -> bool:
    """Every element of got finite and at least bound."""
    got, _ = answer(got)
    return bool((torch.isfinite(got) & (got >= bound)).all())


def worst(got, expected) -> int:
    """The flat index of the element of got furthest from expected, a NaN first: where a message should look."""
    got, expected = answer(got, expected)
    return int((got - expected).abs().nan_to_num(nan=float("inf")).reshape(-1).argmax())
