"""The judge: the checks run in one process, the implementation under test in another (the worker), and the two
talk only through contract calls over a socket.

    wire.py      framing and the encoding of values: tensors, models, optimizers, configs, rollouts (both sides)
    standins.py  models whose logits follow a rule, known by name on both sides (both sides)
    worker.py    the call server: loads the targets and runs contract calls (inside the sandbox)
    sandbox.py   how the worker is started (bubblewrap, or a plain process), its limits, and how it is killed
    client.py    the judge's side: the worker handle, CPU budgets and hangs, and the `Target` the checks call

Only wire.py, standins.py and worker.py (with lab/) are visible inside the sandbox; nothing here imports pytest
on the worker's side.
"""
