"""A linter is the first tell detector: ruff's findings in a planted file or a kata that its codebase does not carry.

A candidate who runs a linter over a kata (or whose editor does) is shown every line it flags. A finding the healthy
codebase carries too (a `zip()` without `strict=` in the trainer) points at nothing; one that only the planting
brings (an `import copy` left unused where the reference is built, two `if` arms made alike) points at the bug.
`make verify` and `make test`'s static tier refuse every such finding (grpo_katas/proof/verify.py). Findings are compared
by rule code and the flagged line's text with its spacing collapsed, never by line number, so a planting that moves
the lines below it is judged by what it adds.

    python -m grpo_katas.proof.lint             # every finding any planting or kata adds to its codebase, and the count

ruff comes with the development set-up (`make setup` installs the `dev` extra at the version constraints.txt pins;
.ci/run runs make setup); without it the rule cannot run, and the proof says so and fails.
"""
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


# What a reader's linter flags that a planting could bring. Each family with why it is here:
RULES = (
    "F",        # pyflakes: unused imports (F401) and locals (F841), names redefined unused, undefined names
    "B",        # bugbear: useless expressions (B018) and comparisons (B015), loop variables in closures, zip strict
    "ARG",      # unused arguments: a parameter the planting stopped reading
    "E4", "E7", "E9",  # the rest of ruff's default set: what a bare `ruff check` shows beside pyflakes
    "PLR0124",  # pylint: a name compared with itself
    "PLR0133",  # pylint: two constants compared
    "PLW0127",  # pylint: a name assigned to itself
    "PLW0128",  # pylint: one name assigned twice in one statement
    "PLW0129",  # pylint: assert on a literal
    "PLW0120",  # pylint: else on a loop without break
    "PLW2901",  # pylint: a loop variable overwritten in its loop
    "PLR1704",  # pylint: an argument redefined by a local
    "PLW0642",  # pylint: self or cls reassigned
    "RUF059",   # an unpacked variable never used
    "RUF024",   # a mutable value shared by every key of dict.fromkeys
    "SIM114",   # two if arms with the same body
)
TARGET_VERSION = "py310"  # pyproject's requires-python


class LintUnavailable(Exception):
    """ruff is not installed where the proof runs."""


def ruff_command() -> list:
    """The ruff beside this interpreter (a venv's bin/), else the one on PATH; LintUnavailable where there is none."""
    for path in (str(Path(sys.executable).parent), None):
        found = shutil.which("ruff", path=path)
        if found:
            return [found]
    raise LintUnavailable("ruff is not installed, so no planting is linted: make setup installs it (.venv/bin/pip "
                          "install -c constraints.txt -e '.[dev]')")


def findings(texts: dict) -> dict:
    """{key: Counter((rule code, the flagged line's text, spaces collapsed))} of one ruff run over every text; a text
    ruff cannot parse counts one 'syntax' finding per error."""
    command = ruff_command()
    with tempfile.TemporaryDirectory() as tmp:
        names = {}
        for i, (key, text) in enumerate(texts.items()):
            path = Path(tmp) / f"f{i}.py"
            path.write_text(text)
            names[path.name] = key
        r = subprocess.run(command + ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                      "--target-version", TARGET_VERSION, "--select", ",".join(RULES), tmp],
                           capture_output=True, text=True)
        try:
            reported = json.loads(r.stdout)
        except ValueError:
            raise LintUnavailable(f"ruff gave no report (exit {r.returncode}): {r.stderr.strip()[-300:]}") from None
    out = {key: collections.Counter() for key in texts}
    for f in reported:
        key = names[Path(f["filename"]).name]
        lines = texts[key].splitlines()
        row = f["location"]["row"]
        line = " ".join(lines[row - 1].split()) if 0 < row <= len(lines) else ""
        out[key][(f.get("code") or "syntax", line, f.get("message", ""))] += 1
    return out


def added(healthy: collections.Counter, planted: collections.Counter) -> list:
    """'CODE on `line`: message' for each finding the planted file carries more often than its healthy codebase."""
    base = collections.Counter()
    for (code, line, _), n in healthy.items():
        base[code, line] += n
    out = []
    for (code, line, message), n in sorted(planted.items()):
        extra = max(0, n - base[code, line])
        base[code, line] = max(0, base[code, line] - n)
        out += [f"ruff {code} on `{line[:80]}`: {message}"] * extra
    return out


def planted_findings(sources: dict, planted: dict) -> dict:
    """{key: [finding, ...]} for every planted text with a finding its codebase does not carry. sources: {codebase:
    healthy text}; planted: {key: (codebase, text)}."""
    texts = {f"codebase:{name}": text for name, text in sources.items()}
    texts.update({key: text for key, (_, text) in planted.items()})
    found = findings(texts)
    out = {}
    for key, (name, _) in planted.items():
        extra = added(found[f"codebase:{name}"], found[key])
        if extra:
            out[key] = extra
    return out


def main() -> int:
    from grpo_katas.catalogue.katas import CODEBASES, codebase_source, load_bugs, load_katas, plant
    bugs, sources, planted = load_bugs(), {name: codebase_source(name) for name in CODEBASES}, {}
    for bug in bugs.values():
        for name in bug.edits:
            planted[f"{bug.id}@{name}"] = (name, plant(sources[name], [bug], name))
    for kata in load_katas():
        planted[kata.name] = (kata.codebase, kata.loop.read_text())
    try:
        found = planted_findings(sources, planted)
    except LintUnavailable as exc:
        print(exc)
        return 1
    per = collections.Counter()
    for key, extra in sorted(found.items()):
        per[planted[key][0]] += len(extra)
        for finding in extra:
            print(f"{key}: {finding}")
    counts = ", ".join(f"{name} {per[name]}" for name in CODEBASES)
    print(f"{sum(per.values())} ruff finding(s) beyond the codebases' own in {len(found)} of {len(planted)} plantings "
          f"and katas ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
