"""Every comparison of the checks is true only on evidence (checks/compare.py): no NaN, no infinity, and no empty or
mis-shaped answer passes one, and a file that answers with empty tensors heals nothing. Run: pytest
tests/test_compare.py"""
import pytest
import torch

from checks.compare import Unshaped, at_least, close, matches, worst
from grpo_katas.catalogue.katas import fail_to_pass, find_kata, load_bugs
from grpo_katas.judge import matrix


@pytest.mark.parametrize("empty", [torch.empty(0), torch.empty(0, 4), torch.empty(3, 0)])
@pytest.mark.parametrize("compare", [lambda got: close(got, 0.0), lambda got: close(got, torch.zeros(())),
                                     lambda got: at_least(got, -1e9), lambda got: matches(got, 1.0).all(),
                                     lambda got: worst(got, 0.0)])
def test_an_empty_answer_passes_no_comparison_and_the_failure_names_its_shape(empty, compare):
    with pytest.raises(Unshaped) as failed:
        compare(empty)
    assert f"an empty answer (shape {tuple(empty.shape)})" in str(failed.value)


@pytest.mark.parametrize("got, expected", [
    (torch.zeros(4), torch.zeros(1, 4)),     # a shape that would broadcast to the expected one
    (torch.zeros(1), torch.zeros(4)),        # a single number where four are expected
    (torch.zeros(2, 4), torch.zeros(4)),     # an expected row spread over the answer's rows
    (torch.empty(0, 4), torch.zeros(2, 4)),  # no row where two are expected
])
def test_an_answer_of_another_shape_than_the_expected_one_fails_naming_both(got, expected):
    with pytest.raises(Unshaped) as failed:
        close(got, expected)
    assert str(tuple(got.shape)) in str(failed.value) and str(tuple(expected.shape)) in str(failed.value)


def test_a_single_number_stands_for_every_element_and_nan_or_inf_never_passes():
    assert close(torch.zeros(2, 3), 0.0) and close(torch.zeros(2, 3), torch.tensor(0.0)) and close(0.0, 0.0)
    assert close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-9]), atol=1e-8)
    assert not close(torch.tensor([0.0, float("nan")]), 0.0, atol=1.0)
    assert not close(torch.tensor([float("inf")]), 0.0, atol=1e30)
    assert close(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    assert not at_least(torch.tensor([1.0, float("nan")]), 0.0) and at_least(torch.tensor([1.0, 2.0]), 1.0)
    assert issubclass(Unshaped, AssertionError)  # the check's own verdict (kind "assertion"), never a crash


EMPTIES = {"empty": "empty(0)", "empty-rows": "empty(0, 4)"}
RETURNING_TENSORS = ("completion_mask", "group_advantages", "token_logprobs", "token_entropies", "kl_penalty",
                     "grpo_loss")
# the kata's own functions for its own callers, an empty tensor for anyone else's call (the judge's)
EMPTY_OUTSIDE = """

import sys as _sys

import torch as _torch


def _empty_outside(fn):
    def answer(*args, **kwargs):
        own = _sys._getframe(1).f_globals.get("__name__") == __name__
        return fn(*args, **kwargs) if own else _torch.EMPTY
    return answer


"""


ANSWERED = {"advantages", "kl", "log-probs", "loss"}  # the components whose checks call only those functions


@pytest.mark.slow
def test_a_file_that_answers_the_judge_with_empty_tensors_passes_no_check_that_reads_them(tmp_path):
    """Kata 1's file, training as it does, but answering each call the judge makes to a contract function that
    returns a tensor with an empty one (as issue 41's red team's file did, which got RESOLVED_PARTIAL with nothing
    fixed): no check of those functions passes, none fails by the checks' own crash, and every check the kata fails
    still fails."""
    kata = find_kata(1)
    targets = []
    for name, empty in EMPTIES.items():
        path = tmp_path / f"{name}.py"
        path.write_text(kata.loop.read_text() + EMPTY_OUTSIDE.replace("EMPTY", empty) + "".join(
            f"{fn} = _empty_outside({fn})\n" for fn in RETURNING_TENSORS))
        targets.append(path)
    run = matrix.run(targets, seeds=(0,))
    failing = fail_to_pass(kata, load_bugs())
    for i, path in enumerate(targets):
        verdicts = run.of(i, 0)
        passed = sorted(str(c) for c, v in verdicts.items() if v.passed and (c.component in ANSWERED or c in failing))
        assert not passed, f"{path.name}: an empty answer passes {passed}"
        crashed = sorted(f"{c}: {v.message[:200]}" for c, v in verdicts.items() if v.kind == "error")
        assert not crashed, f"{path.name}: the checks' own code crashed on an empty answer: {crashed}"


@pytest.mark.slow
def test_a_kl_penalty_that_answers_the_judge_with_one_zero_passes_no_kl_check(tmp_path):
    """A single 0 where the contract gives one penalty a token is never negative and is zero at the reference: the
    kl checks hold kl_penalty's answer to the log-probs' shape."""
    path = tmp_path / "one-zero.py"
    path.write_text(find_kata(1).loop.read_text() + EMPTY_OUTSIDE.replace("EMPTY", "zeros(1)")
                    + "kl_penalty = _empty_outside(kl_penalty)\n")
    verdicts = matrix.run([path], seeds=(0,)).of(0, 0)
    passed = sorted(str(c) for c, v in verdicts.items() if v.passed and c.component == "kl")
    assert not passed, f"a single 0 passes {passed}"
