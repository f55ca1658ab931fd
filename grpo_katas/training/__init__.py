"""Training a loop: the run every command makes of a loop file, and the reference trainer.

    runs.py       RunConfig (one config for a short run), building the lab model or a real one, driving a loop's
                  train(), data-parallel ranks, GRPOConfig overrides and their refusals
    runner.py     a loop file trained in a process of its own, its events as JSON lines (make run, the judge)
    loader.py     importing a loop file by path, its own errors as the user's
    curves.py     what a run's numbers look like: tables, sparklines, PNG curves (matplotlib, optional)
    train.py      `make train`: the reference trained with a live display, metrics, checkpoints, resume
    bench.py      `make bench`: how fast the reference trains here
    gpu_check.py  `make gpu-check`: the reference on CUDA, then in bf16
    bundle_run.py the run.py a bundle hands a candidate (stands alone: it imports nothing of grpo_katas)

The lowest floor: nothing here imports another package of grpo_katas. A run's sandbox binds runner.py, runs.py and
loader.py (with this file and grpo_katas/__init__.py), so they stay free of the catalogue and the judge.
"""
