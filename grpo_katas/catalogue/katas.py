"""The bug catalogue, the codebases and the katas, as data: loading, planting bugs into a codebase, rebuilding katas.

    katas/bugs.toml           every bug: what is wrong, the symptom, the thread, the checks that catch it, its tells
    katas/edits/CODEBASE.toml how each bug is planted into that codebase (exact find/replace edits) or why it cannot
                              be, and tells in that codebase's own words
    katas/NN-slug/kata.toml   a kata: title, tier, time box, codebase, bugs, hint ladder, the symptoms its brief cites

A kata's grpo.py is its codebase with its bugs planted, so the kata with its fixes applied is that codebase byte
for byte. `python -m grpo_katas.catalogue.katas build` rebuilds every kata after a change to a codebase or an edit; the
tests fail until it is run.
"""
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from grpo_katas import KATAS, REFERENCE, ROOT


COMPONENTS = ["sampling", "advantages", "log-probs", "kl", "loss", "update", "training"]
# the checks' components, then the brief's run: grading trains the file as `make run` does and requires each symptom
# its brief cites to be gone (grpo_katas/judge/brief.py); no bug is declared against it
CHECK_COMPONENTS = [*COMPONENTS, "run"]
TIERS = ["warm-up", "practice", "frontier", "interview"]
RUN_DEFAULTS = {"steps": 40, "seed": 0, "nproc": 1, "set": {}}   # a kata's run, unless its kata.toml says


class CatalogueError(Exception):
    pass


@dataclass(frozen=True)
class Codebase:
    name: str
    path: Path
    style: str   # in whose manner it is written: its row of the README's table of four codebases


CODEBASES = {c.name: c for c in [
    Codebase("paper", REFERENCE,
             "a train loop as nanoGPT's `train.py` writes one (`master_process`, the gradient-sync toggle while "
             "accumulating, an `iter N: loss ..., time ...ms` line, `--key=value` overrides as its `configurator.py` "
             "takes them: `python solutions/grpo.py --beta=0.1`) over the paper's steps as small functions "
             "(the reference)"),
    Codebase("trainer", ROOT / "solutions" / "codebases" / "trainer.py",
             "a trainer class whose `_prepare_inputs` buffers a generation batch and serves it in micro-batches "
             "to `training_step`, the training loop stepping the optimizer, a reference from "
             "`create_reference_model`, TRL's `GRPOTrainer`"),
    Codebase("script", ROOT / "solutions" / "codebases" / "script.py",
             "one script in nanochat's voice (a generator of batches, sampling with the KV cache, `print0` on "
             "rank 0, a comment at each step), nanochat's `scripts/chat_rl.py`"),
    Codebase("core", ROOT / "solutions" / "codebases" / "core.py",
             "core algorithms over a batch of rollouts (token-level scores, advantages grouped by a uuid per "
             "prompt) and an actor's staged update (mini- and micro-batches, global-batch loss normalizers), "
             "driven by a `PPOTrainer.fit` through an `ActorRolloutRefWorker` and launched as `main_ppo`'s "
             "`main(config)`, verl's `core_algos.py`, `dp_actor.py` and `ray_trainer.py`"),
]}


@dataclass(frozen=True)
class CheckId:
    """One check: the component it judges and its name, written `component::name`, sorted in pipeline order."""
    component: str
    name: str

    @classmethod
    def parse(cls, text: str) -> "CheckId":
        component, sep, name = str(text).partition("::")
        if not sep or component not in CHECK_COMPONENTS or not name:
            raise CatalogueError(f"{text!r} is not a check id (component::name, component one of "
                                 f"{CHECK_COMPONENTS})")
        return cls(component, name)

    def __str__(self) -> str:
        return f"{self.component}::{self.name}"

    def __lt__(self, other: "CheckId") -> bool:
        order = CHECK_COMPONENTS.index
        return (order(self.component), self.name) < (order(other.component), other.name)


RUN_CHECK = CheckId("run", "brief_symptoms_gone")   # the brief's run, judged as one check


@dataclass(frozen=True)
class Bug:
    id: str
    component: str
    what: str
    symptom: str
    thread: str
    checks: tuple                               # (CheckId, ...)
    tells: tuple = ()                           # words that would give the bug away in a kata that carries it
    edits: dict = field(default_factory=dict)   # codebase -> ((find, replace), ...)
    skip: dict = field(default_factory=dict)    # codebase -> why the bug cannot be planted there
    declared: dict = field(default_factory=dict)  # codebase -> its own checks, where they differ (with a why)
    local_tells: dict = field(default_factory=dict)  # codebase -> tells in that codebase's own words only

    def tells_for(self, codebase: str) -> tuple:
        return self.tells + self.local_tells.get(codebase, ())

    def applies_to(self, codebase: str) -> bool:
        return codebase in self.edits

    def checks_in(self, codebase: str) -> tuple:
        return self.declared.get(codebase, self.checks)


@dataclass(frozen=True)
class Kata:
    number: int
    slug: str
    title: str
    tier: str
    minutes: int
    codebase: str
    bugs: tuple
    hints: tuple
    symptoms: tuple     # ({"metric", "window", "relation", ...}, ...): what the brief cites, checked by verify
    run: dict           # the run the brief describes and `make run` makes: steps, seed, nproc, set (overrides)
    path: Path
    drill: bool = False  # drawn by `make drill` into work/drills/, not one of the repository's katas

    @property
    def key(self) -> str:
        """What a user types after N=: 7 for kata 7, d3 for drill 3."""
        return f"d{self.number}" if self.drill else str(self.number)

    @property
    def name(self) -> str:
        return f"d{self.number:02d}-drill" if self.drill else f"{self.number:02d}-{self.slug}"

    @property
    def loop(self) -> Path:
        return self.path / "grpo.py"

    @property
    def brief(self) -> str:
        return (self.path / "BRIEF.md").read_text()

    @property
    def settings(self) -> list:
        """The run's GRPOConfig overrides as KEY=VALUE words (make run SET=...)."""
        return [f"{k}={v}" for k, v in self.run["set"].items()]


def load_bugs(root: Path = KATAS) -> dict:
    data = tomllib.loads((root / "bugs.toml").read_text())
    bugs = {}
    for b in data["bug"]:
        if b["id"] in bugs:
            raise CatalogueError(f"bug id {b['id']} appears twice in {root / 'bugs.toml'}")
        if b["component"] not in COMPONENTS:
            raise CatalogueError(f"bug {b['id']}: unknown component {b['component']!r}")
        bugs[b["id"]] = Bug(b["id"], b["component"], b["what"], b["symptom"], b.get("thread", ""),
                            tuple(CheckId.parse(c) for c in b["checks"]), tuple(b.get("tells", ())), {}, {}, {})
    for name in CODEBASES:
        path = root / "edits" / f"{name}.toml"
        data = tomllib.loads(path.read_text()) if path.exists() else {}
        for e in data.get("edit", []):
            if e["bug"] not in bugs:
                raise CatalogueError(f"{path}: an edit for unknown bug {e['bug']!r}")
            bugs[e["bug"]].edits.setdefault(name, []).append((e["find"], e["replace"]))
        for s in data.get("skip", []):
            if s["bug"] not in bugs:
                raise CatalogueError(f"{path}: a skip for unknown bug {s['bug']!r}")
            bugs[s["bug"]].skip[name] = s["why"]
        for d in data.get("declare", []):  # where the codebase's structure makes a bug trip other checks
            if d["bug"] not in bugs or not d.get("why"):
                raise CatalogueError(f"{path}: a declare needs a known bug and a why")
            bugs[d["bug"]].declared[name] = tuple(CheckId.parse(c) for c in d["checks"])
        for t in data.get("tell", []):  # words that give a bug away in this codebase's own idiom
            if t["bug"] not in bugs:
                raise CatalogueError(f"{path}: tells for unknown bug {t['bug']!r}")
            local = bugs[t["bug"]].local_tells
            local[name] = local.get(name, ()) + tuple(t["words"])
    for bug in bugs.values():
        for name in list(bug.edits):
            bug.edits[name] = tuple(bug.edits[name])
    return bugs


def load_katas(root: Path = KATAS) -> list:
    katas = []
    for meta in sorted(root.glob("[0-9][0-9]-*/kata.toml")):
        d = tomllib.loads(meta.read_text())
        number, slug = meta.parent.name.split("-", 1)
        codebase = d.get("codebase", "paper")
        if codebase not in CODEBASES:
            raise CatalogueError(f"{meta}: unknown codebase {codebase!r}; one of {', '.join(CODEBASES)}")
        run = {**RUN_DEFAULTS, **d.get("run", {})}
        katas.append(Kata(int(number), slug, d["title"], d["tier"], int(d["minutes"]), codebase, tuple(d["bugs"]),
                          tuple(d["hints"]), tuple(d.get("symptom", ())), run, meta.parent))
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


def plant(source: str, bugs, codebase: str = "paper") -> str:
    """The codebase's source with each bug's edits applied in order; every `find` must occur exactly once."""
    for bug in bugs:
        if not bug.applies_to(codebase):
            why = bug.skip.get(codebase, "no edits are recorded for it")
            raise CatalogueError(f"bug {bug.id} cannot be planted in the {codebase} codebase: {why}")
        for old, new in bug.edits[codebase]:
            count = source.count(old)
            if count != 1:
                raise CatalogueError(f"bug {bug.id} ({codebase}): edit target found {count} times, expected once:\n"
                                     f"{old}")
            source = source.replace(old, new)
    return source


def codebase_source(name: str) -> str:
    return CODEBASES[name].path.read_text()


def kata_source(kata: Kata, bugs: dict) -> str:
    return plant(codebase_source(kata.codebase), [bugs[b] for b in kata.bugs], kata.codebase)


def fail_to_pass(kata: Kata, bugs: dict) -> set:
    return set().union(*(bugs[b].checks_in(kata.codebase) for b in kata.bugs))


def tells_in(text: str, bugs, codebase: str) -> list:
    """(bug id, tell) for every tell of these bugs in this codebase that the text contains (case-insensitive)."""
    lower = text.lower()
    return [(b.id, t) for b in bugs for t in b.tells_for(codebase) if t.lower() in lower]


def fixed_bug_ids(kata: Kata, bugs: dict, verdicts: dict) -> list:
    """The planted bugs that are fixed. A bug is judged by the checks that only it trips among the kata's bugs;
    where it shares all of them, by the checks of its own component; and a kata of one bug, by its brief's run too
    where that was judged (checks that pass while training shows the brief's symptoms fix nothing). A check that did
    not run counts as failing."""
    if len(kata.bugs) == 1 and RUN_CHECK in verdicts and not verdicts[RUN_CHECK].passed:
        return []
    fixed = []
    for b in kata.bugs:
        declared = bugs[b].checks_in(kata.codebase)
        others = set().union(*(bugs[o].checks_in(kata.codebase) for o in kata.bugs if o != b))
        mine = [c for c in declared if c not in others] or [c for c in declared if c.component == bugs[b].component]
        if all(c in verdicts and verdicts[c].passed for c in mine):
            fixed.append(b)
    return fixed


def fixed_bugs(kata: Kata, bugs: dict, verdicts: dict) -> int:
    """How many planted bugs are fixed (see fixed_bug_ids)."""
    return len(fixed_bug_ids(kata, bugs, verdicts))


def build(root: Path = KATAS) -> list:
    """Rewrite every kata's loop from its codebase and its bugs; returns the katas that changed."""
    bugs, changed = load_bugs(root), []
    for kata in load_katas(root):
        text = kata_source(kata, bugs)
        if not kata.loop.exists() or kata.loop.read_text() != text:
            kata.loop.write_text(text)
            changed.append(kata.name)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m grpo_katas.catalogue.katas build")
    changed = build()
    print(f"rebuilt {len(changed)} kata(s): {', '.join(changed) or 'none changed'}")
