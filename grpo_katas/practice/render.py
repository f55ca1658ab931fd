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
from rich.table import Column, Table
from rich.text import Text

from grpo_katas.catalogue.katas import CHECK_COMPONENTS
from grpo_katas.practice.progress import shown
from grpo_katas.training.curves import (CURVES, NOT_FINITE, PLOT_HINT, by_rank, cell, curves_for, plot_png, series,
                                        shared_range, sparkline, summarize, table_columns)


console = Console(highlight=False)


class ConsoleNotes(logging.Handler):
    """The library's notices (a progress file set aside) as yellow lines on the console."""

    def emit(self, record):
        console.print(f"[yellow]{escape(record.getMessage())}[/]")


def show_notes(logger: logging.Logger) -> None:
    if not any(isinstance(h, ConsoleNotes) for h in logger.handlers):
        logger.addHandler(ConsoleNotes())


def fmt(v, digits=3) -> str:
    return cell(v, digits)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


@contextlib.contextmanager
def busy(text: str):
    """A spinner and the seconds so far, then what is running, on one line at any width (the words cut to fit), while
    slow work runs in this process (the checks, a drill's proof); yields a function that changes the text. It draws
    on a duplicate of the terminal's descriptor, because pytest, which runs the checks, captures descriptors 1 and 2
    while it runs. Nothing when stdout is not a terminal."""
    if not console.is_terminal:
        yield lambda note: None
        return
    with os.fdopen(os.dup(console.file.fileno()), "w") as screen:
        kept = lambda width: Column(no_wrap=True, min_width=width)  # noqa: E731
        what = TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", min_width=1))
        spinner = Progress(SpinnerColumn(table_column=kept(1)), TimeElapsedColumn(table_column=kept(7)), what,
                           console=Console(file=screen, highlight=False), transient=True)  # only the words are cut
        with spinner:
            task = spinner.add_task(escape(text))
            yield lambda note: spinner.update(task, description=escape(note))


class Keys:
    """The keys pressed while a command waits (make watch, the mock countdown). See keys()."""

    def __init__(self, pressed=None):
        self.pressed = pressed  # a queue the reader thread fills, None when stdin is not a terminal
        self.interactive = pressed is not None
        self.busy = False       # while work runs that q stops as Ctrl-C does (make watch's checks)
        self.how_to_stop = "Ctrl-C or q to stop" if self.interactive else "Ctrl-C to stop"

    def wait(self, seconds: float) -> str | None:
        """A key pressed within `seconds`, or None."""
        if self.pressed is None:
            time.sleep(seconds)
            return None
        import queue
        try:
            return self.pressed.get(timeout=seconds)
        except queue.Empty:
            return None

    def choose(self, allowed: str) -> str:
        """The first of the `allowed` keys pressed (waits for one)."""
        while True:
            key = self.wait(3600)
            if key and key.lower() in allowed:
                return key.lower()


@contextlib.contextmanager
def keys():
    """Keys, read from the terminal while a command waits on it, a key at a time and not echoed. Ctrl-C comes as a
    key too, turned into this process's own KeyboardInterrupt: the terminal would send SIGINT to make as well, which
    then ends with status 130 where stopping a watch or a countdown is a success (status 0). Ctrl-Z works as ever.
    The terminal's settings come back on leaving (and after a stop, fg). Without a terminal, nothing changes."""
    import queue
    import signal
    import termios
    import threading
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield Keys()
        return
    saved = termios.tcgetattr(fd)
    mine = termios.tcgetattr(fd)
    mine[3] &= ~(termios.ICANON | termios.ECHO)                   # a key at a time, not echoed
    mine[6][termios.VINTR] = os.fpathconf(fd, "PC_VDISABLE")      # Ctrl-C is a key, not SIGINT to the group
    mine[6][termios.VMIN], mine[6][termios.VTIME] = 1, 0
    pressed, done = queue.Queue(), threading.Event()
    state = Keys(pressed)

    def read():
        import select
        while not done.is_set():
            if select.select([fd], [], [], 0.2)[0]:
                key = os.read(fd, 1).decode(errors="replace")
                if key == "\x03" or key == "q" and state.busy:
                    os.kill(os.getpid(), signal.SIGINT)
                else:
                    pressed.put(key)

    def again(signum, frame):  # after Ctrl-Z and fg the shell has put its own settings back
        termios.tcsetattr(fd, termios.TCSANOW, mine)
    before = signal.signal(signal.SIGCONT, again)
    termios.tcsetattr(fd, termios.TCSANOW, mine)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield state
    finally:
        done.set()
        reader.join(timeout=1)
        termios.tcsetattr(fd, termios.TCSANOW, saved)
        signal.signal(signal.SIGCONT, before)


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

MAX_ROWS = 40       # a longer run shows every k-th step (and the latest), so the table fits a screen
OUTPUT_LINES = 20   # lines of the loop's output shown per step: a print in a hot loop cannot flood the screen


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
    columns = table_columns(rows)
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
    """The runner's config event as one line: what the run is (task, seed, steps, ranks, the model and where it
    runs), and the settings it takes that the file's GRPOConfig would not (the practice settings and the run's own)."""
    ranks = f", {event.get('nproc')} ranks" if event.get("nproc", 1) > 1 else ""
    name = event.get("model", "")
    name = shown(Path(name)) if name.startswith("/") else name  # a folder of the repository as you typed it
    model = f", {name} on {event.get('device', 'cpu')}" if name else ""
    changed = " ".join(f"{k}={v}" for k, v in (event.get("changed") or {}).items())
    return (f"{event.get('task')} task, seed {event.get('seed')}, {event.get('steps')} steps{ranks}{model}; "
            "GRPOConfig: " + (f"the file's defaults but {changed}" if changed else "the file's defaults"))


ALIVE_EVERY = 30  # seconds between the plain lines that say a long step is alive when the output is not a terminal


def alive_text(alive, path: Path) -> Text:
    """A step that takes long, in one line: how long, the CPU it used against its budget, and where the loop is."""
    frames = loop_frames(alive.stack, path)
    where = f", at {Path(frames[-1][0]).name}:{frames[-1][1]} in {frames[-1][2]}" if frames else ""
    return Text(f"step {alive.step}: {alive.seconds:.0f} s so far, {alive.cpu:.1f} of {alive.budget:g} CPU-s{where}",
                style="yellow")


def live_run(run, title: str, steps: int, cited=(), log: str | None = None) -> tuple:
    """Draw a run as it goes: what the loop prints, each line marked with the step it printed in (at most
    OUTPUT_LINES a step), above a live table of the steps, and below it, while a step takes long, how long, the CPU
    it used and where the loop is (on a terminal; otherwise a line every ALIVE_EVERY seconds). Returns (the steps'
    stats, the runner's last event)."""
    history, last, every = [], None, -(-steps // MAX_ROWS)
    seen = {"shown": 0, "dropped": 0, "alive_at": 0.0}
    live = Live(console=console, refresh_per_second=8)
    table = None

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
            if kind == "alive":
                status = alive_text(item, run.path)
                if console.is_terminal:
                    live.update(Group(table, status) if table is not None else status)
                    live.start()
                elif item.seconds - seen["alive_at"] >= ALIVE_EVERY:
                    seen["alive_at"] = item.seconds
                    console.print(status)
                continue
            last = item
            if item["event"] == "config":
                live.console.print(Text(run_settings(item), style="dim"))
            if item["event"] == "step":
                say_dropped()
                seen["alive_at"] = 0.0
                history.append({k: v for k, v in item.items() if k != "event"})
                shown_rows = [h for h in history if h["step"] % every == 0 or h["step"] == 1]
                if shown_rows[-1] is not history[-1]:
                    shown_rows.append(history[-1])
                table = run_table(shown_rows, title, cited=cited)
                live.update(table)
                live.start()  # does nothing once started
    finally:
        say_dropped()
        if table is not None:
            live.update(table)  # the last step's table, without a status line
        live.stop()
    if history:
        console.print()
    return history, last


def loop_frames(stack: str, path: Path) -> list:
    """(file, line, function) of each frame in the loop's file, outermost first, in a stack faulthandler dumped:
    of the thread whose stack holds the loop's file (the main thread; torch has others)."""
    threads = [re.findall(r'^  File "(.+)", line (\d+) in (.+)$', block, re.MULTILINE)
               for block in re.split(r"^(?:Current thread|Thread) .*$", stack or "", flags=re.MULTILINE)]
    mine = [[(shown(Path(f)), int(n), fn) for f, n, fn in frames if Path(f).resolve() == path.resolve()]
            for frames in threads]
    return list(reversed(max(mine, key=len, default=[])))


def stack_report(stack: str, path: Path) -> None:
    """Where the loop was, as a traceback lists it (outermost first), with each line's source."""
    import linecache
    frames = loop_frames(stack, path)
    if not frames:
        console.print("[dim](where it was could not be read: it was not in your file's code)[/]")
        return
    lines = ["Stack of your loop (most recent call last):"]
    for file, line, function in frames:
        lines.append(f'  File "{file}", line {line}, in {function}')
        code = linecache.getline(str(path), line).strip()
        if code:
            lines.append(f"    {code}")
    console.print(Text("\n".join(lines)))


def stopped_report(event: dict, path: Path, budget_flag: str) -> None:
    """A run stopped over its budget, or interrupted: why, and where the loop was."""
    if event["event"] == "hung":
        console.print(Text(f"your loop was stopped in step {event['step']}: {event['why']}, a step's budget "
                           f"({budget_flag}{event['budget']:g}; a larger one lets it run longer)", style="bold red"))
        stack_report(event.get("stack", ""), path)
        return
    if event.get("traceback"):  # the runner's own account of where Ctrl-C found the loop
        file, _, line = event["where"].rpartition(":")
        mine = file and Path(file).resolve() == path.resolve()
        console.print(Text(f"interrupted; your loop was at {shown(Path(file))}:{line}" if mine else "interrupted",
                           style="bold"))
        if mine:
            lines = event["traceback"].rstrip("\n").splitlines()
            console.print(Text("\n".join([line for line in lines if not line.startswith("KeyboardInterrupt")][-40:])))
        return
    console.print(Text(f"interrupted in step {event['step']}; your loop did not stop on Ctrl-C, so it was ended",
                       style="bold"))
    stack_report(event.get("stack", ""), path)


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
    names = max(len(name) for _, name, _ in which) + 2  # the first column, indented by 2
    width = max(16, min(40, (console.width - names - 4) // 2))  # two sparklines and the gaps left of each
    title = f"curves, first -> last 5-step mean ({NOT_FINITE}: not finite)" + \
        (f"; each the mean over the {ranks} ranks" if ranks > 1 else "")
    healthy = "healthy (the same code, no bugs)" if width >= 32 else "healthy (no bugs)"
    table = Table("", f"{label} (yours)", healthy, box=None, padding=(0, 0, 0, 2), pad_edge=True)
    for key, name, digits in which:
        a, b = series(mine, key, steps, width), series(ref, key, steps, width)
        lo, hi = shared_range(a, b)
        cells = []
        for values, run, style in ((a, mine, "cyan"), (b, ref, "green")):
            if all(v is None for v in values):
                cells.append(Text("not reported", style="dim"))
                continue
            s = summarize(run, key)
            cells.append(Text(sparkline(values, lo, hi), style=style) + Text(f"\n{cell(s.first, digits)} -> "
                                                                             f"{cell(s.last, digits)}"))
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

def check_report(results: dict, title: str, kata=None, fixed=(), every: bool = False, component=None,
                 run_skipped: str = "") -> int:
    """The check table (one component's row with `component`), with `every` each failing check and its message
    below it, then how many checks pass (and, for a whole kata, how many of its bugs are fixed); returns the number
    of checks that fail. `run_skipped` says why the brief's run was not judged (a file without a kata)."""
    console.print(check_table(results, title, run_skipped))
    failed = sorted(c for c, r in results.items() if not r.passed)
    if every and failed:
        console.print(failing_checks(results, failed))
    count = f"{len(results) - len(failed)} of {len(results)} {component + ' ' if component else ''}checks pass"
    console.print(f"{len(fixed)} of {len(kata.bugs)} bugs fixed; {count}" if kata else count)
    return len(failed)


def check_table(results: dict, title: str, run_skipped: str = "") -> Table:
    table = Table(title=title)
    for col in ("component", "checks", "result", "first failure"):
        table.add_column(col, overflow="fold")
    for comp in CHECK_COMPONENTS:
        mine = {c: r for c, r in results.items() if c.component == comp}
        if not mine:  # a component that was not run (make check COMPONENT=...), or a file's run without a brief
            if comp == "run" and run_skipped:
                table.add_row(comp, "-", "[yellow]skipped[/]", escape(run_skipped))
            continue
        failed = [r for r in mine.values() if not r.passed]
        verdict = "[green]pass[/]" if not failed else f"[red]fail ({len(failed)})[/]"
        table.add_row(comp, f"{len(mine) - len(failed)}/{len(mine)}", verdict,
                      escape(failed[0].message) if failed else "")
    return table


def failing_checks(results: dict, failed: list) -> Table:
    """Every failing check (make check ALL=1), by component, with what it observed."""
    table = Table("failing check", "what it observed", title=f"every failing check ({len(failed)})", box=box.SIMPLE,
                  show_lines=False)
    table.columns[0].overflow = table.columns[1].overflow = "fold"
    for c in failed:
        table.add_row(str(c), escape(results[c].message))
    return table


CHECK_SCHEMA = "grpo-katas/check/1"


def check_json(results: dict, path, seed: int, component, kata=None, fixed=None, record=None) -> str:
    """`make check FORMAT=json`: the verdict as one JSON object, schema CHECK_SCHEMA (docs/practice.md: the checks'
    JSON)."""
    import json
    order = sorted(results)
    comps = [{"name": comp, "passed": sum(results[c].passed for c in order if c.component == comp),
              "total": sum(c.component == comp for c in order)} for comp in CHECK_COMPONENTS
             if any(c.component == comp for c in order)]
    out = {"schema": CHECK_SCHEMA, "target": shown(path), "kata": kata.key if kata else None, "seed": seed,
           "component": component, "passed": sum(results[c].passed for c in order), "total": len(order),
           "bugs": {"planted": len(kata.bugs), "fixed": len(fixed)} if kata and fixed is not None else None,
           "solved": bool(record) if kata and fixed is not None else None,
           "seconds": round(record["seconds"], 1) if record else None,
           "components": comps,
           "checks": [{"id": str(c), "component": c.component, "name": c.name, "passed": results[c].passed,
                       "message": results[c].message, "kind": results[c].kind} for c in order]}
    return json.dumps(out, indent=1, ensure_ascii=False)


# --- make list, stats ----------------------------------------------------------------------------------

def span(seconds: float) -> str:
    """A time spent, short: 45 s, 12 min, 1 h 05 min."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    m = int(seconds // 60)
    return f"{m} min" if m < 60 else f"{m // 60} h {m % 60:02d} min"


def compact_table(**kwargs) -> Table:
    """A table without borders, one space between columns: the most room for what is in it."""
    return Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, **kwargs)


def fitted(table: Table, rows: list, elastic: int, width: int) -> Table:
    """`table` with its `rows` (lists of cells), column `elastic` given what the others leave of `width` (at least
    8: a cell wider is cut with an ellipsis), and the others as wide as their widest cell, never narrower."""
    widths = [max(Text.from_markup(str(r[i])).cell_len for r in [[c.header for c in table.columns], *rows])
              for i in range(len(table.columns))]
    others = sum(w for i, w in enumerate(widths) if i != elastic) + 2 * (len(widths) - 1)  # a divider and a space
    for i, column in enumerate(table.columns):
        if i != elastic:
            column.min_width = widths[i]
    table.columns[elastic].max_width = max(8, min(widths[elastic], width - others))
    for r in rows:
        table.add_row(*r)
    return table


LIST_MARKS = {"revealed": ("*", "the solution revealed before it was solved"),
              "reset": ("+", "solved before a reset")}


def kata_list(katas: list, statuses: list, filtered: bool = False, idle_minutes: int = 10) -> None:
    """Every kata (and drill) with its tier, codebase (a drill's once solved or revealed), bugs, time box, your
    status, time spent and hints, in the terminal's width: a title that does not fit is cut with an ellipsis, never
    a number; a column no row fills (time, hints) is left out, and what a status adds is a mark, said below."""
    if not katas:
        console.print("no kata matches" + (" (a drill whose codebase is hidden is left out)" if filtered else ""))
        return
    rows, solved, marked = [], 0, set()
    colour = {"solved": "green", "in progress": "yellow", "not started": "default"}
    for k, s in zip(katas, statuses):
        solved += s.label == "solved" or s.solved_before_reset
        marks = [m for m, on in (("revealed", s.revealed_early), ("reset", s.solved_before_reset and
                                                                   s.label != "solved")) if on]
        marked.update(marks)
        label = f"[{colour[s.label]}]{s.label}[/]" + "".join(f"[red]{LIST_MARKS[m][0]}[/]" for m in marks)
        open_ = not k.drill or s.label == "solved" or s.revealed_early or s.solved_before_reset
        rows.append([k.key, escape(k.title), k.tier, k.codebase if open_ else "?", str(len(k.bugs)),
                     f"{k.minutes} min", label, span(s.seconds) if s.seconds is not None else "", str(s.hints or "")])
    columns = [("N", "right"), ("kata", "left"), ("tier", "left"), ("codebase", "left"), ("bugs", "right"),
               ("box", "right"), ("status", "left"), ("time", "right"), ("hints", "right")]
    kept = [i for i, (name, _) in enumerate(columns) if name not in ("time", "hints") or any(r[i] for r in rows)]
    table = compact_table()
    for i in kept:
        name, justify = columns[i]
        table.add_column(name, justify=justify, no_wrap=True)
    console.print(fitted(table, [[r[i] for i in kept] for r in rows], 1, console.width))
    for m in sorted(marked):
        console.print(f"[red]{LIST_MARKS[m][0]}[/] {LIST_MARKS[m][1]}")
    bar = Progress(TextColumn("progress"), BarColumn(), TextColumn("{task.completed}/{task.total} solved"),
                   console=console)
    bar.add_task("", total=len(katas), completed=solved)
    bar.start()
    bar.stop()
    console.print(f"[dim]time spent: from your commands and saves; a pause over {idle_minutes} min "
                  f"counts as {idle_minutes}[/]")


def stats_table(rows: list, bugs: dict) -> None:
    if not rows:
        console.print("no drill finished yet: `make drill` draws one (stats come from solved or revealed drills)")
        return
    table = compact_table()
    table.add_column("bug class", no_wrap=True, overflow="ellipsis")
    table.add_column("component", no_wrap=True)
    for name in ("tries", "solved", "median", "box"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("next due", no_wrap=True)
    cells = [[b, bugs[b].component if b in bugs else "?", str(attempts), f"{rate:.0%}",
              span(median) if median is not None else "", str(box_), due[:10]]
             for b, attempts, rate, median, due, box_ in rows]
    console.print(fitted(table, cells, 0, console.width))


# --- mock rounds ---------------------------------------------------------------------------------------

def countdown(kata_key, total_minutes: float, used) -> None:
    """A live clock (`used()` gives the seconds on it) with a nudge at half time and at the end, and no cut-off;
    returns on Ctrl-C (or q on a terminal)."""
    total = float(total_minutes) * 60
    said = set()
    with keys() as pressed:
        console.print(f"the clock runs until {pressed.how_to_stop.replace(' to stop', '')}; the round stays open "
                      f"until `make mock-end`")
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
                    if pressed.wait(0.25) == "q":
                        return
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
