"""The practice CLI: debug a broken GRPO loop, check your fix, track your progress, run mock interview rounds.

`python -m grpo_katas.cli COMMAND [N]`, wrapped by `make kata N=3` and friends; COMMANDS below lists each
command with what it does and why one would use it (`--help` shows the same). This module parses and draws;
progress.py keeps your progress, rounds.py the mock rounds, jobs.py runs the checks and loops in child processes.
Your work lives in work/ (git-ignored) and is never overwritten without a timestamped backup.
"""
import argparse
import difflib
import logging
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.markdown import Markdown
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from grpo_katas import ROOT, UserError, drills, progress, rounds
from grpo_katas.catalogue import (CODEBASES, COMPONENTS, CatalogueError, find_kata, fixed_bug_ids, load_bugs,
                                  load_katas)
from grpo_katas.curves import CURVES, NOT_FINITE, PLOT_HINT, plot_png, series, shared_range, sparkline, summarize
from grpo_katas.jobs import LoopRun, reference_run, run_checks, step_stats
from grpo_katas.progress import load_state, now, require_copy, working_copy

console = Console(highlight=False)


class ConsoleNotes(logging.Handler):
    """The library's notices (a progress file set aside) as yellow lines on the console."""

    def emit(self, record):
        console.print(f"[yellow]{escape(record.getMessage())}[/]")


# --- helpers -------------------------------------------------------------------------------------------

def kata_or_fail(number):
    if number in (None, ""):
        valid = ", ".join(str(k.number) for k in load_katas())
        raise UserError(f"which kata? give its number, e.g. `make kata N=1`; valid: {valid}")
    try:
        kata = drills.load(number) if drills.is_drill(number) else find_kata(number)
    except CatalogueError as exc:
        raise UserError(str(exc)) from None
    if not kata.loop.exists():
        raise UserError(f"{kata.loop} is missing; restore it with `git checkout -- {kata.loop.relative_to(ROOT)}` "
                        f"or rebuild the katas with `make katas`")
    return kata


def fmt(v, digits=3) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else str(v)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


# --- commands ------------------------------------------------------------------------------------------

def scenario(kata) -> str:
    """The brief without its title line and its closing how-to line."""
    return "\n\n".join(kata.brief.strip().split("\n\n")[1:-1])


def cmd_kata(args) -> int:
    kata = kata_or_fail(args.n)
    path = working_copy(kata)
    if progress.start(kata):
        note = f"Resuming your working copy (left as it is): {path.relative_to(ROOT)}"
    else:
        note = f"Your working copy: {path.relative_to(ROOT)}"
    body = (f"[bold]{escape(kata.title)}[/]   tier: {kata.tier}   time box: {kata.minutes} min   "
            f"bugs: {len(kata.bugs)}\n\n{escape(scenario(kata))}\n\n"
            f"{note}\n"
            f"See the symptom:  make run N={kata.key}\n"
            f"Check your fix:   make check N={kata.key}   (or make watch N={kata.key})\n"
            f"Stuck?            make hint N={kata.key}")
    console.print(Panel(body, title=f"kata {kata.key}: {kata.name}", expand=False))
    return 0


# The run table's columns: (stats key, header, digits). A column shows once the loop reports its key; keys not
# listed here come after these, in the order they first appear.
RUN_COLUMNS = [("step", "step", 0), ("rank", "rank", 0), ("reward_mean", "reward", 3), ("reward_max", "max", 2), ("kl", "kl", 4),
               ("loss", "loss", 4), ("clip_frac", "clip", 2), ("grad_norm", "gnorm", 2), ("adv_std", "adv std", 2),
               ("completion_len", "len", 1), ("ratio_dev", "|r-1|", 3), ("seconds", "s/step", 2)]
MAX_ROWS = 40  # a longer run shows every k-th step (and the latest), so the table fits a screen


def cmd_run(args) -> int:
    kata = kata_or_fail(args.n)
    path = require_copy(kata)
    # the run the brief describes, unless the command line says otherwise
    args.steps = kata.run["steps"] if args.steps is None else args.steps
    args.seed = kata.run["seed"] if args.seed is None else args.seed
    args.set = kata.settings if args.set is None else args.set
    nproc = kata.run["nproc"] if args.nproc is None else args.nproc
    runner_args = ["--steps", str(args.steps), "--seed", str(args.seed), "--nproc", str(nproc), "--set", *args.set]
    if args.hf_model:  # a local folder by its full path: the runner starts in the repository root
        model = Path(args.hf_model).expanduser()
        runner_args = ["--hf-model", str(model.resolve()) if model.exists() else args.hf_model, *runner_args]
    if args.task:
        runner_args = ["--task", args.task, *runner_args]
    run = LoopRun(path, runner_args)
    history, last = live_run(run, f"kata {kata.key}: {path.relative_to(ROOT)}", max(1, args.steps))
    if last and last["event"] == "error" and last.get("setting"):  # the runner's RunConfig refused a setting
        raise UserError(f"--{last['setting'].replace('_', '-')} {last['problem']}")
    if last and last["event"] == "error":
        console.print(f"[red]cannot run: {escape(last['message'])}[/]")
        return 1
    if history:  # a crash after some steps still shows how the run went until then
        compare_with_reference(kata, history, runner_args, args)
    if last and last["event"] == "crash":
        console.print(Panel(escape(f"{last['type']}: {last['message']}\n  at {last['where']}\n  {last['code']}"),
                            title="your loop raised", border_style="red", expand=False))
        return 1
    if not last or last["event"] != "done":
        console.print(f"[red]the run ended without finishing (exit status {run.returncode})"
                      + (f": {escape(run.last_error_line)}" if run.last_error_line else "") + "[/]")
        return 1
    return 0


def live_run(run: LoopRun, title: str, steps: int) -> tuple:
    """Draw the run's steps as they come (nothing until the first one); returns (the steps' stats, the last
    event)."""
    history, last, every = [], None, -(-steps // MAX_ROWS)
    live = Live(console=console, refresh_per_second=8)
    try:
        for ev in run:
            last = ev
            if ev["event"] == "step":
                history.append(step_stats(ev))
                shown = [h for h in history if h["step"] % every == 0 or h["step"] == 1]
                live.update(run_table(shown + ([history[-1]] if shown[-1] is not history[-1] else []), title))
                live.start()  # does nothing once started
    finally:
        live.stop()
    if history:
        console.print()
    return history, last


def compare_with_reference(kata, history: list, runner_args: list, args) -> None:
    """Your curves beside a healthy run of the same code with the same arguments (the kata with its bugs fixed),
    as sparklines and, with matplotlib, a PNG."""
    with console.status("a healthy run with the same seed and settings, for comparison (kept in work/cache/)"):
        reference, cached, problem = reference_run(runner_args, CODEBASES[kata.codebase].path)
    show_curves(kata, history, reference, args.steps, problem)
    if not problem:
        yours, ref = summarize(history), summarize(reference)
        console.print(f"reward {yours.first:.3f} -> {yours.last:.3f} (mean of the first and last 5 steps); "
                      f"healthy: {ref.first:.3f} -> {ref.last:.3f}" + (" (cached)" if cached else ""))
    png = working_copy(kata).parent / "run.png"
    label = f"kata {kata.key}, seed {args.seed}" + (f", {' '.join(args.set)}" if args.set else "")
    if plot_png({"yours": history, "healthy": reference}, png, label):
        console.print(f"curves: {png.relative_to(ROOT)}")
    else:
        console.print(f"[dim]{escape(PLOT_HINT)}[/]")


def by_rank(row: dict) -> list:
    """A data-parallel step (rank 0's stats as key, rank r's as key@r) as one row per rank, so the table keeps
    one column per metric however many ranks there are."""
    ranks = sorted({int(k.rsplit("@", 1)[1]) for k in row if re.fullmatch(r".+@\d+", k)})
    if not ranks:
        return [row]
    rows = [{"step": row.get("step"), "rank": 0, **{k: v for k, v in row.items() if "@" not in k and k != "step"}}]
    for r in ranks:
        rows.append({"step": "", "rank": r, **{k[: -len(f"@{r}")]: v for k, v in row.items() if k.endswith(f"@{r}")}})
    return rows


def run_table(rows: list, title: str) -> Table:
    """The steps so far, with a column for every metric the loop reports (a row per rank with several)."""
    rows = [r for row in rows for r in by_rank(row)]
    known = {key for key, _, _ in RUN_COLUMNS}
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in known))
    columns = [c for c in RUN_COLUMNS if any(c[0] in r for r in rows)] + [(k, k, 3) for k in extra]
    # Spaces between columns, no rules: every metric fits an 80-column terminal without being cut.
    table = Table(*(header for _, header, _ in columns), title=title, box=box.SIMPLE_HEAD, padding=(0, 1),
                  show_edge=False, collapse_padding=True)
    for r in rows:
        table.add_row(*(fmt(r.get(key, ""), digits) for key, _, digits in columns))
    return table


def show_curves(kata, history: list, reference: list, steps: int, problem: str | None) -> None:
    """Sparklines of your run and the reference's, one row per curve, on a shared scale per curve."""
    table = Table("", f"kata {kata.key} (yours)", "healthy (the same code, no bugs)", box=None, padding=(0, 2),
                  title=f"curves, first -> last 5-step mean ({NOT_FINITE}: not finite)", title_justify="left")
    for key, label, digits in CURVES:
        mine, ref = series(history, key, steps), series(reference, key, steps)
        lo, hi = shared_range(mine, ref)
        cells = []
        for values, run, style in ((mine, history, "cyan"), (ref, reference, "green")):
            if all(v is None for v in values):
                cells.append(Text("not reported", style="dim"))
                continue
            s = summarize(run, key)
            cells.append(Text(sparkline(values, lo, hi), style=style)
                         + Text(f"  {s.first:.{digits}f} -> {s.last:.{digits}f}"))
        table.add_row(label, *cells)
    console.print(table)
    if problem:
        console.print(f"[yellow]{escape(problem)}[/]")


def check_table(results: dict, title: str) -> Table:
    table = Table(title=title)
    for col in ("component", "checks", "result", "first failure"):
        table.add_column(col, overflow="fold")
    for comp in COMPONENTS:
        mine = {c: r for c, r in results.items() if c.component == comp}
        failed = [r for r in mine.values() if not r.passed]
        verdict = "[green]pass[/]" if not failed else f"[red]fail ({len(failed)})[/]"
        table.add_row(comp, f"{len(mine) - len(failed)}/{len(mine)}", verdict, escape(failed[0].message) if failed else "")
    return table


def cmd_check(args) -> int:
    kata = kata_or_fail(args.n)
    path = require_copy(kata)
    results = run_checks(path)
    bugs = load_bugs()
    console.print(check_table(results, f"kata {kata.key}: {path.relative_to(ROOT)}"))
    fixed = fixed_bug_ids(kata, bugs, results)
    n_failed = sum(not r.passed for r in results.values())
    console.print(f"{len(fixed)} of {len(kata.bugs)} bugs fixed; {len(results) - n_failed} of {len(results)} checks pass")
    if kata.drill:
        drills.note_fixed(kata, fixed)
    if n_failed:
        return 1
    p = progress.solve(kata)
    if kata.drill:
        drills.record_attempt(kata, list(kata.bugs), p["seconds"], progress.hints_counted(p), revealed=False)
    console.print(f"[bold green]Solved[/] in {minutes(p['seconds'])} (time box {kata.minutes} min), "
                  f"{progress.hints_counted(p)} hint(s). See the explanation: make solution N={kata.key}")
    return 0


def cmd_watch(args) -> int:
    kata = kata_or_fail(args.n)
    path = require_copy(kata)
    console.print(f"watching {path.relative_to(ROOT)}; save it to rerun the checks, Ctrl-C to stop")
    seen = None
    try:
        while True:
            stamp = path.stat().st_mtime_ns if path.exists() else None
            if stamp != seen:
                seen = stamp
                console.rule(datetime.now().strftime("%H:%M:%S"))
                try:
                    cmd_check(args)
                except UserError as exc:
                    console.print(f"[red]{escape(str(exc))}[/]")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def cmd_hint(args) -> int:
    kata = kata_or_fail(args.n)
    level = progress.next_hint(kata)
    tail = "" if level < len(kata.hints) else " (the last one)"
    console.print(Panel(escape(kata.hints[level - 1]), title=f"hint {level} of {len(kata.hints)}{tail}", expand=False))
    return 0


def cmd_solution(args) -> int:
    kata = kata_or_fail(args.n)
    progress.reveal(kata, args.force)
    if kata.drill:  # a drill revealed before it is solved counts its unfixed bugs as missed
        record = progress.record_of(load_state(), kata)
        if not record.get("solved"):
            drills.record_attempt(kata, drills.last_fixed(kata), progress.elapsed(record),
                                  progress.hints_counted(record), revealed=True)
        console.print(f"[bold]drill {kata.key}[/]: the {kata.codebase} codebase with "
                      f"{', '.join(kata.bugs)} (seed {drills.recipe(kata)['seed']})")
    bugs = load_bugs()
    healthy = CODEBASES[kata.codebase].path
    diff = difflib.unified_diff(kata.loop.read_text().splitlines(), healthy.read_text().splitlines(),
                                f"{kata.name}/grpo.py", str(healthy.relative_to(ROOT)), lineterm="", n=2)
    console.print(Syntax("\n".join(diff), "diff", theme="ansi_dark", word_wrap=True))
    for b in kata.bugs:
        bug = bugs[b]
        thread = f"\n[dim]seen in: {escape(bug.thread)}[/]" if bug.thread else ""
        console.print(Panel(f"{escape(bug.what)}\n\n[italic]symptom:[/] {escape(bug.symptom)}{thread}",
                            title=f"{bug.id} ({bug.component})", expand=False))
    return 0


def cmd_drill(args) -> int:
    with console.status("drawing a drill and proving it (the checks on it, a short run against a healthy one)") \
            as status:
        kata, seconds, tries = drills.make(args.tier, args.bugs, args.codebase, args.seed,
                                           on_try=lambda note: status.update(note))
    console.print(f"[dim]drawn and proven in {seconds:.0f} s ({tries} draw(s))[/]")
    args.n = kata.key
    return cmd_kata(args)


def cmd_stats(args) -> int:
    rows = drills.stats(load_state())
    if not rows:
        console.print("no drill finished yet: `make drill` draws one (stats come from solved or revealed drills)")
        return 0
    table = Table("bug class", "component", "attempts", "solved", "median time", "box", "next due")
    bugs = load_bugs()
    for b, attempts, rate, median, due, box in rows:
        table.add_row(b, bugs[b].component if b in bugs else "?", str(attempts), f"{rate:.0%}",
                      minutes(median) if median is not None else "", str(box), due[:10])
    console.print(table)
    return 0


def cmd_reset(args) -> int:
    kata = kata_or_fail(args.n)
    path = working_copy(kata)
    if path.exists():
        if not args.yes:
            if not sys.stdin.isatty():
                raise UserError("reset asks for confirmation; pass --yes (make reset N=.. YES=1) to do it unattended")
            if input(f"Back up and restore the pristine kata {kata.key}? [y/N] ").strip().lower() != "y":
                console.print("nothing changed")
                return 1
    backup = progress.reset(kata)
    if backup:
        console.print(f"your copy is saved as {backup.relative_to(ROOT)}")
    console.print(f"restored the pristine kata at {path.relative_to(ROOT)}")
    return 0


def cmd_list(args) -> int:
    state = load_state()
    katas = load_katas()
    table = Table("N", "kata", "tier", "time box", "status", "time", "hints")
    solved = 0
    colour = {"solved": "green", "in progress": "yellow", "not started": "default"}
    for k in katas:
        s = progress.status(state, k)
        solved += s.label == "solved" or s.solved_before_reset
        label = f"[{colour[s.label]}]{s.label}[/]"
        if s.solved_before_reset and s.label != "solved":
            label += " (solved before a reset)"
        if s.revealed_early:
            label += " [red](solution revealed first)[/]" if s.label == "solved" else " [red](solution revealed)[/]"
        table.add_row(str(k.number), escape(k.title), k.tier, f"{k.minutes} min", label,
                      minutes(s.seconds) if s.seconds is not None else "", str(s.hints or ""))
    console.print(table)
    bar = Progress(TextColumn("progress"), BarColumn(), TextColumn("{task.completed}/{task.total} solved"),
                   console=console)
    bar.add_task("", total=len(katas), completed=solved)
    bar.start()
    bar.stop()
    return 0


def cmd_mock(args) -> int:
    state = load_state()
    active = state.get("round")
    if active and args.n not in (None, "", str(active["kata"])):
        raise UserError(f"a round on kata {active['kata']} is in progress; end it with `make mock-end` first")
    if not active:
        kata = kata_or_fail(args.n) if args.n not in (None, "") else rounds.pick(state, args.tier)
        args.n = str(kata.key)
        cmd_kata(args)
        rounds.open_round(kata, args.minutes if args.minutes else kata.minutes)
    else:
        console.print(f"resuming the round on kata {active['kata']}")
    countdown(rounds.start_clock())
    return 0


def countdown(active) -> None:
    """A live clock with a nudge at half time and at the end, and no cut-off: Ctrl-C leaves the round running."""
    total = float(active["minutes"]) * 60
    said = set()
    console.print("the clock runs until Ctrl-C; the round stays open until `make mock-end`")
    try:
        with Live(console=console, refresh_per_second=2, transient=True) as live:
            while True:
                spent = rounds.seconds_used(active, now())
                left = total - spent
                if spent >= total / 2 and "half" not in said:
                    said.add("half")
                    live.console.print(f"[yellow]half time: {minutes(total / 2)} used, {minutes(left)} left[/]")
                if left <= 0 and "end" not in said:
                    said.add("end")
                    live.console.print("[bold red]time is up[/]: the interviewer decides whether to go on")
                clock = f"{minutes(left)} left" if left > 0 else f"[red]{minutes(-left)} over[/]"
                live.update(Panel(clock, title=f"kata {active['kata']}", expand=False))
                time.sleep(0.25)
    except KeyboardInterrupt:
        rounds.stop_clock()
        console.print("clock stopped; `make mock` restarts it, `make mock-end` ends the round")


def cmd_mock_notes(args) -> int:
    kata = kata_or_fail(args.n)
    bugs = load_bugs()
    console.print(Panel(f"[bold]{escape(kata.title)}[/]  {kata.tier}, {kata.minutes} min, {len(kata.bugs)} bug(s)",
                        title=f"interviewer's sheet: kata {kata.key}", expand=False))
    table = Table("bug", "component", "what is wrong", "symptom")
    for b in kata.bugs:
        table.add_row(b, bugs[b].component, escape(bugs[b].what), escape(bugs[b].symptom))
    console.print(table)
    for i, h in enumerate(kata.hints, 1):
        console.print(f"hint {i}: {escape(h)}")
    rubric = Table("rubric", "what good looks like", "score 1-4")
    for name, good in rounds.RUBRIC:
        rubric.add_row(name, good, "")
    console.print(rubric)
    return 0


def cmd_mock_end(args) -> int:
    active = load_state().get("round")
    if not active:
        raise UserError("no mock round is in progress; start one with `make mock`")
    kata = kata_or_fail(active["kata"])
    ended = now()  # the clock stops when the round is ended, not once the checks are done
    try:
        results, error = run_checks(require_copy(kata)), None
    except UserError as exc:
        results, error = None, str(exc)
    card, md = rounds.close_round(kata, results, error, ended)
    console.print(Markdown(rounds.scorecard_markdown(card)))
    console.print(f"written: {md.relative_to(ROOT)} and {md.with_suffix('.json').relative_to(ROOT)}")
    return 0


def cmd_bundle(args) -> int:
    kata = kata_or_fail(args.n)
    out = rounds.write_bundle(kata, Path(args.out))
    console.print(f"bundle for kata {kata.key} written to {out}: grpo.py, BRIEF.md, README.md, lab/")
    return 0


# name: (function, what it does, why one would use it). The first part is the line in `--help`'s list; both
# make up the command's own `--help`.
COMMANDS = {
    "kata": (cmd_kata, "show a kata's brief and start (or resume) your working copy in work/NN-slug/grpo.py",
             "The first command for any kata. It copies the broken loop to the file you edit; run again, it "
             "shows the brief and leaves your copy as it is."),
    "run": (cmd_run, "train your copy briefly: a live table of every metric, then its curves beside the reference's",
            "To see the symptom before reading code, and to see it go after a fix: the reference runs with the "
            "same seed and settings, so a difference in the curves is your loop's."),
    "check": (cmd_check, "run the hidden checks on your copy: a table by component and how many bugs are fixed",
              "The verdict: the checks judge what your functions do, never how they are written; all passing "
              "is solved."),
    "watch": (cmd_watch, "rerun the checks each time your copy is saved (Ctrl-C to stop)",
              "For an edit, save, look loop while you work on a fix."),
    "hint": (cmd_hint, "the next rung of the kata's hint ladder, remembered",
             "When stuck: each rung says a little more than the last. Hints taken before solving are counted."),
    "solution": (cmd_solution, "the diff from the kata to the reference and why each planted bug matters",
                 "After solving, to compare your fix with the reference and read what each bug does to training. "
                 "Before solving only with --force, which is recorded and shown by list."),
    "reset": (cmd_reset, "back up your copy to work/NN-slug/backups/ and restore the pristine kata",
              "To start a kata over; the old attempt is kept in your progress (list still counts it solved)."),
    "list": (cmd_list, "every kata with its tier, time box and your status",
             "To choose what to practise next and see how far you are."),
    "mock": (cmd_mock, "a timed mock interview round: a kata you have not solved (or N), its brief and a countdown",
             "Practice under a clock. Ctrl-C stops the clock, not the round; mock again restarts the clock; "
             "mock-end scores the round."),
    "mock-notes": (cmd_mock_notes, "the interviewer's sheet: the planted bugs, the hint ladder and the rubric",
                   "For whoever runs a round: what to look for and how to score it. It gives the answers away."),
    "mock-end": (cmd_mock_end, "end the round: run the checks and write a scorecard to work/rounds/",
                 "Closes the round with the time on its clock, bugs fixed, hints taken, and a rubric to fill in."),
    "drill": (cmd_drill, "draw a fresh kata from the catalogue and the codebases, prove it, and start it as dNN",
              "When the numbered katas are known by heart: a new codebase-and-bugs combination each time, "
              "scheduled towards the bug classes you missed, needed hints for or solved slowly."),
    "stats": (cmd_stats, "your drill record per bug class: attempts, solve rate, median time, when it is due",
              "To see what you keep missing; the next drill leans towards what is due."),
    "bundle": (cmd_bundle, "write what a candidate gets for a live round: the loop, its brief and lab/, nothing else",
               "To hand a kata to someone without the checks, the reference or the catalogue."),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grpo_katas.cli", description=__doc__.split("\n\n")[0],
                                epilog="`python -m grpo_katas.cli COMMAND --help` says more about one command.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, what, why) in COMMANDS.items():
        s = sub.add_parser(name, help=what, description=f"{what}. {why}")
        if name not in ("list", "mock-end", "drill", "stats"):
            s.add_argument("n", nargs="?", default=None, metavar="N",
                           help="the kata number (make ... N=3), or a drill's (d3); `make list` shows them all")
    run = sub.choices["run"]
    run.add_argument("--steps", type=int, default=None,
                     help="training steps (default: the kata's run, 40 unless its brief says; a few seconds on a CPU); "
                          "more to see a slow drift such as a creeping KL")
    run.add_argument("--seed", type=int, default=None,
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
    sub.choices["watch"].add_argument("--interval", type=float, default=0.5,
                                      help="seconds between looks at the file (default 0.5)")
    sub.choices["solution"].add_argument("--force", action="store_true",
                                         help="reveal before solving; recorded, and shown by list")
    sub.choices["reset"].add_argument("--yes", action="store_true",
                                      help="do not ask for confirmation (for scripts; make reset N=.. YES=1)")
    sub.choices["mock"].add_argument("--tier", choices=["warm-up", "practice", "interview"], default=None,
                                     help="choose among this tier's katas: warm-up ones take 10-15 minutes, "
                                          "interview ones are full 45-50 minute rounds")
    sub.choices["mock"].add_argument("--minutes", type=float, default=None,
                                     help="the time box (default: the kata's own); shorter for more pressure")
    sub.choices["bundle"].add_argument("out", metavar="OUT", help="a new (or empty) folder for the bundle")
    drill = sub.choices["drill"]
    drill.add_argument("--tier", choices=["warm-up", "practice", "frontier", "interview"], default=None,
                       help="how hard: warm-up one bug, practice 2-3, frontier 1-2 of the newer bugs, interview 4-5 "
                            "across at least 4 components (default practice)")
    drill.add_argument("--bugs", type=int, default=None, help="how many bugs (default: the tier's usual number)")
    drill.add_argument("--codebase", choices=sorted(CODEBASES), default=None,
                       help="the codebase to plant them in (default: any): to practise reading one style")
    drill.add_argument("--seed", type=int, default=None,
                       help="the same seed always gives the same drill (default: scheduled by your record)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    notes = logging.getLogger("grpo_katas")
    if not any(isinstance(h, ConsoleNotes) for h in notes.handlers):
        notes.addHandler(ConsoleNotes())
    try:
        return COMMANDS[args.command][0](args)
    except UserError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
