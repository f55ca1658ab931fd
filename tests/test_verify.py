"""The proof's two tiers (grpo_katas/verify.py): the test tier's rotation proves every bug alone once and every codebase
takes its share. Run: pytest tests/test_verify.py"""
from collections import Counter

from grpo_katas import verify
from grpo_katas.catalogue import CODEBASES, load_bugs, load_katas


def test_the_rotation_plants_every_bug_once_and_gives_every_codebase_its_share():
    bugs, katas = load_bugs(), load_katas()
    where = verify.rotation(bugs, katas)
    assert set(where) == set(bugs) and all(bugs[b].applies_to(name) for b, name in where.items())
    given = Counter(where.values())
    assert set(given) == set(CODEBASES) and min(given.values()) >= len(bugs) // (2 * len(CODEBASES)), given
    for kata in katas:  # a one-bug kata is its bug planted alone: the rotation proves the bug there, in one target
        if len(kata.bugs) == 1:
            assert where[kata.bugs[0]] == kata.codebase or any(
                k.bugs == kata.bugs and k.number < kata.number for k in katas), kata.name
