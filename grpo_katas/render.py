"""What the practice CLI draws, kept apart from what it does, as rustlings keeps run.rs, list.rs and term.rs apart
from main.rs: the loop's own output above a live table of its steps, the curves beside a healthy run's, the check
table, the countdown, and the panels and tables of the other commands. The library below it logs plain lines;
rich is used here, at the edge (and in the trainer's and the bench's own edges).
"""
import contextlib
import difflib
import logging
import os
import re
import sys
import time
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from grpo_katas.catalogue import CHECK_COMPONENTS
from grpo_katas.curves import (CURVES, NOT_FINITE, PLOT_HINT, curves_for, plot_png, series, shared_range, sparkline,
                               summarize)
from grpo_katas.progress import shown

console = Console(highlight=False)


class ConsoleNotes(logging.Handler):
    """The library's notices (a progress file set aside) as yellow lines on the console."""

    def emit(self, record):
        console.print(f"[yellow]{escape(record.getMessage())}[/]")


def show_notes(logger: logging.Logger) -> None:
    if not any(isinstance(h, ConsoleNotes) for h in logger.handlers):
        logger.addHandler(ConsoleNotes())


def fmt(v, digits=3) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else str(v)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


@contextlib.contextmanager
def busy(text: str):
    """A spinner and the seconds so far while slow work runs in this process (the checks, a drill's proof);
    yields a function that changes the text. It draws on a duplicate of the terminal's descriptor, because pytest,
    which runs the checks, captures descriptors 1 and 2 while it runs. Nothing when stdout is not a terminal."""
    if not console.is_terminal:
        yield lambda note: None
        return
    with os.fdopen(os.dup(sys.stdout.fileno()), "w") as screen:
        spinner = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                           console=Console(file=screen, highlight=False), transient=True)
        with spinner:
            task = spinner.add_task(escape(text))
            yield lambda note: spinner.update(task, description=escape(note))


# --- make kata, hint, solution ------------------------------------------------------------------------

def scenario(kata) -> str:
    """The brief without its title line and its closing how-to line."""
    return "\n\n".join(kata.brief.strip().split("\n\n")[1:-1])


def kata_panel(kata, copy, resumed: bool) -> None:
    note = f"Resuming your working copy (left as it is): {shown(copy)}" if resumed else \
        f"Your working copy: {shown(copy)}"
    body = (f"[bold]{escape(kata.title)}[/]   tier: {kata.tier}   time box: {kata.minutes} min   "
            f"bugs: {len(kata.bugs)}\n\n{escape(scenario(kata))}\n\n"
            f"{escape(note)}\n"
            f"See the symptom:  make run N={kata.key}\n"
            f"Check your fix:   make check N={kata.key}   (or make watch N={kata.key})\n"
            f"Stuck?            make hint N={kata.key}")
    console.print(Panel(body, title=f"kata {kata.key}: {kata.name}", expand=False))


def confirm(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def hint_panel(kata, level: int) -> None:
    tail = "" if level < len(kata.hints) else " (the last one)"
    console.print(Panel(escape(kata.hints[level - 1]), title=f"hint {level} of {len(kata.hints)}{tail}", expand=False))


def solution(kata, bugs: dict, healthy) -> None:
    """A drill's recipe, the diff from the kata to its healthy codebase, and a panel per planted bug."""
    if kata.drill:
        console.print(f"[bold]drill {kata.key}[/]: the {kata.codebase} codebase with {', '.join(kata.bugs)} "
                      f"(seed {kata.seed})")
    diff = difflib.unified_diff(kata.loop.read_text().splitlines(), healthy.read_text().splitlines(),
                                f"{kata.name}/grpo.py", shown(healthy), lineterm="", n=2)
    console.print(Syntax("\n".join(diff), "diff", theme="ansi_dark", word_wrap=True))
    for b in kata.bugs:
        bug = bugs[b]
        thread = f"\n[dim]seen in: {escape(bug.thread)}[/]" if bug.thread else ""
        console.print(Panel(f"{escape(bug.what)}\n\n[italic]symptom:[/] {escape(bug.symptom)}{thread}",
                            title=f"{bug.id} ({bug.component})", expand=False))


# --- make run: the loop's output and the live table --------------------------------------------------------

# The run table's columns: (stats key, header, digits), in the order they are drawn. A column shows once the loop
# reports its key; keys not listed here come after these, in the order they first appear.
RUN_COLUMNS = [("step", "step", 0), ("rank", "rank", 0), ("reward_mean", "reward", 3), ("reward_max", "max", 2),
               ("kl", "kl", 4), ("loss", "loss", 4), ("clip_frac", "clip", 2), ("grad_norm", "gnorm", 2),
               ("adv_std", "adv std", 2), ("completion_len", "len", 1), ("ratio_dev", "|r-1|", 3),
               ("seconds", "s/step", 2)]
# A loop's own timing of a step: the runner's seconds (s/step) measure every loop alike, and one time column is enough.
TIME_KEYS = {"dt", "time", "step_time", "elapsed", "dt_ms", "time_ms"}
MAX_ROWS = 40       # a longer run shows every k-th step (and the latest), so the table fits a screen
OUTPUT_LINES = 20   # lines of the loop's output shown per step: a print in a hot loop cannot flood the screen


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


def _table(columns: list, rows: list) -> Table:
    # spaces between columns, no rules: the narrowest table that still reads as one
    table = Table(*(header for _, header, _ in columns), box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False,
                  collapse_padding=True, pad_edge=False)
    for r in rows:
        table.add_row(*(fmt(r.get(key, ""), digits) for key, _, digits in columns))
    return table


def run_table(rows: list, title: str, width: int | None = None, cited=()):
    """The steps so far (a row per rank with several) under `title`, with a column for every metric the loop
    reports, as many as fit `width` (default: the terminal's) without cutting one: step and rank first, then the
    metrics in `cited` (those the brief talks about), then the rest in table order. The columns that do not fit
    are dropped whole and named in one line above the table."""
    width = width or console.width
    rows = [r for row in rows for r in by_rank(row)]
    known = {key for key, _, _ in RUN_COLUMNS}
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in known and k not in TIME_KEYS))
    columns = [c for c in RUN_COLUMNS if any(c[0] in r for r in rows)] + [(k, k, 3) for k in extra]
    first = [c for c in columns if c[0] in ("step", "rank")] + [c for c in columns if c[0] in cited]
    kept = []
    for c in list(dict.fromkeys(first + columns)):
        trial = [x for x in columns if x in kept or x == c]
        if not kept or console.measure(_table(trial, rows), options=console.options.update_width(10_000)).maximum \
                <= width:
            kept.append(c)
    dropped = [c[1] for c in columns if c not in kept]
    parts = [Text(title, style="bold")]
    if dropped:
        parts.append(Text(f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal shows "
                          f"{'them' if len(dropped) > 1 else 'it'})", style="dim"))
    return Group(*parts, _table([c for c in columns if c in kept], rows))


def cited_metrics(kata) -> list:
    """The metrics a kata's brief cites (its recorded symptoms), rank suffixes dropped."""
    return list(dict.fromkeys(s["metric"].split("@")[0] for s in kata.symptoms if s.get("metric")))


def run_settings(event: dict) -> str:
    """The runner's config event as one line: what the run is, and the settings it takes that the file's
    GRPOConfig would not (the practice settings and the run's own)."""
    ranks = f", {event.get('nproc')} ranks" if event.get("nproc", 1) > 1 else ""
    changed = " ".join(f"{k}={v}" for k, v in (event.get("changed") or {}).items())
    return (f"{event.get('task')} task, seed {event.get('seed')}, {event.get('steps')} steps{ranks}; GRPOConfig: "
            + (f"the file's defaults but {changed}" if changed else "the file's defaults"))


def live_run(run, title: str, steps: int, cited=(), log: str | None = None) -> tuple:
    """Draw a run as it goes: what the loop prints, each line marked with the step it printed in (at most
    OUTPUT_LINES a step), above a live table of the steps. Returns (the steps' stats, the runner's last event)."""
    history, last, every = [], None, -(-steps // MAX_ROWS)
    seen = {"shown": 0, "dropped": 0}
    live = Live(console=console, refresh_per_second=8)

    def say_dropped():
        if seen["dropped"]:
            where = f" (all in {log})" if log and run.log and not run.log_full else ""  # run.log: None unwritable
            step = min(len(history) + 1, steps)
            live.console.print(Text(f"     … {seen['dropped']:,} more lines in step {step}{where}", style="dim"))
        seen["shown"] = seen["dropped"] = 0

    try:
        for kind, item in run:
            if kind == "output":
                if seen["shown"] < OUTPUT_LINES:
                    line = Text.from_ansi(item[: 4 * console.width])
                    live.console.print(Text(f"{min(len(history) + 1, steps):>4} │ ", style="dim") + line)
                    seen["shown"] += 1
                else:
                    seen["dropped"] += 1
                continue
            last = item
            if item["event"] == "config":
                live.console.print(Text(run_settings(item), style="dim"))
            if item["event"] == "step":
                say_dropped()
                history.append({k: v for k, v in item.items() if k != "event"})
                shown_rows = [h for h in history if h["step"] % every == 0 or h["step"] == 1]
                if shown_rows[-1] is not history[-1]:
                    shown_rows.append(history[-1])
                live.update(run_table(shown_rows, title, cited=cited))
                live.start()  # does nothing once started
    finally:
        say_dropped()
        live.stop()
    if history:
        console.print()
    return history, last


def crash_report(event: dict) -> None:
    """The loop's exception: the line it stopped at, then its traceback from the first frame in the loop's file,
    printed plain so that it can be copied."""
    lines = (event.get("traceback") or f"{event['type']}: {event['message']}").rstrip("\n").splitlines()
    file, _, line = event["where"].rpartition(":")
    where = f"{shown(Path(file))}:{line}" if file else event["where"]
    console.print(Text(f"your loop raised {event['type']} at {where}", style="bold red"))
    console.print(Text("\n".join((["  …"] if len(lines) > 60 else []) + lines[-60:])))


# --- make run: the curves beside a healthy run -----------------------------------------------------------

def ranks_of(history: list) -> int:
    return 1 + len({k.rsplit("@", 1)[1] for h in history[:1] for k in h if re.fullmatch(r".+@\d+", k)})


def over_ranks(history: list) -> list:
    """Each step's metrics as the mean over its ranks (key, key@1, ...). Rank 0's own reward is not what a loop
    that logs the mean over ranks logs; the mean over ranks is the same quantity whichever of the two a loop logs."""
    out = []
    for h in history:
        row = dict(h)
        for key in [k for k in h if "@" not in k]:
            values = [h[key]] + [v for k, v in h.items() if k.startswith(f"{key}@")]
            if len(values) > 1 and all(isinstance(v, (int, float)) for v in values):
                row[key] = sum(values) / len(values)
        out.append(row)
    return out


def comparison(label: str, history: list, healthy: tuple, steps: int, png, title: str, cited=()) -> None:
    """Your curves beside the healthy run's (`healthy`: its history, whether it was cached, why it did not finish),
    as sparklines and, with matplotlib, a PNG (`png`, titled `title`): reward, KL and grad norm, then any other
    metric the brief cites (`cited`)."""
    reference, cached, problem = healthy
    shown_curves = curves_for(cited)
    curves(label, history, reference, steps, problem, cached, shown_curves)
    try:
        drawn = plot_png({"yours": over_ranks(history), "healthy": over_ranks(reference)}, png, title, shown_curves)
    except OSError as exc:
        console.print(f"[yellow]cannot write {escape(shown(png))}: {exc.strerror or exc}[/]")
        return
    console.print(f"curves: {shown(png)}" if drawn else f"[dim]{escape(PLOT_HINT)}[/]")


def curves(label: str, history: list, reference: list, steps: int, problem: str | None, cached=False,
           which=CURVES) -> None:
    """Sparklines of your run and the healthy one, a row per curve on a shared scale, sized to the terminal."""
    ranks = ranks_of(history)
    mine, ref = over_ranks(history), over_ranks(reference)
    width = max(16, min(40, (console.width - 22) // 2))
    title = f"curves, first -> last 5-step mean ({NOT_FINITE}: not finite)" + \
        (f"; each the mean over the {ranks} ranks" if ranks > 1 else "")
    table = Table("", f"{label} (yours)", "healthy (the same code, no bugs)", box=None, padding=(0, 2))
    for key, name, digits in which:
        a, b = series(mine, key, steps, width), series(ref, key, steps, width)
        lo, hi = shared_range(a, b)
        cells = []
        for values, run, style in ((a, mine, "cyan"), (b, ref, "green")):
            if all(v is None for v in values):
                cells.append(Text("not reported", style="dim"))
                continue
            s = summarize(run, key)
            cells.append(Text(sparkline(values, lo, hi), style=style) + Text(f"\n{s.first:.{digits}f} -> "
                                                                             f"{s.last:.{digits}f}"))
        table.add_row(name, *cells)
    console.print(title)
    console.print(table)
    if problem:
        console.print(f"[yellow]{escape(problem)}[/]")
    else:
        yours, healthy = summarize(mine), summarize(ref)
        console.print(f"reward {yours.first:.3f} -> {yours.last:.3f} (mean of the first and last 5 steps"
                      + (f", over the {ranks} ranks" if ranks > 1 else "")
                      + f"); healthy: {healthy.first:.3f} -> {healthy.last:.3f}" + (" (cached)" if cached else ""))


# --- make check --------------------------------------------------------------------------------------

def check_report(results: dict, title: str, kata=None, fixed=(), run_skipped: str = "") -> int:
    """The check table, then how many checks pass (and, for a kata, how many of its bugs are fixed); returns the
    number of checks that fail. `run_skipped` says why the brief's run was not judged (a file without a kata)."""
    console.print(check_table(results, title, run_skipped))
    failed = sum(not r.passed for r in results.values())
    count = f"{len(results) - failed} of {len(results)} checks pass"
    console.print(f"{len(fixed)} of {len(kata.bugs)} bugs fixed; {count}" if kata else count)
    return failed


def check_table(results: dict, title: str, run_skipped: str = "") -> Table:
    table = Table(title=title)
    for col in ("component", "checks", "result", "first failure"):
        table.add_column(col, overflow="fold")
    for comp in CHECK_COMPONENTS:
        mine = {c: r for c, r in results.items() if c.component == comp}
        if comp == "run" and not mine:  # the brief's run: judged only for a kata
            table.add_row(comp, "-", "[yellow]skipped[/]", escape(run_skipped or "not judged"))
            continue
        failed = [r for r in mine.values() if not r.passed]
        verdict = "[green]pass[/]" if not failed else f"[red]fail ({len(failed)})[/]"
        table.add_row(comp, f"{len(mine) - len(failed)}/{len(mine)}", verdict,
                      escape(failed[0].message) if failed else "")
    return table


# --- make list, stats ----------------------------------------------------------------------------------

def kata_list(katas: list, statuses: list) -> None:
    table = Table("N", "kata", "tier", "time box", "status", "time", "hints")
    solved = 0
    colour = {"solved": "green", "in progress": "yellow", "not started": "default"}
    for k, s in zip(katas, statuses):
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


def stats_table(rows: list, bugs: dict) -> None:
    if not rows:
        console.print("no drill finished yet: `make drill` draws one (stats come from solved or revealed drills)")
        return
    table = Table("bug class", "component", "attempts", "solved", "median time", "box", "next due")
    for b, attempts, rate, median, due, box_ in rows:
        table.add_row(b, bugs[b].component if b in bugs else "?", str(attempts), f"{rate:.0%}",
                      minutes(median) if median is not None else "", str(box_), due[:10])
    console.print(table)


# --- mock rounds ---------------------------------------------------------------------------------------

def countdown(kata_key, total_minutes: float, used) -> None:
    """A live clock (`used()` gives the seconds on it) with a nudge at half time and at the end, and no cut-off;
    returns on Ctrl-C."""
    total = float(total_minutes) * 60
    said = set()
    console.print("the clock runs until Ctrl-C; the round stays open until `make mock-end`")
    try:
        with Live(console=console, refresh_per_second=2, transient=True) as live:
            while True:
                spent = used()
                left = total - spent
                if spent >= total / 2 and "half" not in said:
                    said.add("half")
                    live.console.print(f"[yellow]half time: {minutes(total / 2)} used, {minutes(left)} left[/]")
                if left <= 0 and "end" not in said:
                    said.add("end")
                    live.console.print("[bold red]time is up[/]: the interviewer decides whether to go on")
                clock = f"{minutes(left)} left" if left > 0 else f"[red]{minutes(-left)} over[/]"
                live.update(Panel(clock, title=f"kata {kata_key}", expand=False))
                time.sleep(0.25)
    except KeyboardInterrupt:
        return


def interviewer_sheet(kata, bugs: dict, rubric: list) -> None:
    console.print(Panel(f"[bold]{escape(kata.title)}[/]  {kata.tier}, {kata.minutes} min, {len(kata.bugs)} bug(s)",
                        title=f"interviewer's sheet: kata {kata.key}", expand=False))
    table = Table("bug", "component", "what is wrong", "symptom")
    for b in kata.bugs:
        table.add_row(b, bugs[b].component, escape(bugs[b].what), escape(bugs[b].symptom))
    console.print(table)
    for i, h in enumerate(kata.hints, 1):
        console.print(f"hint {i}: {escape(h)}")
    sheet = Table("rubric", "what good looks like", "score 1-4")
    for name, good in rubric:
        sheet.add_row(name, good, "")
    console.print(sheet)


def scorecard(markdown: str) -> None:
    console.print(Markdown(markdown))
