"""The practice CLI: `make kata`, `run`, `check`, `watch`, `hint`, `drill`, `mock` and the rest.

    cli.py       the commands (one cmd_* each, from the COMMANDS table) and their arguments
    render.py    what the terminal shows: panels, tables, the live run, key reading
    progress.py  work/state.json, the one owner of your progress; your copies in work/
    rounds.py    mock rounds: the clock, the scorecard
    drills.py    drills drawn, proven and scheduled by what you miss
    jobs.py      the checks on a file (the judge), and the healthy run beside yours, cached

The top floor: it uses every other package; none uses it.
"""
