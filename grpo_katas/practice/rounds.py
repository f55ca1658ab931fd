"""Mock interview rounds: choosing a kata, the open round in work/state.json, the rubric, the scorecard, and the
bundle a candidate gets for a live round.

    "round": {"kata": 7, "started": ISO, "minutes": 45, "hints_at_start": 0, "clock": [[ISO, ISO], [ISO, null]]}

The clock runs in spans: `make mock` starts one, Ctrl-C ends it, `make mock` again starts the next; the time used
is the sum of the spans (an open span counts up to now).

A scorecard is written to work/rounds/<date>-<time>-kata-NN.md and .json and never overwrites another.
Each function changes the state it is given (progress.update() saves it); the countdown itself is drawn by the CLI.
"""
import json
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

from grpo_katas import ROOT, UserError
from grpo_katas.catalogue.katas import fixed_bugs, load_bugs, load_katas
from grpo_katas.practice import progress
from grpo_katas.practice.progress import WORK, cannot_write, hints_counted, now, record_of


RUBRIC = [
    ("hypothesis", "states what the symptom implies before touching code"),
    ("reproduction", "makes the symptom show on demand (a run, a print, a tiny test)"),
    ("root cause", "names the property that is violated, not just the line"),
    ("fix", "the smallest change that restores the property, and nothing else broken"),
    ("explanation", "says why it matters for training, with the paper or the common implementations as backup"),
]


def pick(state: dict, tier: str | None):
    """A kata of the tier (any tier when None) that is not solved yet; which one depends on the time of day."""
    katas = [k for k in load_katas() if (not tier or k.tier == tier)
             and not state["katas"].get(str(k.number), {}).get("solved")]
    if not katas:
        raise UserError(f"every {tier + ' ' if tier else ''}kata is solved; name one with N=")
    return katas[int(time.time()) % len(katas)]


def begin(state: dict, kata, tier: str | None, minutes: float | None) -> tuple:
    """(the round, (kata, its copy was there) when a new round opened on it, else None): the open round resumed
    (kata, when given, must be its kata), or a new one on `kata`, or on one picked from the tier; its clock started."""
    active, opening = state.get("round"), None
    if active and kata is not None and kata.key != str(active["kata"]):
        raise UserError(f"a round on kata {active['kata']} is in progress; end it with `make mock-end` first")
    if active and (tier or minutes):  # settings for a new round, where the open one would only be resumed
        given = " and ".join(w for w, v in (("TIER=", tier), ("MINUTES=", minutes)) if v)
        raise UserError(f"a round on kata {active['kata']} is in progress, so {given} would change nothing: "
                        f"`make mock` resumes it, `make mock-end` ends it")
    if not active:
        kata = kata or pick(state, tier)
        opening = kata, progress.start(state, kata)
        open_round(state, kata, minutes or kata.minutes)
    return start_clock(state), opening


def open_round(state: dict, kata, minutes: float) -> dict:
    state["round"] = {"kata": kata.key, "started": now(), "minutes": minutes,
                      "hints_at_start": record_of(state, kata)["hints"], "clock": []}
    return state["round"]


def start_clock(state: dict) -> dict:
    """Start a span of the open round's clock and return the round. A span left open (its countdown was killed
    rather than stopped with Ctrl-C) is closed now: the clock ran all that time."""
    clock = state["round"].setdefault("clock", [])
    at = now()
    if clock and clock[-1][1] is None:
        clock[-1][1] = at
    clock.append([at, None])
    return state["round"]


def stop_clock(state: dict) -> None:
    """End the open span of the round's clock (Ctrl-C in the countdown)."""
    clock = state.get("round", {}).get("clock")
    if clock and clock[-1][1] is None:
        clock[-1][1] = now()


def seconds_used(active: dict, at: str) -> float:
    """Seconds on the round's clock at the time `at` (ISO): the sum of its spans, an open one counted up to `at`.
    A round saved before the clock had spans counts from its start."""
    spans = active.get("clock", [[active["started"], None]])
    return sum((datetime.fromisoformat(stop or at) - datetime.fromisoformat(start)).total_seconds()
               for start, stop in spans)


def close_round(state: dict, ending: dict, kata, results: dict | None, error: str | None, ended: str) -> tuple:
    """Write the scorecard of the open round, `ending` as it was when the command began (results from the checks,
    or the error that stopped them) and close the round. Returns the card and the Markdown file's path."""
    active = state.get("round")
    if not active or active["started"] != ending["started"]:
        raise UserError("the round was ended meanwhile (another `make mock-end`?); nothing written")
    if results is not None:
        checks = {"passed": sum(r.passed for r in results.values()), "total": len(results), "error": None}
        fixed = fixed_bugs(kata, load_bugs(), results)
    else:
        checks, fixed = {"passed": 0, "total": 0, "error": error}, 0
    hints = max(0, hints_counted(record_of(state, kata)) - active.get("hints_at_start", 0))
    card = {"kata": kata.key, "title": kata.title, "tier": kata.tier, "started": active["started"],
            "ended": ended, "seconds_used": round(seconds_used(active, ended)),
            "minutes_used": round(seconds_used(active, ended) / 60, 1), "clock": active.get("clock"),
            "time_box_minutes": active["minutes"], "bugs_fixed": fixed, "bugs_planted": len(kata.bugs),
            "checks": checks, "hints_used": hints, "rubric": {name: None for name, _ in RUBRIC}}
    folder = WORK / "rounds"
    stem = f"{datetime.now().strftime('%Y-%m-%d-%H%M%S')}-kata-{kata.name.split('-')[0]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        md = unique_path(folder, stem, ".md")
        md.with_suffix(".json").write_text(json.dumps(card, indent=1))
        md.write_text(scorecard_markdown(card))
    except OSError as exc:
        raise cannot_write(folder, exc) from None
    del state["round"]
    return card, md


def unique_path(folder: Path, stem: str, suffix: str) -> Path:
    path, i = folder / f"{stem}{suffix}", 2
    while path.exists():
        path, i = folder / f"{stem}-{i}{suffix}", i + 1
    return path


def scorecard_markdown(card: dict) -> str:
    c = card["checks"]
    checks = f"{c['passed']} of {c['total']}" if not c["error"] else f"could not run ({c['error']})"
    lines = [f"# Mock round: kata {card['kata']}, {card['title']} ({card['tier']})", "",
             f"- date: {card['started'][:10]}",
             f"- bugs fixed: {card['bugs_fixed']} of {card['bugs_planted']}",
             f"- checks passed: {checks}",
             f"- time used: {card['minutes_used']} min of a {card['time_box_minutes']} min box",
             f"- hints used: {card['hints_used']}", "",
             "| rubric | what good looks like | score (1-4) | notes |", "|---|---|---|---|"]
    lines += [f"| {name} | {good} |  |  |" for name, good in RUBRIC]
    return "\n".join(lines) + "\n"


def write_bundle(kata, out: str | None) -> Path:
    """What a candidate gets for a live round, in the new (or empty) folder `out`: the loop, its brief without
    the practice commands, run.py (the run the brief describes, as `make run` makes it), lab/ and a README; never
    the checks, the reference or the catalogue."""
    if not out:
        raise UserError("OUT is required: a new (or empty) folder for the bundle, e.g. `make bundle N=7 OUT=round7`")
    out = Path(out)
    runner = (ROOT / "grpo_katas" / "training" / "bundle_run.py").read_text()
    the_run = {k: kata.run[k] for k in ("steps", "seed", "nproc", "set")}
    runner = re.sub(r"^RUN = \{.*?\}(?=  #)", lambda m: f"RUN = {the_run!r}", runner, count=1, flags=re.MULTILINE)
    try:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UserError(f"{out} exists and is not an empty folder; choose a new one (nothing was overwritten)")
        (out / "lab").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kata.loop, out / "grpo.py")
        (out / "run.py").write_text(runner)
        brief = kata.brief.strip().split("\n\n")[:-1]
        (out / "BRIEF.md").write_text("\n\n".join(brief) + "\n\nRun it: `python run.py` (needs torch; a few seconds on "
                                      "a CPU) makes the run this brief describes and prints every stat the loop logs, "
                                      "step by step; `python grpo.py` runs the file's own defaults instead.\n")
        for f in (ROOT / "lab").glob("*.py"):
            shutil.copyfile(f, out / "lab" / f.name)
        (out / "README.md").write_text(f"# {kata.title}\n\nRead BRIEF.md, then: `pip install torch && python run.py`\n")
    except OSError as exc:
        raise UserError(f"cannot write the bundle to {out}: {exc.strerror or exc} ({exc.filename}); "
                        f"choose a folder you can write to") from None
    return out
