"""Saved progress: work/state.json, your working copies in work/NN-slug/ and cached runs in work/cache/ (all
git-ignored).

    {"katas": {"7": {"hints": 2, "started": ISO, "solved": ISO, "seconds": 312.0, "hints_before_solving": 1,
                     "revealed_unsolved": ISO, "history": [...]}},
     "round": {...}}                                     (the open mock round, see rounds.py)

Each kata's record holds the hint ladder's rung, when it was started and solved, the hints taken before solving,
when the solution was revealed unsolved, and the attempts before a reset (`history`, records of the same shape).
Every write is atomic: a temporary file renamed over the old one. A state file that cannot be parsed, or whose
shape is not this version's, is set aside and reported (on the logger of this module), never fatal. No function
here overwrites a working copy without a timestamped backup.
"""
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from grpo_katas import ROOT, UserError

WORK = ROOT / "work"
log = logging.getLogger(__name__)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def shown(path: Path) -> str:
    """A path as a user would type it: relative to the repository when it lies inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --- the state file ------------------------------------------------------------------------------------

# The types of the fields this version reads; other fields are kept as they are.
RECORD_FIELDS = {"hints": int, "started": str, "solved": str, "seconds": (int, float), "revealed_unsolved": str,
                 "hints_before_solving": int, "history": list}
DRILL_FIELDS = {"made": str, "recorded": bool, "fixed": list}
CLASS_FIELDS = {"box": int, "attempts": list, "due": str}
ROUND_FIELDS = {"kata": (int, str), "started": str, "minutes": (int, float), "hints_at_start": int, "clock": list}


def check_shape(state) -> None:
    """Raise ValueError naming the first part of `state` that is not what this version writes."""
    if not isinstance(state, dict) or not isinstance(state.get("katas"), dict):
        raise ValueError("not an object with a \"katas\" object")

    def fields(obj, spec, where, required=()):
        if not isinstance(obj, dict):
            raise ValueError(f"{where} is a {type(obj).__name__}, not an object")
        for name in required:
            if name not in obj:
                raise ValueError(f"{where} has no {name}")
        for name, kind in spec.items():
            if name in obj and (not isinstance(obj[name], kind) or (isinstance(obj[name], bool) and kind is not bool)):
                raise ValueError(f"{where}.{name} is {obj[name]!r}")

    for n, record in state["katas"].items():
        fields(record, RECORD_FIELDS, f"katas.{n}", required=("hints",))
        for i, old in enumerate(record.get("history", [])):
            fields(old, RECORD_FIELDS, f"katas.{n}.history[{i}]")
    for key, entry in state.get("drills", {}).items():
        fields(entry, DRILL_FIELDS, f"drills.{key}")
    for key, entry in state.get("classes", {}).items():
        fields(entry, CLASS_FIELDS, f"classes.{key}", required=("box", "attempts"))
    if "round" in state:
        fields(state["round"], ROUND_FIELDS, "round", required=("kata", "started", "minutes"))
        for i, span in enumerate(state["round"].get("clock", [])):
            if not (isinstance(span, list) and len(span) == 2 and isinstance(span[0], str)
                    and isinstance(span[1], (str, type(None)))):
                raise ValueError(f"round.clock[{i}] is {span!r}")


def load_state() -> dict:
    """The saved progress. A file that cannot be parsed, or whose shape is not this version's, is set aside as
    state.json.corrupt-<time> (and reported) and progress starts afresh: the work files are never touched."""
    path = WORK / "state.json"
    if not path.exists():
        return {"katas": {}}
    try:
        state = json.loads(path.read_bytes())
        check_shape(state)
        return state
    except ValueError as exc:  # UnicodeDecodeError and json's errors are ValueErrors too
        aside = path.with_name(f"state.json.corrupt-{int(time.time())}")
        try:
            path.rename(aside)
        except OSError as err:
            raise UserError(f"progress file {shown(path)} is unreadable ({exc}) and cannot be set aside "
                            f"({err.strerror}); move it away yourself") from None
        log.warning(f"progress file {shown(path)} was unreadable ({exc}); set aside as {aside.name}, starting "
                    f"fresh. Your work files are untouched.")
        return {"katas": {}}
    except OSError as exc:
        raise UserError(f"cannot read your progress file {shown(path)}: {exc.strerror}") from None


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to a temporary file beside `path`, then rename it over `path`: a reader sees the old file or
    the new one, never half of one. On failure the temporary file is removed and the error raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_state(state: dict) -> None:
    try:
        write_json_atomic(WORK / "state.json", state)
    except OSError as exc:
        raise UserError(f"cannot save your progress to {shown(WORK / 'state.json')}: {exc.strerror or exc}; "
                        f"the file is as it was, and your work files are untouched") from None


# --- cached results (work/cache/), safe to delete ---------------------------------------------------------

def read_cache(name: str):
    """What write_cache stored under `name`, or None (never stored, or unreadable: then it is simply redone)."""
    try:
        return json.loads((WORK / "cache" / f"{name}.json").read_bytes())
    except (OSError, ValueError):
        return None


def write_cache(name: str, obj) -> None:
    """Store `obj` under `name`; a cache that cannot be written is only a lost saving, never an error."""
    try:
        write_json_atomic(WORK / "cache" / f"{name}.json", obj)
    except OSError:
        pass


def record_of(state: dict, kata) -> dict:
    """The kata's record in `state`, created empty on first use."""
    return state["katas"].setdefault(kata.key, {"hints": 0})


def elapsed(record: dict) -> float:
    """Seconds since the kata was started (0 when it never was)."""
    if "started" not in record:
        return 0.0
    return (datetime.now(timezone.utc) - datetime.fromisoformat(record["started"])).total_seconds()


# --- working copies ------------------------------------------------------------------------------------

def working_copy(kata) -> Path:
    """work/<kata name>/grpo.py; a copy started under the kata's earlier name (same number) is still yours."""
    path = WORK / kata.name / "grpo.py"
    if not path.exists():
        number = kata.name.split("-")[0]
        earlier = sorted(WORK.glob(f"{number}-*/grpo.py"))
        if earlier:
            return earlier[0]
    return path


def require_copy(kata) -> Path:
    path = working_copy(kata)
    if not path.exists():
        raise UserError(f"no working copy of kata {kata.key} yet; start it with `make kata N={kata.key}`")
    return path


def start(kata) -> bool:
    """Create the working copy unless there is one, and note when the kata was started. True if it was there."""
    path = working_copy(kata)
    resumed = path.exists()
    if not resumed:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kata.loop, path)
    state = load_state()
    record_of(state, kata).setdefault("started", now())
    save_state(state)
    return resumed


def reset(kata) -> Path | None:
    """Back up the working copy (returns the backup, None when there was none), restore the pristine kata and
    start a fresh record; the old one goes to the record's history."""
    path = working_copy(kata)
    backup = None
    if path.exists():
        backup = path.parent / "backups" / f"grpo-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}.py"
        backup.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(kata.loop, path)
    state = load_state()
    old = state["katas"].pop(kata.key, None)
    history = (old or {}).pop("history", []) + ([old] if old else [])
    state["katas"][kata.key] = {"hints": 0, "started": now(), "history": history}
    save_state(state)
    return backup


# --- what happens to a kata ----------------------------------------------------------------------------

def solve(kata) -> dict:
    """Record the kata as solved (once: the first time the checks pass) and return its record."""
    state = load_state()
    record = record_of(state, kata)
    if not record.get("solved"):
        record["solved"], record["seconds"] = now(), elapsed(record)
        record["hints_before_solving"] = record["hints"]
        save_state(state)
    return record


def hints_counted(record: dict) -> int:
    """The hints that count against a kata: those taken before it was solved. A hint read afterwards is
    curiosity, not help."""
    return record.get("hints_before_solving", record.get("hints", 0)) if record.get("solved") else \
        record.get("hints", 0)


def next_hint(kata) -> int:
    """Climb one rung of the hint ladder (staying on the last) and return the rung to show, 1-based."""
    state = load_state()
    record = record_of(state, kata)
    level = min(record["hints"] + 1, len(kata.hints))
    record["hints"] = max(record["hints"], level)
    save_state(state)
    return level


def reveal(kata, force: bool) -> None:
    """Allow the solution once the kata is solved; with force before that too, which is recorded."""
    state = load_state()
    record = record_of(state, kata)
    if record.get("solved"):
        return
    if not force:
        raise UserError(f"kata {kata.key} is not solved yet; `make check N={kata.key}` must pass first "
                        f"(or `make solution N={kata.key} FORCE=1` to reveal it anyway, which is recorded)")
    record["revealed_unsolved"] = now()
    save_state(state)


@dataclass(frozen=True)
class Status:
    """Where a kata stands, for `make list`."""
    label: str                   # "solved", "in progress" or "not started"
    seconds: float | None        # time to solve it, or time spent so far; None when not started
    hints: int                   # hints taken before solving (all of them while unsolved)
    solved_before_reset: bool    # an attempt before a reset solved it
    revealed_early: bool         # the solution was shown (FORCE=1) before this attempt solved it


def status(state: dict, kata) -> Status:
    record = state["katas"].get(kata.key, {})
    before = any(old.get("solved") for old in record.get("history", []))
    if record.get("solved"):
        label, seconds = "solved", record["seconds"]
    elif working_copy(kata).exists():
        label, seconds = "in progress", elapsed(record) if "started" in record else None
    else:
        label, seconds = "not started", None
    return Status(label, seconds, hints_counted(record), before, "revealed_unsolved" in record)
