"""The linter rule (grpo_katas/proof/lint.py): ruff's findings that a planting adds to its codebase are refused, those the
codebase carries itself are not, and a proof without ruff fails in one line.

    .venv/bin/python -m pytest -q tests/test_lint.py
"""
from grpo_katas.proof import lint, verify


HEALTHY = '''import copy

import torch


def reference(policy):
    ref = copy.deepcopy(policy).requires_grad_(False)
    return ref


def loss(per_token, mask, loss_type):
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    return (per_token * mask).sum()


def pairs(a, b):
    return list(zip(a, b))
'''


def test_a_finding_the_planting_adds_is_refused_and_one_the_codebase_carries_is_not():
    planted = {
        # the import left unused where the reference was built (F401)
        "unused-import": HEALTHY.replace("copy.deepcopy(policy).requires_grad_(False)", "policy"),
        # a dropped result of a pure call is no finding of ruff's; a useless comparison is (B015)
        "useless-comparison": HEALTHY.replace("    return ref\n", "    ref == policy\n    return ref\n"),
        # two arms made alike (SIM114)
        "same-arms": HEALTHY.replace("((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
                                     "(per_token * mask).sum() / mask.sum().clamp(min=1.0)"),
        # the zip without strict= is the codebase's own (B905), here moved three lines down
        "moved": HEALTHY.replace("import torch\n", "import torch\n\n\n\n"),
    }
    found = lint.planted_findings({"c": HEALTHY}, {k: ("c", v) for k, v in planted.items()})
    assert sorted(found) == ["same-arms", "unused-import", "useless-comparison"], found
    assert [f.split(" on ")[0] for f in found["unused-import"]] == ["ruff F401"]
    assert "`import copy`" in found["unused-import"][0]
    assert [f.split(" on ")[0] for f in found["useless-comparison"]] == ["ruff B015"]
    assert [f.split(" on ")[0] for f in found["same-arms"]] == ["ruff SIM114"]


def test_a_second_copy_of_a_finding_the_codebase_carries_once_is_refused():
    planted = HEALTHY + "\n\ndef more(a, b):\n    return list(zip(a, b))\n"
    found = lint.planted_findings({"c": HEALTHY}, {"p": ("c", planted)})
    assert [f.split(" on ")[0] for f in found["p"]] == ["ruff B905"]


def test_without_ruff_the_rule_is_one_problem_and_the_static_tier_fails(monkeypatch, capsys):
    monkeypatch.setattr(lint.shutil, "which", lambda *a, **k: None)
    problems = verify.lint_problems({"c": HEALTHY}, {"p": ("c", HEALTHY)})
    assert len(problems) == 1 and problems[0].startswith("ruff is not installed"), problems
    monkeypatch.setattr(verify, "static_problems", lambda katas: [])
    monkeypatch.setattr(verify, "structural_tells", lambda healthy, planted: [])
    assert verify.main(["--tier", "static"]) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  FAIL")]
    assert fails == ["  FAIL " + problems[0]], fails
