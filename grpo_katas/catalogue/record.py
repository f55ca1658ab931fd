"""A kata's brief run, recorded in the repository: the table `make run` prints for the run its brief describes (every
column but the seconds per step), for the kata as shipped and for its healthy codebase, in katas/NN-slug/run.txt.

Practice runs compute in float64 (runs.lab_dtype), so a table's digits are the same on every CPU: torch's kernel
paths (ATEN_CPU_CAPABILITY default, avx2, avx512; NEON or SVE on ARM) part in the last bits of a float64 number,
about 1e-11 after 40 steps, far below the digits a table prints. The record is what any machine can show it
reproduces, row by row, and what a brief's numbers are read from.

A few bugs make a run's dynamics amplify a last bit tenfold every step or two, so that late in the run the paths
print different digits. Such a table is recorded with the rows every path prints alike marked as such (`[kata
exact=30]`: rows 1 to 30), the rest as this CPU printed them, for reading; only the exact rows are compared.

The records are written, or checked here, by `python -m grpo_katas.proof.record_runs`, from runs that
symptoms.Store makes (one child process per kernel path, kept in .cache/symptoms/).
"""
import re

from grpo_katas.catalogue.katas import CODEBASES
from grpo_katas.training.curves import by_rank, cell, table_columns


NAME = "run.txt"
KERNELS = ("default", "avx2", "avx512")  # the x86 paths; elsewhere the CPU's own is what a run takes
SIDES = ("kata", "healthy")


def table(history: list, crash: str | None = None) -> list:
    """The lines of a run's table: a header, then a row per step and rank, each cell at the digits `make run`
    prints, right-aligned; the seconds per step left out (they are the machine's, not the run's). A run that
    raised ends with a line naming what it raised."""
    rows = []
    for step in history:
        split = by_rank(step)
        rows += [split[0]] + [{**r, "step": step.get("step")} for r in split[1:]]
    columns = [c for c in table_columns(rows) if c[0] != "seconds"]
    cells = [[header for _, header, _ in columns]] + [[cell(r.get(key, "-"), places) for key, _, places in columns]
                                                      for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return lines + ([f"raised {crash}"] if crash else [])


def describe(kata) -> str:
    run = kata.run
    settings = " ".join(f"{k}={v}" for k, v in run["set"].items())
    ranks = f", {run['nproc']} ranks" if run["nproc"] > 1 else ""
    return f"sum task, seed {run['seed']}, {run['steps']} steps{ranks}" + (f", SET={settings}" if settings else "")


def render(kata, tables: dict, exact: dict, paths: list) -> str:
    """The record's text: what it is, then the kata's table and the healthy codebase's under [kata] and [healthy],
    each marked `exact=N` where only its first N rows are the same on every kernel path (`paths`)."""
    out = [f"# {kata.name}: the brief's run ({describe(kata)}), as `make run N={kata.number}` prints it but the "
           f"seconds per step;", f"# float64 runs under the {', '.join(paths)} kernel paths print each table alike, "
           f"row for row" + ("" if all(n is None for n in exact.values()) else
                             f", but where marked exact=N: its first N rows, the rest are {paths[0]}'s"),
           "# written by python -m grpo_katas.proof.record_runs, compared by its --check and by make test"]
    for side in SIDES:
        out += [f"[{side}" + (f" exact={exact[side]}" if exact.get(side) is not None else "") + "]"] + tables[side]
    return "\n".join(out) + "\n"


def load(kata) -> dict | None:
    """{"kata": lines, "healthy": lines, "exact": {side: N or None}} of a kata's record (N: only the first N rows
    are the same on every kernel path), or None when it has none."""
    path = kata.path / NAME
    if not path.exists():
        return None
    tables, side = {"exact": {}}, None
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(\w+)(?: exact=(\d+))?\]", line)
        if m:
            side = m.group(1)
            tables[side], tables["exact"][side] = [], int(m.group(2)) if m.group(2) else None
        elif side is not None:
            tables[side].append(line)
    return tables


def first_difference(recorded: list, fresh: list) -> tuple | None:
    """(row number, the recorded line, the fresh line) of the first line that differs, cell by cell (the header is
    row 0; a missing line is ''), or None where the two tables are the same."""
    for i in range(max(len(recorded), len(fresh))):
        a = recorded[i] if i < len(recorded) else ""
        b = fresh[i] if i < len(fresh) else ""
        if a.split() != b.split():
            return i, a, b
    return None


def runs_of(kata) -> dict:
    """{side: (path, settings)} of the runs a record holds: the kata and its healthy codebase, at the brief's run."""
    return {"kata": (kata.loop, kata.run), "healthy": (CODEBASES[kata.codebase].path, kata.run)}


def tables_of(kata, store, kernel_name: str) -> dict:
    return {side: table(r.history, r.crash) for side, (path, settings) in runs_of(kata).items()
            for r in [store.get(path, settings, kernel_name)]}


def differences(kata, tables: dict, where: str, sides=SIDES) -> list:
    """What differs between a kata's record and the tables of fresh runs made `where` (a kernel path, a CPU)."""
    recorded = load(kata)
    if recorded is None:
        return [f"{kata.name}: no {NAME}: python -m grpo_katas.proof.record_runs {kata.number} writes it"]
    out = []
    for side in sides:
        exact = recorded["exact"].get(side)
        cut = slice(None) if exact is None else slice(exact + 1)  # the header and the exact rows
        diff = first_difference(recorded.get(side, [])[cut], tables[side][cut])
        if diff:
            row, a, b = diff
            out.append(f"{kata.name}: {where} prints a different {side} table from row {row} on: the record has "
                       f"{a.strip()!r}, this run {b.strip()!r}")
    return out
