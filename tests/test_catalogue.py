"""The catalogue and the katas as data. Run: pytest tests/test_catalogue.py
(The checks-by-bugs proof itself is `make verify`, which `make test` runs.)"""
import re
from collections import Counter

from grpo_katas import ROOT
from grpo_katas.catalogue.katas import (CODEBASES, COMPONENTS, TIERS, codebase_source, fixed_bugs, kata_source,
                                        load_bugs, load_katas, plant)


BUGS, KATAS = load_bugs(), load_katas()


def test_the_catalogue_is_large_and_covers_every_component():
    assert len(BUGS) >= 73
    assert set(b.component for b in BUGS.values()) == set(COMPONENTS)
    assert all(b.what and b.symptom and b.checks for b in BUGS.values())


def test_every_bug_plants_alone_in_every_codebase_it_applies_to():
    for name in CODEBASES:
        source = codebase_source(name)
        for bug in BUGS.values():
            if bug.applies_to(name):
                assert plant(source, [bug], name) != source, (bug.id, name)
            else:
                assert bug.skip.get(name), f"{bug.id} has no edits for {name} and no reason why not"


def test_katas_are_the_reference_plus_their_bugs():
    stale = [k.name for k in KATAS if k.loop.read_text() != kata_source(k, BUGS)]
    assert not stale, f"rebuild with `make katas`: {stale}"


def test_tiers_and_counts():
    tiers = Counter(k.tier for k in KATAS)
    assert len(KATAS) >= 32 and set(tiers) <= set(TIERS)
    assert tiers["warm-up"] >= 8 and tiers["practice"] >= 8 and tiers["frontier"] >= 15 and tiers["interview"] >= 8
    for k in KATAS:
        n = {"warm-up": (1, 1), "practice": (2, 3), "frontier": (1, 3), "interview": (4, 6)}[k.tier]
        assert n[0] <= len(k.bugs) <= n[1], k.name
        assert len(k.hints) == 3 and k.minutes > 0 and all(b in BUGS for b in k.bugs)
    interview_components = [{BUGS[b].component for b in k.bugs} for k in KATAS if k.tier == "interview"]
    assert all(len(c) >= 4 for c in interview_components)


def test_nothing_in_a_kata_gives_a_bug_away():
    tell = re.compile(r"bug|wrong|fixme|todo|xxx|hack|broken", re.IGNORECASE)
    for bug in BUGS.values():
        for name, edits in bug.edits.items():
            for _, replace in edits:
                assert not tell.search(replace), (bug.id, name, replace)
    for k in KATAS:
        assert not any(b.split("-")[0] in k.slug for b in k.bugs if len(b.split("-")[0]) > 4), k.name


def test_a_codebase_s_own_tells_hold_in_that_codebase_only():
    """The trainer cites the KL-estimator blog where it explains its k3 term; verl's kl_penalty cites it over a
    switch of every estimator, which names none of them as the right one."""
    from grpo_katas.catalogue.katas import tells_in
    bug, text = BUGS["kl-k1"], "See more description in http://joschu.net/blog/kl-approx.html"
    assert tells_in(text, [bug], "trainer") == [("kl-k1", "kl-approx")] and tells_in(text, [bug], "core") == []
    assert set(bug.tells) <= set(bug.tells_for("core"))


def test_fixed_bugs_are_counted_by_the_checks_only_they_trip():
    from grpo_katas.judge.matrix import Verdict
    kata = next(k for k in KATAS if k.number == 18)
    still_broken = ["adv-tiled-groups", "kl-beta-hardcoded"]
    failing = set().union(*(BUGS[b].checks for b in still_broken))
    every = set().union(*(b.checks for b in BUGS.values()))
    results = {c: Verdict(c not in failing) for c in every}
    assert fixed_bugs(kata, BUGS, results) == 2
    assert fixed_bugs(kata, BUGS, {c: Verdict(True) for c in every}) == 4
    assert fixed_bugs(kata, BUGS, {}) == 0


def test_the_readme_names_each_codebase_as_the_catalogue_describes_it():
    readme = (ROOT / "README.md").read_text()
    for c in CODEBASES.values():
        row = f"| {c.name} | `{c.path.relative_to(ROOT)}` | {c.style} |"
        assert row in readme, f"the README's codebase table has no row {row!r}"
