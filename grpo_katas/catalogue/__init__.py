"""The catalogue: the katas and bugs as data, and the runs that show what a brief says.

    katas.py      Kata, Bug and Codebase; katas/*/kata.toml and katas/bugs.toml read, bugs planted, FAIL_TO_PASS
    drawn.py      a drill drawn and filed in work/drills/dN/, read back as a Kata
    symptoms.py   a symptom of a brief shown (or not) by a run against its healthy codebase's; the runs, cached
    record.py     each kata's recorded run (run.txt): its tables, read and compared

Above training (symptoms makes runs), below the judge and the proof, which read it.
"""
