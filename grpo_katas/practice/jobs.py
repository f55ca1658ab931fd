"""The practice CLI's jobs: the hidden checks on one file, and a loop file's short training run (the
reference's, for comparison, cached in work/cache/ by its settings and the code that makes it).

The candidate's code never runs in the CLI's process: the checks judge it in a sandboxed worker (the same judge
as CI), and a training run goes to a fresh interpreter in a run's sandbox (loop_run.py), so a loop can hang, crash
or print anything without taking the CLI down with it. Neither draws anything: the CLI renders what they return.
"""
import hashlib
import json
import re
from pathlib import Path

from grpo_katas import CHECKS, REFERENCE, ROOT, UserError
from grpo_katas.judge.loop_run import LoopRun
from grpo_katas.practice.progress import read_cache, write_cache


def run_checks(path: Path, seed: int = 0, component: str | None = None, kata=None) -> dict:
    """{CheckId: Verdict} for one file, judged exactly as CI judges it: the checks run in this process, the file
    in a sandboxed worker process (grpo_katas/judge), and with a kata its brief's run (run::brief_symptoms_gone);
    with `component`, only that component's checks (its file in checks/) and no run. Raises UserError when it cannot
    be judged, and KeyboardInterrupt when Ctrl-C stopped the checks (pytest catches it and returns its status)."""
    import pytest

    from grpo_katas.judge import matrix  # pytest and torch, imported only when checks run
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if not path.is_file():
        raise UserError(f"{shown}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    run = matrix.run([path], [seed], checks=component_checks(component) if component else CHECKS,
                     kata=None if component else kata)
    if run.exit_code == pytest.ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    if 0 in run.load_errors:
        raise UserError(f"cannot load {shown}: {run.load_errors[0]}")
    if not run.of(0, seed):
        raise UserError(f"the checks could not run on {shown} (pytest exit status {run.exit_code})")
    return run.of(0, seed)


def component_checks(component: str) -> Path:
    """The file in checks/ that holds one component's checks (its `pytestmark = pytest.mark.component(...)`)."""
    for f in sorted(CHECKS.glob("test_*.py")):
        if re.search(rf"^pytestmark = pytest\.mark\.component\([\"']{re.escape(component)}[\"']\)", f.read_text(),
                     re.MULTILINE):
            return f
    from grpo_katas.catalogue.katas import COMPONENTS
    raise UserError(f"COMPONENT must be one of {', '.join(COMPONENTS)}, got {component!r}")


def run_args(steps: int, seed: int, nproc: int, settings: list, hf_model: str = "", task: str | None = None,
             device: str | None = None) -> list:
    """The runner's arguments for a run (a kata's, and the healthy run beside it); a local model folder goes by
    its full path, since the runner starts in the repository root."""
    args = ["--steps", str(steps), "--seed", str(seed), "--nproc", str(nproc), "--set", *settings]
    if device:
        args = ["--device", device, *args]
    if hf_model:
        model = Path(hf_model).expanduser()
        args = ["--hf-model", str(model.resolve()) if model.exists() else hf_model, *args]
    return ["--task", task, *args] if task else args


def step_stats(event: dict) -> dict:
    return {k: v for k, v in event.items() if k != "event"}


# What a healthy run depends on besides its settings and its codebase: change one and the cached run is made again.
RUN_CODE = [ROOT / "grpo_katas" / "training" / "runs.py", ROOT / "grpo_katas" / "training" / "runner.py", ROOT / "lab" / "model.py",
            ROOT / "lab" / "tasks.py", ROOT / "lab" / "hf.py", ROOT / "lab" / "text.py"]


def reference_run(runner_args: list, codebase: Path = REFERENCE) -> tuple:
    """(history, cached, problem) of a healthy codebase (by default the reference) driven by the runner with the
    same arguments as a kata's run: from work/cache/ when this run was made before with the same settings and
    code, else run now and stored. `problem` says why the run did not finish (then nothing is stored)."""
    code = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in [codebase, *RUN_CODE]}
    key = hashlib.sha256(json.dumps({"args": runner_args, "code": code}, sort_keys=True).encode()).hexdigest()
    name = f"reference-run-{key[:16]}"
    cached = read_cache(name)
    if isinstance(cached, dict) and isinstance(cached.get("history"), list):
        return cached["history"], True, None
    history, last = [], None
    run = LoopRun(codebase, runner_args)
    for kind, event in run:
        if kind == "event":
            last = event
            if event["event"] == "step":
                history.append(step_stats(event))
    if run.interrupts:
        raise KeyboardInterrupt
    if not last or last["event"] != "done":
        why = last.get("message") if last else " / ".join(run.last_output)
        return history, False, f"the healthy run did not finish with these settings: {why or 'no reason given'}"
    write_cache(name, {"args": runner_args, "code": code, "history": history})
    return history, False, None
