"""The bug catalogue and the katas, as data: loading, planting bugs into the reference, rebuilding katas.

A bug is a list of exact edits ({find, replace}) on solutions/grpo.py; a kata is the reference with its bugs
planted, written to katas/NN-slug/grpo.py. `python -m grpo_katas.catalogue build` rebuilds every kata after a
change to the reference; the tests fail until it is run.
"""
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from grpo_katas import KATAS, REFERENCE

COMPONENTS = ["sampling", "advantages", "log-probs", "kl", "loss", "update", "training"]
TIERS = ["warm-up", "practice", "interview"]


@dataclass(frozen=True)
class Bug:
    id: str
    component: str
    what: str
    symptom: str
    thread: str
    checks: tuple
    edits: tuple  # ((find, replace), ...)


@dataclass(frozen=True)
class Kata:
    number: int
    slug: str
    title: str
    tier: str
    minutes: int
    bugs: tuple
    hints: tuple
    path: Path

    @property
    def name(self) -> str:
        return f"{self.number:02d}-{self.slug}"

    @property
    def loop(self) -> Path:
        return self.path / "grpo.py"

    @property
    def brief(self) -> str:
        return (self.path / "BRIEF.md").read_text()


class CatalogueError(Exception):
    pass


def load_bugs(path: Path = KATAS / "bugs.toml") -> dict:
    data = tomllib.loads(path.read_text())
    bugs = {}
    for b in data["bug"]:
        edits = tuple((e["find"], e["replace"]) for e in b["edit"])
        bug = Bug(b["id"], b["component"], b["what"], b["symptom"], b.get("thread", ""), tuple(b["checks"]), edits)
        if bug.id in bugs:
            raise CatalogueError(f"bug id {bug.id} appears twice in {path}")
        if bug.component not in COMPONENTS:
            raise CatalogueError(f"bug {bug.id}: unknown component {bug.component!r}")
        bugs[bug.id] = bug
    return bugs


def load_katas(root: Path = KATAS) -> list:
    katas = []
    for meta in sorted(root.glob("[0-9][0-9]-*/kata.toml")):
        d = tomllib.loads(meta.read_text())
        number, slug = meta.parent.name.split("-", 1)
        katas.append(Kata(int(number), slug, d["title"], d["tier"], int(d["minutes"]), tuple(d["bugs"]),
                          tuple(d["hints"]), meta.parent))
    return katas


def find_kata(number, katas=None):
    """The kata numbered `number` (an int or a string of digits), or a CatalogueError that lists the valid ones."""
    katas = load_katas() if katas is None else katas
    valid = ", ".join(str(k.number) for k in katas)
    if not re.fullmatch(r"\s*\d{1,3}\s*", str(number)):
        raise CatalogueError(f"N must be a kata number, got {number!r}; valid: {valid}")
    for k in katas:
        if k.number == int(number):
            return k
    raise CatalogueError(f"there is no kata {int(number)}; valid: {valid}")


def plant(source: str, bugs) -> str:
    """The source with each bug's edits applied in order; every `find` must occur exactly once."""
    for bug in bugs:
        for find, replace in bug.edits:
            count = source.count(find)
            if count != 1:
                raise CatalogueError(f"bug {bug.id}: edit target found {count} times, expected once:\n{find}")
            source = source.replace(find, replace)
    return source


def kata_source(kata: Kata, bugs: dict) -> str:
    return plant(REFERENCE.read_text(), [bugs[b] for b in kata.bugs])


def fail_to_pass(kata: Kata, bugs: dict) -> set:
    return set().union(*(bugs[b].checks for b in kata.bugs))


def fixed_bugs(kata, bugs, results) -> int:
    """How many planted bugs are fixed. A bug is judged by the checks that only it trips among the kata's bugs;
    where it shares all of them, by the checks of its own component. A check that did not run counts as failing."""
    count = 0
    for b in kata.bugs:
        others = set().union(*(bugs[o].checks for o in kata.bugs if o != b))
        mine = [c for c in bugs[b].checks if c not in others] or \
               [c for c in bugs[b].checks if c.split("::")[0] == bugs[b].component]
        count += all(results.get(c, {"passed": False})["passed"] for c in mine)
    return count


def build(root: Path = KATAS) -> list:
    """Rewrite every kata's loop from the reference and its bugs; returns the katas that changed."""
    bugs, changed = load_bugs(root / "bugs.toml"), []
    for kata in load_katas(root):
        text = kata_source(kata, bugs)
        if not kata.loop.exists() or kata.loop.read_text() != text:
            kata.loop.write_text(text)
            changed.append(kata.name)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m grpo_katas.catalogue build")
    changed = build()
    print(f"rebuilt {len(changed)} kata(s): {', '.join(changed) or 'none changed'}")
