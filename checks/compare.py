"""How every check compares what a target returned with what it expects: NaN and inf never pass.

A test written as "fail if abs(got - expected) > tol" passes a NaN, since every comparison with NaN is false;
so does "fail if any (step * adv < 0)", and so does max() over a list that holds one. Every comparison in
checks/ is therefore one of these, each true only on evidence:

    close(got, expected, atol, rtol)   every element within atol + rtol * |expected| (expected broadcasts to got)
    matches(got, expected, atol, rtol) the same, element by element, for a message that names where it fails
    at_least(got, bound)               every element finite and >= bound

Where the expected value is finite, a NaN or an infinity in got never matches it; where the expected value is
itself NaN or infinite, only the same value matches. Shapes are not broadcast against got: a result of the
wrong shape is not close to anything.
"""
import torch


def matches(got, expected, atol: float = 0.0, rtol: float = 0.0) -> torch.Tensor:
    """Element by element (got's shape): got within atol + rtol * |expected| of expected; NaN or inf never is,
    unless expected holds the same."""
    got = torch.as_tensor(got).detach().cpu().double()
    expected = torch.as_tensor(expected).detach().cpu().double().expand_as(got)
    within = (got - expected).abs() <= atol + rtol * expected.abs()                 # NaN and inf in got: False
    same = (got == expected) | (got.isnan() & expected.isnan())
    return torch.where(torch.isfinite(expected), within & torch.isfinite(got), same)


def close(got, expected, atol: float = 0.0, rtol: float = 0.0) -> bool:
    """Every element of got within atol + rtol * |expected| of expected (a scalar expected stands for every
    element); False for a shape expected cannot be broadcast to."""
    try:
        return bool(matches(got, expected, atol, rtol).all())
    except RuntimeError:  # the shapes do not fit
        return False


def at_least(got, bound: float) -> bool:
    """Every element of got finite and at least bound."""
    got = torch.as_tensor(got).detach().cpu().double()
    return bool((torch.isfinite(got) & (got >= bound)).all())


def worst(got, expected) -> int:
    """The flat index of the element of got furthest from expected, a NaN first: where a message should look."""
    got = torch.as_tensor(got).detach().cpu().double()
    expected = torch.as_tensor(expected).detach().cpu().double().expand_as(got)
    return int((got - expected).abs().nan_to_num(nan=float("inf")).reshape(-1).argmax())
