"""The judge: the checks run in one process, the implementation under test in another (the worker), and the two
talk only through contract calls over a socket; a loop's training runs in a sandbox of its own.

    wire.py      framing and the encoding of values: tensors, models, optimizers, configs, rollouts (both sides)
    standins.py  models whose logits follow a rule, known by name on both sides (both sides)
    worker.py    the call server: loads the targets and runs contract calls (inside the sandbox)
    sandbox.py   how the worker and a run are started (bubblewrap, or a plain process), their limits and caps, and
                 how they are killed
    client.py    the judge's side: the worker handle, CPU budgets and hangs, and the `Target` the checks call
    contract.py  the contract's config and rollout as the checks build them
    loop_run.py  a loop trained by the runner in a run's sandbox, watched (`make run` and the brief's run)
    brief.py     run::brief_symptoms_gone: the brief's run made and judged against the healthy codebase's
    matrix.py    the checks over targets and seeds, with pytest, and the verdicts (the judge's process)
    grade.py     `make grade`: one submission judged in a child process, and its three reports

Only wire.py, standins.py and worker.py (with lab/) are visible inside the worker's sandbox, and only the runner's
files (training/) in a run's; nothing here imports pytest on the worker's side.
"""
