"""Saved progress: work/state.json, your working copies in work/NN-slug/ and cached runs in work/cache/ (all
git-ignored). This module is the one owner of the state file; the others change the state it hands them.

    {"katas": {"7": {"hints": 2, "started": ISO, "solved": ISO, "seconds": 312.0, "hints_before_solving": 1,
                     "revealed_unsolved": ISO, "spent": 300.0, "active_at": ISO, "resets": 1, "history": [...]}},
     "round": {...},                                     (the open mock round, see rounds.py)
     "drills": {"d1": {...}}, "classes": {...}}          (drills and their bug classes, see drills.py)

Each kata's record holds the hint ladder's rung, when it was started and solved, the hints taken before solving,
when the solution was revealed unsolved, its clock (`spent`, up to `active_at`), how often it was reset, and, from
versions that started a new record on reset, the attempts before one (`history`, records of the same shape).

The clock counts time spent, not time since `make kata`: work on a kata is a command run on it (kata, run, check,
watch, hint, solution, reset, mock) or a save of its working copy that one of them sees (watch sees every save); the
time between two of these is added, but a gap longer than IDLE_SECONDS counts as IDLE_SECONDS (you were away). A
reset keeps the record (solved stays solved, with its time and hints): it restores the file, not your history.

One command, one change, as rustlings keeps its AppState: `with update() as state:` loads the state under a lock
(work/.state.lock), hands it to the command, and writes it back once, atomically (a temporary file renamed over
the old one), when the block ends without an error. Long work (the checks, a drill's proof) happens before the
block, never inside it, so the lock is held for milliseconds and a command in another terminal (a hint beside
`make watch`) waits at most that long; since every change is made on the state as it is under the lock, neither
loses the other's. `load()` is a read for commands that change nothing. A state file that cannot be parsed, or
whose shape is not this version's, is set aside under a name of its own and reported (on this module's logger),
never fatal, and what can be read of it is kept (salvage): every kata record, drill, bug class and round of the
right shape, from the file as parsed or, when it does not parse (cut short, a stray byte), from each object in its
text that parses alone. No function here overwrites a working copy without a timestamped backup.
"""
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from grpo_katas import ROOT, WORK, UserError


LOCK_SECONDS = 30  # waiting longer than this for another command's change means it is stuck (Ctrl-Z?)
IDLE_SECONDS = 600  # a gap between two signs of work longer than this counts as this long: time away is not spent
log = logging.getLogger(__name__)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def shown(path: Path) -> str:
    """A path as a user would type it: relative to the repository when it lies inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def cannot_write(path: Path, exc: OSError) -> UserError:
    why = "it is a file, not a folder" if path.exists() and not path.is_dir() else exc.strerror or exc
    return UserError(f"cannot write {shown(path)}: {why}; your work is kept in {shown(WORK)}/, which must be a "
                     f"folder you can write to")


# --- the state file ------------------------------------------------------------------------------------

# The types of the fields this version reads; other fields are kept as they are. A time is an ISO string with
# its timezone, as now() writes it.
TIME = "time"
RECORD_FIELDS = {"hints": int, "started": TIME, "solved": TIME, "seconds": (int, float), "revealed_unsolved": TIME,
                 "hints_before_solving": int, "history": list, "spent": (int, float), "active_at": TIME,
                 "resets": int}
DRILL_FIELDS = {"made": TIME, "recorded": bool, "fixed": list}
CLASS_FIELDS = {"box": int, "attempts": list, "due": TIME}
ATTEMPT_FIELDS = {"at": TIME, "found": bool, "seconds": (int, float), "hints": int, "revealed": bool}
ROUND_FIELDS = {"kata": (int, str), "started": TIME, "minutes": (int, float), "hints_at_start": int, "clock": list}


def is_time(value) -> bool:
    try:
        return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


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
            if name not in obj:
                continue
            value = obj[name]
            ok = is_time(value) if kind == TIME else \
                isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not ok:
                raise ValueError(f"{where}.{name} is {value!r}")

    for n, record in state["katas"].items():
        fields(record, RECORD_FIELDS, f"katas.{n}", required=("hints",))
        for i, old in enumerate(record.get("history", [])):
            fields(old, RECORD_FIELDS, f"katas.{n}.history[{i}]")
    for part, spec, required in (("drills", DRILL_FIELDS, ()), ("classes", CLASS_FIELDS, ("box", "attempts"))):
        if not isinstance(state.get(part, {}), dict):
            raise ValueError(f"{part} is not an object")
        for key, entry in state.get(part, {}).items():
            fields(entry, spec, f"{part}.{key}", required)
            if part == "drills" and not re.fullmatch(r"d\d{1,4}", key):
                raise ValueError(f"drills.{key} is not a drill's name (d1, d2, ...)")
    for key, entry in state.get("classes", {}).items():
        for i, attempt in enumerate(entry["attempts"]):
            fields(attempt, ATTEMPT_FIELDS, f"classes.{key}.attempts[{i}]", required=("found", "seconds"))
    if "round" in state:
        fields(state["round"], ROUND_FIELDS, "round", required=("kata", "started", "minutes"))
        for i, span in enumerate(state["round"].get("clock", [])):
            if not (isinstance(span, list) and len(span) == 2 and is_time(span[0])
                    and (span[1] is None or is_time(span[1]))):
                raise ValueError(f"round.clock[{i}] is {span!r}")


def state_path() -> Path:
    return WORK / "state.json"


def read() -> tuple:
    """(the saved state, None), or (what could be salvaged of it, why it cannot be used whole) when it is corrupt
    or of the wrong shape."""
    path = state_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {"katas": {}}, None
    except OSError as exc:
        raise UserError(f"cannot read your progress file {shown(path)}: {exc.strerror}") from None
    try:
        state = json.loads(data)
        check_shape(state)
        return state, None
    except ValueError as exc:  # UnicodeDecodeError and json's errors are ValueErrors too
        return salvage(data), str(exc)


# A part of the state that parses alone, found in the text of a file that does not: (section, how to recognise it).
PARTS = [("katas", r"\d{1,3}|d\d{1,4}", "hints"), ("drills", r"d\d{1,4}", "made"),
         ("classes", r"[a-z0-9][a-z0-9-]*", "box"), ("round", r"round", "minutes")]


def salvage(data: bytes) -> dict:
    """The state that can be kept of an unusable file: each kata record, drill, bug class and the round that has
    this version's shape, taken from the file as parsed, or, when it does not parse, from each JSON object in its
    text that parses alone ("7": {"hints": 1, ...}); the first of a name wins."""
    text = data.decode("utf-8", "replace")
    try:
        whole = json.loads(text)
        found = [(section, key, value) for section in ("katas", "drills", "classes")
                 if isinstance(whole, dict) and isinstance(whole.get(section), dict)
                 for key, value in whole[section].items()]
        found += [("round", "round", whole["round"])] if isinstance(whole, dict) and "round" in whole else []
    except ValueError:
        found = list(parts_in(text))
    state = {"katas": {}}
    for section, key, value in found:
        trial = {"katas": {}, **({"round": value} if section == "round" else {section: {key: value}})}
        try:
            check_shape(trial)
        except (ValueError, KeyError, TypeError):
            continue
        if section == "round":
            state.setdefault("round", value)
        else:
            state.setdefault(section, {}).setdefault(key, value)
    return state


def parts_in(text: str):
    """(section, key, object) for each `"key": {...}` in the text that decodes alone and looks like a part."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r'"([^"\\]{1,100})"\s*:\s*(?=\{)', text):
        try:
            value, _ = decoder.raw_decode(text, m.end())
        except ValueError:
            continue
        for section, key_pattern, field in PARTS:
            if isinstance(value, dict) and field in value and re.fullmatch(key_pattern, m[1]):
                yield section, m[1], value
                break


def kept(state: dict) -> str:
    """What a salvaged state holds, in words."""
    parts = [f"{len(state[s])} {s.rstrip('s') if len(state[s]) == 1 else s} ({', '.join(sorted(state[s]))})"
             for s in ("katas", "drills") if state.get(s)]
    parts += [f"{len(state['classes'])} bug class(es)"] if state.get("classes") else []
    parts += ["the open mock round"] if state.get("round") else []
    return "kept what could be read of it: " + "; ".join(parts) if parts else "nothing in it could be read"


def set_aside(why: str, salvaged: dict) -> None:
    """Rename the unusable state file to a name no other set-aside file has, write what was salvaged of it in its
    place, and say so (under the lock)."""
    path = state_path()
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    aside, i = path.with_name(f"state.json.corrupt-{stamp}"), 2
    while aside.exists():
        aside, i = path.with_name(f"state.json.corrupt-{stamp}-{i}"), i + 1
    try:
        path.rename(aside)
    except OSError as err:
        raise UserError(f"progress file {shown(path)} is unreadable ({why}) and cannot be set aside "
                        f"({err.strerror}); move it away yourself") from None
    if salvaged != {"katas": {}}:
        save(salvaged)
    log.warning(f"progress file {shown(path)} was unreadable ({why}); set aside as {aside.name}, {kept(salvaged)}. "
                f"Your work files are untouched.")


@contextlib.contextmanager
def locked():
    """Hold work/.state.lock (an flock, released by the system if this process dies)."""
    try:
        WORK.mkdir(parents=True, exist_ok=True)
        fd = os.open(WORK / ".state.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise cannot_write(WORK, exc) from None
    try:
        deadline = time.monotonic() + LOCK_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UserError(f"another command has held {shown(WORK / '.state.lock')} for {LOCK_SECONDS} s; "
                                    f"finish or stop it (a suspended make?), then try again") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def load() -> dict:
    """The progress as it is now, for a command that only reads it. An unusable file is set aside."""
    state, why = read()
    if why is None:
        return state
    with locked():
        state, why = read()  # another command may have set it aside meanwhile
        if why is not None:
            set_aside(why, state)
    return state


@contextlib.contextmanager
def update():
    """The progress of one command, to change: loaded under the lock, written once, atomically, when the block
    ends without an error (and only if it changed)."""
    with locked():
        state, why = read()
        if why is not None:
            set_aside(why, state)
        before = json.dumps(state, sort_keys=True)
        yield state
        if json.dumps(state, sort_keys=True) != before:
            save(state)


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


def save(state: dict) -> None:
    try:
        write_json_atomic(state_path(), state)
    except OSError as exc:
        raise UserError(f"cannot save your progress to {shown(state_path())}: {exc.strerror or exc}; "
                        f"the file is as it was (what this command would have recorded is not), and any backup "
                        f"it made of your copy is in the kata's backups/ folder") from None


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


def active(state: dict, kata) -> dict:
    """Note work on the kata now (a command run on it), and a save of its working copy since the last note: the
    clock runs from one sign of work to the next, a gap over IDLE_SECONDS counting as IDLE_SECONDS. Returns the
    kata's record."""
    record = record_of(state, kata)
    saved = saved_at(kata)
    if saved and record.get("active_at") and saved > datetime.fromisoformat(record["active_at"]):
        tick(record, saved)
    tick(record, datetime.now(timezone.utc))
    return record


def tick(record: dict, at: datetime) -> None:
    last = record.get("active_at") or record.get("started")
    gap = (at - datetime.fromisoformat(last)).total_seconds() if last else 0.0
    record["spent"] = record.get("spent", 0.0) + min(max(gap, 0.0), IDLE_SECONDS)
    record["active_at"] = max(at, datetime.fromisoformat(last)).isoformat(timespec="seconds") if last else \
        at.isoformat(timespec="seconds")


def saved_at(kata) -> datetime | None:
    """When the working copy was last saved (never later than now), or None when there is none."""
    try:
        mtime = working_copy(kata).stat().st_mtime
    except OSError:
        return None
    return min(datetime.fromtimestamp(mtime, timezone.utc), datetime.now(timezone.utc))


def elapsed(record: dict, kata=None) -> float:
    """Seconds spent on the kata (its clock, see the module's docstring), a save of its copy seen after the last
    command included when `kata` is given; 0 when it was never started."""
    spent = record.get("spent", 0.0)
    last = record.get("active_at") or record.get("started")
    saved = saved_at(kata) if kata is not None else None
    if last and saved and saved > datetime.fromisoformat(last):
        spent += min((saved - datetime.fromisoformat(last)).total_seconds(), IDLE_SECONDS)
    return spent


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


def not_a_file(kata, path: Path) -> UserError:
    return UserError(f"{shown(path)} is a {'folder' if path.is_dir() else 'special file'}, not your working copy; "
                     f"`make reset N={kata.key}` moves it to backups/ and restores the pristine kata")


def require_copy(kata) -> Path:
    path = working_copy(kata)
    if not path.exists():
        raise UserError(f"no working copy of kata {kata.key} yet; start it with `make kata N={kata.key}`")
    if not path.is_file():
        raise not_a_file(kata, path)
    return path


def start(state: dict, kata) -> bool:
    """Create the working copy unless there is one, and note when the kata was started. True if it was there."""
    path = working_copy(kata)
    resumed = path.exists()
    if resumed and not path.is_file():
        raise not_a_file(kata, path)
    if not resumed:
        restore(kata, path)
    record_of(state, kata).setdefault("started", now())
    active(state, kata)
    return resumed


def restore(kata, path: Path) -> None:
    """The pristine kata at `path`, the working copy's place."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kata.loop, path)
    except OSError as exc:
        raise cannot_write(path.parent, exc) from None


def reset(state: dict, kata) -> Path | None:
    """Back up the working copy (returns the backup, None when there was none) and restore the pristine kata. The
    kata's record is kept, solved or not, with its time and hints: a reset starts the file over, not your history.
    Whatever is at the copy's path is kept: a file is copied to backups/, anything else (a folder) moved there."""
    path = working_copy(kata)
    backup = None
    try:
        if path.exists() or path.is_symlink():
            backup = path.parent / "backups" / f"grpo-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}.py"
            backup.parent.mkdir(parents=True, exist_ok=True)
            if path.is_file():
                shutil.copy2(path, backup)
            else:
                path.rename(backup)
    except OSError as exc:
        raise cannot_write(path.parent, exc) from None
    record = active(state, kata)  # the work up to the reset counts; the restored file is no save of yours
    restore(kata, path)
    record.setdefault("started", now())
    record["resets"] = record.get("resets", 0) + 1
    record["active_at"] = max(record["active_at"], datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return backup


# --- what happens to a kata ----------------------------------------------------------------------------

def solve(state: dict, kata) -> dict:
    """Record the kata as solved (once: the first time the checks pass) and return its record."""
    record = record_of(state, kata)
    if not record.get("solved"):
        record["solved"], record["seconds"] = now(), elapsed(record)  # the clock, noted by the check that solved it
        record["hints_before_solving"] = record["hints"]
    return record


def hints_counted(record: dict) -> int:
    """The hints that count against a kata: those taken before it was solved. A hint read afterwards is
    curiosity, not help."""
    return record.get("hints_before_solving", record.get("hints", 0)) if record.get("solved") else \
        record.get("hints", 0)


def next_hint(state: dict, kata) -> int:
    """Climb one rung of the hint ladder (staying on the last) and return the rung to show, 1-based."""
    record = record_of(state, kata)
    level = min(record["hints"] + 1, len(kata.hints))
    record["hints"] = max(record["hints"], level)
    return level


def reveal(state: dict, kata, force: bool) -> None:
    """Allow the solution once the kata is solved; with force before that too, which is recorded."""
    record = record_of(state, kata)
    if record.get("solved"):
        return
    if not force:
        raise UserError(f"kata {kata.key} is not solved yet; `make check N={kata.key}` must pass first "
                        f"(or `make solution N={kata.key} FORCE=1` to reveal it anyway, which is recorded)")
    record["revealed_unsolved"] = now()


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
        label, seconds = "in progress", elapsed(record, kata) if "started" in record else None
    else:
        label, seconds = "not started", None
    return Status(label, seconds, hints_counted(record), before, "revealed_unsolved" in record)


def revealed(state: dict, kata) -> bool:
    """Whether the kata's answers may be shown (a drill's recipe and codebase): solved, or revealed unsolved."""
    record = state["katas"].get(kata.key, {})
    return bool(record.get("solved") or record.get("revealed_unsolved")
                or any(old.get("solved") for old in record.get("history", [])))


def next_unsolved(state: dict, katas: list, after=None):
    """The first kata of `katas` (in list order) that is not solved; with `after`, the first after that one,
    wrapping round to the start. None when every one is solved."""
    start = next((i + 1 for i, k in enumerate(katas) if after is not None and k.key == after.key), 0)
    for k in katas[start:] + katas[:start]:
        if not state["katas"].get(k.key, {}).get("solved") and (after is None or k.key != after.key):
            return k
    return None
