"""The practice CLI: debug a broken GRPO loop, check your fix, track your progress, run mock interview rounds.

`python -m grpo_katas.practice.cli COMMAND [N]`, wrapped by `make kata N=3` and friends; COMMANDS below lists each
command with what it does and why one would use it (`--help` shows the same). This module parses and dispatches;
render.py draws, progress.py keeps your progress (each command changes it once, in one `progress.update()`),
rounds.py the mock rounds, drills.py the drills, jobs.py runs the checks, loop_run.py a loop in a child process.
Your work lives in work/ (git-ignored) and is never overwritten without a timestamped backup.
"""
import argparse
import logging
import math
import os
import re
import sys
from datetime import datetime
from pathlib import Path

from rich.markup import escape

from grpo_katas import UserError, yes_or_no
from grpo_katas.catalogue import drawn
from grpo_katas.catalogue.katas import CODEBASES, COMPONENTS, TIERS, fixed_bug_ids, load_bugs, load_katas
from grpo_katas.judge import sandbox
from grpo_katas.judge.loop_run import LoopRun
from grpo_katas.practice import drills, progress, render, rounds
from grpo_katas.practice.drills import find
from grpo_katas.practice.jobs import reference_run, run_args, run_checks
from grpo_katas.practice.progress import now, require_copy, shown, working_copy
from grpo_katas.practice.render import console, minutes


# --- commands ------------------------------------------------------------------------------------------

def cmd_kata(args) -> int:
    kata = find(args.n)
    with progress.update() as state:
        resumed = progress.start(state, kata)
    render.kata_panel(kata, working_copy(kata), resumed)
    return 0


# A step's budget, in CPU-seconds (and in seconds without any CPU): a step of the lab model takes under a second,
# one of a real model on a GPU up to a minute; a step over it is a loop that hangs.
STEP_BUDGET, HF_STEP_BUDGET = 60.0, 600.0


def cmd_run(args) -> int:
    kata = find(args.n, "run")
    path = require_copy(kata)
    # the run the brief describes, unless the command line says otherwise
    steps, seed, nproc = (kata.run[k] if getattr(args, k) is None else getattr(args, k)
                          for k in ("steps", "seed", "nproc"))
    settings = kata.settings if args.set is None else args.set
    runner_args = run_args(steps, seed, nproc, settings, args.hf_model, args.task, args.device)
    budget = args.budget or (HF_STEP_BUDGET if args.hf_model else STEP_BUDGET)
    with progress.update() as state:  # running the kata is time spent on it
        progress.active(state, kata)
    # the lab model on the CPU trains in a run's sandbox, as the judge trains it; a real model or a GPU, as it is
    mode = None if args.hf_model or args.device not in (None, "cpu") else sandbox.resolve("auto")[0]
    run = LoopRun(path, runner_args, log=path.parent / "run.log", budget=budget, sandbox=mode)
    cited = render.cited_metrics(kata)
    history, last = render.live_run(run, f"kata {kata.key}: {shown(path)}", max(1, steps), cited,
                                    shown(path.parent / "run.log"))
    if run.log is None:  # LoopRun could not write it: say so, rather than point at a log that is not there
        console.print(f"[yellow]{shown(path.parent / 'run.log')} could not be written (is the folder read-only?): "
                      f"what the loop printed is only what is shown above[/]")
    if last and last["event"] == "error" and last.get("setting"):  # the runner's RunConfig refused a setting
        from grpo_katas.training.runs import flag_words  # torch comes with it: only here, where a run was made
        raise UserError(flag_words(last["setting"], last["problem"]))
    if last and last["event"] == "error":  # the file does not load, or a setting is not one of its GRPOConfig's
        raise UserError(f"cannot run {shown(path)}: {last['message']}")
    if last and last["event"] == "interrupted":
        render.stopped_report(last, path, "BUDGET=")
        return 130
    if history:  # a crash after some steps still shows how the run went until then
        with console.status("a healthy run with the same seed and settings, for comparison (kept in work/cache/)"):
            healthy = reference_run(runner_args, CODEBASES[kata.codebase].path)
        render.comparison(f"kata {kata.key}", history, healthy, steps, path.parent / "run.png",
                          f"kata {kata.key}, seed {seed}" + (f", {' '.join(settings)}" if settings else ""), cited)
    if last and last["event"] == "hung":
        render.stopped_report(last, path, "BUDGET=")
        return 1
    if last and last["event"] == "crash":
        render.crash_report(last)
        return 1
    if not last or last["event"] != "done":
        console.print(f"[red]the run ended without finishing (exit status {run.returncode})[/]")
        return 1
    return 0


NO_BRIEF = ("a file checked on its own has no kata, so no brief whose run to judge; make check N=.. trains your "
            "copy of a kata as make run does and asks each symptom of its brief to be gone")


def cmd_check(args) -> int:
    """The checks on a kata's copy or on --target, at --seed, all or one --component; a table (with --all every
    failing check below it) or, with --format json, one JSON object on stdout (render.check_json's schema)."""
    as_json = getattr(args, "format", "table") == "json"
    component = getattr(args, "component", None)
    if getattr(args, "target", None) is not None:  # make check TARGET=: any file that implements the contract
        if not args.target:
            raise UserError("TARGET is empty; give the file to check, e.g. `make check TARGET=path/to/grpo.py`")
        path, kata = Path(args.target).resolve(), None
    else:
        kata = find(args.n, "check")
        path = require_copy(kata)
    if as_json:  # stdout holds the JSON alone; anything else said goes to stderr
        console.file = sys.stderr
    title = f"kata {kata.key}: {shown(path)}" if kata else shown(path)
    title += (f", seed {args.seed}" if args.seed or not kata else "") + (f", {component} only" if component else "")
    extras = (f", seed {args.seed}" if args.seed else "") + (f", {component} only" if component else "")
    then = ", then the brief's run (about 15 s)" if kata and not component else " (about 10 s)"
    with render.busy(f"the hidden checks on {shown(path)}{extras}{then}"):
        results = run_checks(path, args.seed, component, kata)
    whole = kata is not None and component is None  # only every check of a kata says which bugs are fixed
    fixed = fixed_bug_ids(kata, load_bugs(), results) if whole else None
    failed = sum(not r.passed for r in results.values())
    record = None
    if kata is not None:
        with progress.update() as state:
            progress.active(state, kata)
            if whole:
                record = drills.after_check(state, kata, fixed, passed=not failed)
    if as_json:
        print(render.check_json(results, path, args.seed, component, kata, fixed, record))
        return 1 if failed else 0
    render.check_report(results, title, kata if whole else None, fixed or (), every=args.all, component=component,
                        run_skipped=NO_BRIEF if kata is None and component is None else "")
    if failed:
        return 1
    if record:
        console.print(f"[bold green]Solved[/] in {minutes(record['seconds'])} (time box {kata.minutes} min), "
                      f"{progress.hints_counted(record)} hint(s). See the explanation: make solution N={kata.key}")
    return 0


def cmd_watch(args) -> int:
    kata = find(args.n, "watch")
    with render.keys() as keys:  # on a terminal Ctrl-C is read as a key: it stops watch, and make exits 0
        try:
            while kata is not None:
                kata = watch_one(kata, args, keys)
        except KeyboardInterrupt:  # how you stop it: not a failure
            stopped_watching(kata, "a check cut short records nothing; ")
    return 0


def stopped_watching(kata, note: str = "") -> None:
    console.print(f"stopped watching kata {kata.key}; {note}`make watch N={kata.key}` takes it up again")


def watch_one(kata, args, keys):
    """Rerun the checks on the kata's copy at every save. Returns the kata to watch next once this one is solved
    (see next_after), or None when stopped with q."""
    path = require_copy(kata)
    console.print(f"watching {shown(path)}; save it to rerun the checks, {keys.how_to_stop}")
    seen = None
    args.n = kata.key
    while True:
        stamp = path.stat().st_mtime_ns if path.exists() else None
        if stamp != seen:
            seen = stamp
            console.rule(datetime.now().strftime("%H:%M:%S"))
            keys.busy, passed = True, False  # q stops the checks at once, as Ctrl-C does
            try:
                passed = cmd_check(args) == 0
            except UserError as exc:
                console.print(f"[red]{escape(str(exc))}[/]")
            finally:
                keys.busy = False
            if passed and not args.component:
                return next_after(kata, keys)
        if keys.wait(args.interval) == "q":
            stopped_watching(kata)
            return None


def next_after(kata, keys):
    """Once a kata is solved under watch: the next unsolved one in list order, started (on a terminal, when you
    press n), or None (none left, or you stopped)."""
    following = progress.next_unsolved(progress.load(), load_katas(), after=kata)  # no lock held while you choose
    if following is None:
        console.print("every kata is solved; `make drill` draws a fresh one")
        return None
    if keys.interactive:
        console.print(f"next: kata {following.key}, {escape(following.title)} ({following.tier}, {following.minutes} "
                      f"min): press n to start it, q or Ctrl-C to stop")
        if keys.choose("nq") != "n":
            return None
    else:
        console.print(f"moving on to kata {following.key} (`make watch N={following.key}` comes back to it)")
    with progress.update() as state:
        resumed = progress.start(state, following)
    render.kata_panel(following, working_copy(following), resumed)
    return following


def cmd_hint(args) -> int:
    kata = find(args.n, "hint")
    with progress.update() as state:
        progress.active(state, kata)
        level = progress.next_hint(state, kata)
    render.hint_panel(kata, level)
    return 0


def cmd_solution(args) -> int:
    kata = find(args.n, "solution")
    with progress.update() as state:
        progress.active(state, kata)
        drills.reveal(state, kata, args.force)
    render.solution(kata, load_bugs(), CODEBASES[kata.codebase].path)
    return 0


def cmd_drill(args) -> int:
    with render.busy("drawing a drill and proving it (the checks on it, a short run against a healthy one)") as note:
        draw = drills.make(progress.load(), args.tier, args.bugs, args.codebase, args.seed, on_try=note)
    with progress.update() as state:
        kata = drills.file(state, draw)
        resumed = progress.start(state, kata)
    console.print(f"[dim]drawn and proven in {draw.seconds:.0f} s ({draw.tries} draw(s))[/]")
    render.kata_panel(kata, working_copy(kata), resumed)
    return 0


def cmd_stats(args) -> int:
    render.stats_table(drills.stats(progress.load()), load_bugs())
    return 0


def cmd_reset(args) -> int:
    kata = find(args.n, "reset")
    path = working_copy(kata)
    if (path.exists() or path.is_symlink()) and not args.yes:
        if not sys.stdin.isatty():
            raise UserError("reset asks for confirmation; pass --yes (make reset N=.. YES=1) to do it unattended")
        if not render.confirm(f"Back up and restore the pristine kata {kata.key}?"):
            console.print("nothing changed")
            return 1
    with progress.update() as state:
        backup = progress.reset(state, kata)
    if backup:
        console.print(f"your copy is saved as {shown(backup)}")
    console.print(f"restored the pristine kata at {shown(path)}")
    return 0


def cmd_list(args) -> int:
    state = progress.load()
    katas = chosen(state, args.tier, args.codebase, drawn.made())
    render.kata_list(katas, [progress.status(state, k) for k in katas], filtered=bool(args.tier or args.codebase),
                     idle_minutes=progress.IDLE_SECONDS // 60)
    return 0


def chosen(state: dict, tier: str | None, codebase: str | None, made=()) -> list:
    """The katas, then the drills in `made`, of the tier and codebase asked for (list order). A drill's codebase is
    hidden until it is solved or revealed, so a filter by codebase leaves such drills out."""
    def shown_codebase(k):
        return k.codebase if not k.drill or progress.revealed(state, k) else None
    return [k for k in [*load_katas(), *made] if (not tier or k.tier == tier)
            and (not codebase or shown_codebase(k) == codebase)]


def cmd_next(args) -> int:
    with progress.update() as state:  # by tier, easiest first (warm-up, practice, frontier, interview), then number
        katas = sorted(chosen(state, args.tier, args.codebase), key=lambda k: TIERS.index(k.tier))
        kata = progress.next_unsolved(state, katas)
        resumed = progress.start(state, kata) if kata else None
    if kata is None:
        which = " ".join(x for x in (args.tier, args.codebase) if x)
        console.print(f"every {which + ' ' if which else ''}kata is solved; `make drill` draws a fresh one")
        return 0
    render.kata_panel(kata, working_copy(kata), resumed)
    return 0


def cmd_mock(args) -> int:
    kata = find(args.n, "mock") if args.n not in (None, "") else None
    with progress.update() as state:
        active, opening = rounds.begin(state, kata, args.tier, args.minutes)
    if opening:
        render.kata_panel(opening[0], working_copy(opening[0]), opening[1])
    else:
        console.print(f"resuming the round on kata {active['kata']}")
    render.countdown(active["kata"], active["minutes"], lambda: rounds.seconds_used(active, now()))
    with progress.update() as state:  # Ctrl-C: the clock stops, the round stays open
        rounds.stop_clock(state)
    console.print("clock stopped; `make mock` restarts it, `make mock-end` ends the round")
    return 0


def cmd_mock_notes(args) -> int:
    render.interviewer_sheet(find(args.n, "mock-notes"), load_bugs(), rounds.RUBRIC)
    return 0


def cmd_mock_end(args) -> int:
    active = progress.load().get("round")
    if not active:
        raise UserError("no mock round is in progress; start one with `make mock`")
    kata = find(active["kata"])
    ended = now()  # the clock stops when the round is ended, not once the checks are done
    try:  # judged as `make check N=..` judges it: every check, then the brief's run
        with render.busy(f"the hidden checks on your copy of kata {kata.key}, then the brief's run (about 15 s)"):
            results, error = run_checks(require_copy(kata), kata=kata), None
    except UserError as exc:
        results, error = None, str(exc)
    with progress.update() as state:
        card, md = rounds.close_round(state, active, kata, results, error, ended)
        solved = results is not None and all(r.passed for r in results.values())
        record = drills.after_check(state, kata, fixed_bug_ids(kata, load_bugs(), results), True) if solved else None
    render.scorecard(rounds.scorecard_markdown(card))
    console.print(f"written: {shown(md)} and {shown(md.with_suffix('.json'))}")
    if record:
        console.print(f"[bold green]Solved[/]: kata {kata.key} is recorded as solved, as `make check` records it")
    return 0


def cmd_bundle(args) -> int:
    kata = find(args.n, "bundle")
    out = rounds.write_bundle(kata, args.out)
    console.print(f"bundle for kata {kata.key} written to {out}: grpo.py, run.py, BRIEF.md, README.md, lab/")
    return 0


# name: (function, what it does, why one would use it). The first part is the line in `--help`'s list; both
# make up the command's own `--help`.
COMMANDS = {
    "kata": (cmd_kata, "show a kata's brief and start (or resume) your working copy in work/NN-slug/grpo.py",
             "The first command for any kata. It copies the broken loop to the file you edit; run again, it "
             "shows the brief and leaves your copy as it is."),
    "run": (cmd_run, "train your copy briefly: its own output and a live table of every metric, then its curves "
                     "beside a healthy run's",
            "To see the symptom before reading code, and to see it go after a fix: what your loop prints shows "
            "above the table (the full output in run.log), and the healthy run uses the same seed and settings, so "
            "a difference in the curves is your loop's."),
    "check": (cmd_check, "run the hidden checks on your copy (or on --target FILE), then train it as make run does "
                         "and judge the brief's symptoms: a table by component and how many bugs are fixed",
              "The verdict: the checks judge what your functions do, never how they are written, and the run "
              "component that every symptom of the brief is gone from your copy's run; all passing is solved. A "
              "--target file has no brief: its run component is skipped, and so is a kata's with --component."),
    "watch": (cmd_watch, "rerun the checks each time your copy is saved, and move on to the next kata once solved",
              "For an edit, save, look loop while you work on a fix. Once the checks pass it offers the next unsolved "
              "kata (n starts it; without a terminal it starts it); Ctrl-C or q stops, status 0."),
    "hint": (cmd_hint, "the next rung of the kata's hint ladder, remembered",
             "When stuck: each rung says a little more than the last. Hints taken before solving are counted."),
    "solution": (cmd_solution, "the diff from the kata to the reference and why each planted bug matters",
                 "After solving, to compare your fix with the reference and read what each bug does to training. "
                 "Before solving only with --force, which is recorded and shown by list."),
    "reset": (cmd_reset, "back up your copy to work/NN-slug/backups/ and restore the pristine kata",
              "To start a kata over; the old attempt is kept in your progress (list still counts it solved)."),
    "list": (cmd_list, "every kata and drill with its tier, codebase, bugs, time box and your status, time and hints",
             "To choose what to practise next and see how far you are; --tier and --codebase narrow it."),
    "next": (cmd_next, "start (or resume) the first kata in list order that you have not solved",
             "To keep going without choosing, as rustlings does; --tier and --codebase narrow the choice."),
    "mock": (cmd_mock, "a timed mock interview round: a kata you have not solved (or N), its brief and a countdown",
             "Practice under a clock. Ctrl-C stops the clock, not the round; mock again restarts the clock; "
             "mock-end scores the round."),
    "mock-notes": (cmd_mock_notes, "the interviewer's sheet: the planted bugs, the hint ladder and the rubric",
                   "For whoever runs a round: what to look for and how to score it. It gives the answers away."),
    "mock-end": (cmd_mock_end, "end the round: run the checks and write a scorecard to work/rounds/",
                 "Closes the round with the time on its clock, bugs fixed, hints taken, and a rubric to fill in."),
    "drill": (cmd_drill, "draw a fresh kata from the catalogue and the codebases, prove it, and start it as dN",
              "When the numbered katas are known by heart: a new codebase-and-bugs combination each time, "
              "scheduled towards the bug classes you missed, needed hints for or solved slowly."),
    "stats": (cmd_stats, "your drill record per bug class: attempts, solve rate, median time, when it is due",
              "To see what you keep missing; the next drill leans towards what is due."),
    "bundle": (cmd_bundle, "write what a candidate gets for a live round: the loop, its brief, run.py and lab/",
               "To hand a kata to someone without the checks, the reference or the catalogue."),
}
def positive(kind):
    def parse(text: str):
        value = kind(text)
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}")
        return value
    parse.__name__ = kind.__name__
    return parse


def seed(text: str) -> int:
    """A seed as torch takes one: a whole number from 0 to 2**63 - 1."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {2**63 - 1}, got {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and exit status 2, as every other mistake gets."""

    def error(self, message):
        flag = re.match(r"argument (--[a-z-]+)(?:/-\w+)?: (.*)", message, re.S)
        if os.environ.get("GRPO_KATAS_MAKE") and flag and flag[1] in MAKE_SETTINGS:  # in the words typed to make
            message, more = f"{MAKE_SETTINGS[flag[1]]}=: {flag[2]}", "`make help`"
        else:
            more = f"`{self.prog} --help`"
        console.print(f"[red]error:[/] {escape(message)}; {more} says more", soft_wrap=True)
        sys.exit(2)


# the make setting behind each flag (the Makefile runs the CLI with GRPO_KATAS_MAKE=1)
MAKE_SETTINGS = {"--seed": "SEED", "--steps": "STEPS", "--nproc": "NPROC", "--hf-model": "MODEL", "--task": "TASK",
                 "--device": "DEVICE", "--budget": "BUDGET", "--tier": "TIER", "--bugs": "BUGS",
                 "--codebase": "CODEBASE", "--minutes": "MINUTES", "--component": "COMPONENT", "--format": "FORMAT",
                 "--target": "TARGET", "--set": "SET"}


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m grpo_katas.practice.cli", description=__doc__.split("\n\n")[0],
               epilog="`python -m grpo_katas.practice.cli COMMAND --help` says more about one command.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, what, why) in COMMANDS.items():
        s = sub.add_parser(name, help=what, description=f"{what}. {why}")
        if name not in ("list", "next", "mock-end", "drill", "stats"):
            s.add_argument("n", nargs="?", default=None, metavar="N",
                           help="the kata number (make ... N=3), or a drill's (d3); `make list` shows them all")
    run = sub.choices["run"]
    run.add_argument("--steps", type=int, default=None,
                     help="training steps (default: the kata's run, 40 unless its brief says; a few seconds on a CPU); "
                          "more to see a slow drift such as a creeping KL")
    run.add_argument("--seed", type=seed, default=None,
                     help="seed of the model, the prompts and the sampling (default: the kata's, 0): another shows how "
                          "much of a curve is luck; the healthy run uses the same one")
    run.add_argument("--set", nargs="*", default=None, metavar="KEY=VALUE",
                     help="GRPOConfig overrides, e.g. beta=0.5 temperature=0.7 (default: the settings the brief's run "
                          "used); some symptoms show only away from the defaults")
    run.add_argument("--nproc", type=int, default=None,
                     help="data-parallel ranks (default: the kata's, 1): 2 runs your loop as two gloo processes, "
                          "where the bugs of data-parallel training show; each rank's stats appear as key@rank")
    run.add_argument("--hf-model", default="", metavar="MODEL",
                     help="run your loop on a Hugging Face causal LM (a hub name or a local folder; needs the hf "
                          "extra) instead of the lab model, on the GPU when there is one: your bug at scale")
    run.add_argument("--task", default=None,
                     help="the task (default sum); with --hf-model also arith or gsm8k, word problems for a "
                          "pretrained model")
    run.add_argument("--device", default=None, choices=["auto", "cpu", "cuda", "mps"],
                     help="where the run trains (default cpu for the lab model, auto with --hf-model: CUDA when there "
                          "is one; mps is a Mac's GPU); a GPU torch does not see is refused")
    run.add_argument("--budget", type=positive(float), default=None, metavar="SECONDS",
                     help=f"a step that uses this many CPU-seconds, or no CPU for this many seconds, is stopped as "
                          f"hung and shows where your loop was (default {STEP_BUDGET:g}; {HF_STEP_BUDGET:g} with "
                          f"--hf-model; a lab-model step takes under a second)")
    check = sub.choices["check"]
    check.add_argument("--target", default=None, metavar="FILE",
                       help="check this file instead of a kata's copy (make check TARGET=f.py): any file that "
                            "implements the contract, such as a fix you wrote elsewhere")
    for name in ("check", "watch"):
        c = sub.choices[name]
        c.add_argument("--seed", type=seed, default=0,
                       help="the base seed of the checks' drawn shapes and values (default 0, as CI's first seed); "
                            "another seed draws other inputs, to see that a fix holds beyond one draw")
        c.add_argument("--all", nargs="?", const=True, default=False, type=yes_or_no, metavar="YES",
                       help="below the table, every failing check with what it observed (the table shows the first "
                            "per component): to see all a fix still has to do (make check ALL=1)")
        c.add_argument("--component", choices=COMPONENTS, default=None, metavar="NAME",
                       help=f"run only this component's checks ({', '.join(COMPONENTS)}; make check "
                            f"COMPONENT=loss): seconds instead of the whole run, while you work on one function; "
                            f"records nothing")
    check.add_argument("--format", choices=["table", "json"], default="table",
                       help=f"table (default) or json: one JSON object on stdout ({render.CHECK_SCHEMA}, "
                            f"docs/practice.md: the checks' JSON) for scripts and CI; the exit status is the same")
    sub.choices["watch"].add_argument("--interval", type=positive(float), default=0.5,
                                      help="seconds between looks at the file (default 0.5)")
    sub.choices["solution"].add_argument("--force", nargs="?", const=True, default=False, type=yes_or_no,
                                         metavar="YES", help="reveal before solving (FORCE=1; FORCE=0 or no means "
                                                             "no); recorded, and shown by list")
    sub.choices["reset"].add_argument("--yes", nargs="?", const=True, default=False, type=yes_or_no, metavar="YES",
                                      help="do not ask for confirmation (for scripts; make reset N=.. YES=1)")
    sub.choices["mock"].add_argument("--tier", choices=["warm-up", "practice", "interview"], default=None,
                                     help="choose among this tier's katas: warm-up ones take 10-15 minutes, "
                                          "interview ones are full 45-50 minute rounds")
    sub.choices["mock"].add_argument("--minutes", type=positive(float), default=None,
                                     help="the time box (default: the kata's own); shorter for more pressure")
    sub.choices["bundle"].add_argument("out", metavar="OUT", nargs="?", default=None,
                                       help="a new (or empty) folder for the bundle")
    for name in ("list", "next"):
        sub.choices[name].add_argument("--tier", choices=TIERS, default=None, help="only the katas of this tier")
        sub.choices[name].add_argument("--codebase", choices=sorted(CODEBASES), default=None,
                                       help="only the katas in this codebase (a drill's shows once it is solved or "
                                            "revealed)")
    drill = sub.choices["drill"]
    drill.add_argument("--tier", choices=["warm-up", "practice", "frontier", "interview"], default=None,
                       help="how hard: warm-up one bug, practice 2-3, frontier 1-2 of the newer bugs, interview 4-5 "
                            "across at least 4 components (default practice)")
    drill.add_argument("--bugs", type=int, default=None, help="how many bugs (default: the tier's usual number)")
    drill.add_argument("--codebase", choices=sorted(CODEBASES), default=None,
                       help="the codebase to plant them in (default: any): to practise reading one style")
    drill.add_argument("--seed", type=seed, default=None,
                       help="the same seed always gives the same drill (default: scheduled by your record)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    render.show_notes(logging.getLogger("grpo_katas"))
    try:
        return COMMANDS[args.command][0](args)
    except UserError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted; nothing was recorded")
        return 130


if __name__ == "__main__":
    sys.exit(main())
