"""The proof that the checks bite: `make verify`, and the static rules `make test` runs.

    verify.py       every bug caught, every kata failing exactly its FAIL_TO_PASS, the healed kata passing, each
                    symptom shown, records reproduced (the full tier), or the rules that need no run (static)
    structure.py    a kata reads like its codebase: no planted line betrays itself by its shape
    lint.py         no planted bug is what a linter flags
    record_runs.py  `python -m grpo_katas.proof.record_runs`: write each kata's run.txt, or check it here

Above the judge (it judges every planting), below the practice CLI.
"""
