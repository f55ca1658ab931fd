"""What the README and docs/ show is what a user gets: every make command they quote in a command block is one make
takes, and every example of output is what its command prints today.

An example is the fenced block or the quote that follows a marker naming the command behind it:

    <!-- example: run 14 -->

that is `python -m grpo_katas.practice.cli run 14`, run in a copy of the repository at 80 columns (after `kata 14`,
which makes the working copy), or as wide as a `COLUMNS=120` before the command says. The block's lines must appear in the command's output in that order: a line `…`
stands for any left out, and the seconds of a run table's last column, which no two runs share, are not compared. A
quote (`> ` lines) must appear in the output word for word, however the terminal wrapped it. The commands train and
judge, so the comparison is a slow test (CI runs it); that each marker names a command the CLI takes is not.
"""
import re
import shlex
from pathlib import Path
from typing import NamedTuple

import pytest

from grpo_katas import ROOT
from tests.cli_helpers import cli, private_copy

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- example: (.+?) -->$")
ELIDED = "…"
COLUMNS = 80


class Example(NamedTuple):
    where: str      # file:line of the marker
    command: list   # the CLI's arguments
    lines: list     # the block's lines (a quote's without its "> ")
    quote: bool
    columns: int    # the terminal's width it was printed at: COLUMNS=N before the command, else 80


def examples(path: Path) -> list:
    """The examples in one Markdown file: each marker, and the fenced block or quote right after it."""
    lines, found = path.read_text().splitlines(), []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        words = shlex.split(m[1])
        columns = int(words.pop(0).removeprefix("COLUMNS=")) if words[0].startswith("COLUMNS=") else COLUMNS
        j = next((j for j in range(i + 1, len(lines)) if lines[j].strip()), len(lines))
        where = f"{path.relative_to(ROOT)}:{i + 1}"
        if j < len(lines) and lines[j].startswith("```"):
            end = next(k for k in range(j + 1, len(lines)) if lines[k].startswith("```"))
            found.append(Example(where, words, lines[j + 1:end], False, columns))
        elif j < len(lines) and lines[j].startswith(">"):
            end = next((k for k in range(j, len(lines)) if not lines[k].startswith(">")), len(lines))
            found.append(Example(where, words, [ln[1:].strip() for ln in lines[j:end]], True, columns))
        else:
            found.append(Example(where, words, [], False, columns))
    return found


EXAMPLES = [e for path in DOCS for e in examples(path)]


def make_commands(path: Path) -> list:
    """(file:line, the words after `make`) of every make command in the file's fenced blocks, a line that goes on
    (indented, a bracketed setting first) joined to it; a usage's brackets and a comment are left out."""
    out, fenced = [], False
    for i, line in enumerate(path.read_text().splitlines()):
        if line.startswith("```"):
            fenced = not fenced
            continue
        text = line.split(" # ", 1)[0].replace("[", " ").replace("]", " ")
        if fenced and line.startswith("make "):
            out.append((f"{path.relative_to(ROOT)}:{i + 1}", shlex.split(text)[1:]))
        elif fenced and out and re.match(r"\s+\[", line) and out[-1][0] == f"{path.relative_to(ROOT)}:{i}":
            out[-1] = (out[-1][0], out[-1][1] + shlex.split(text))
    return out


def makefile() -> tuple:
    """(the Makefile's targets, target -> the settings it takes), read from its TARGETS and TAKES_ lines."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    targets = re.search(r"^TARGETS := (.*)$", text, re.MULTILINE)[1].split()
    takes = {m[1]: m[2].split() for m in re.finditer(r"^TAKES_(\S+)\s*:= *(.*)$", text, re.MULTILINE)}
    return targets, takes


def test_every_make_command_in_a_command_block_is_one_make_takes():
    targets, takes = makefile()
    commands = [c for path in DOCS for c in make_commands(path)]
    assert len(commands) > 20, commands  # the README and docs/ hold twice that: the parsing found them
    wrong = []
    for where, words in commands:
        target = next((w for w in words if "=" not in w), None)
        if target not in targets:
            wrong.append(f"{where}: make {' '.join(words)}: no target {target!r}")
            continue
        given = [w.split("=", 1)[0] for w in words if "=" in w]
        wrong += [f"{where}: make {target} does not take {g}=" for g in given if g not in takes.get(target, [])]
    assert not wrong, "\n".join(wrong)


def test_every_example_names_a_command_the_cli_takes():
    from grpo_katas.practice.cli import parser
    assert {tuple(e.command[:1]) for e in EXAMPLES} >= {("kata",), ("run",), ("check",)}, EXAMPLES
    for e in EXAMPLES:
        assert e.lines, f"{e.where}: the marker is followed by no block or quote"
        parser().parse_args(e.command)  # exits (status 2) on a command it does not take


def normal(line: str) -> str:
    """A line as compared: trailing spaces off, and a run table row's seconds per step (its 11th column) left out."""
    words = line.split()
    if len(words) == 11 and words[0].isdigit() and re.fullmatch(r"\d+\.\d+", words[-1]):
        return " ".join(words[:-1])
    return " ".join(words) if re.match(r"^\d+\s", line) else line.rstrip()


def drift(example: Example, output: str) -> str | None:
    """Where the example's lines part from the output (None: they appear in it, in order)."""
    if example.quote:
        boxless = re.sub(r"[\u2500-\u257f]", " ", output)  # a panel's borders, between the lines of its text
        said, printed = " ".join(" ".join(example.lines).split()), " ".join(boxless.split())
        return None if said in printed else f"the quote is not in the output: {said[:120]!r}"
    printed, at = [normal(line) for line in output.splitlines()], 0
    for line in example.lines:
        if line.strip() == ELIDED:
            continue
        want = normal(line)
        if want not in printed[at:]:
            return f"this line is not in the output (after the lines before it): {line!r}"
        at = printed.index(want, at) + 1
    return None


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return private_copy(tmp_path_factory.mktemp("docs"), shared_runs=True)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.where} {' '.join(e.command)}")
def test_every_example_is_what_its_command_prints_today(copy, example):
    kata = example.command[1] if len(example.command) > 1 and example.command[0] in ("run", "check") else None
    if kata is not None:
        cli(copy, "kata", kata)  # the working copy the command reads
    _, output = cli(copy, *example.command, env={"COLUMNS": str(example.columns)})
    problem = drift(example, output)
    assert problem is None, f"{example.where}: {' '.join(example.command)}: {problem}\nit printed:\n{output}"
