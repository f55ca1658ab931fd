"""`make test`: the repository's tests but the slow ones, the checks on the reference, and the proof's static tier.

    python -m tests [PYTEST ARGS]       # extra arguments go to each pytest run of tests/
    python -m tests --slow [ARGS]       # the slow tests alone, shared out the same way (CI, after the proof)

The tests run in two pytest processes side by side that share them out (--share=FOLDER, tests/conftest.py): each
takes the next test no other has taken, so that neither waits while the other has a long queue. The first one's
report comes as it runs, the second's after it; each names a failure on stderr at once. Among them,
tests/test_record.py runs a kata of each codebase under this CPU's kernel path and compares each table with the
kata's recorded run digit for digit: a CPU whose digits differ is named, with the first row that differs.

The proof's static tier (python -m grpo_katas.proof.verify --tier static) applies the rules that need no run to every
planting and every kata (an edit still applies, no tell, no unused name, a kata is its codebase plus its bugs, every
bug reachable, every kata recorded). It starts first, at a lower CPU priority, beside the tests, and its report
follows the tests' and the checks' output. The exit status is that of the first of the three that failed, or 0.

CI (.ci/run) runs this, then the whole proof, fresh (make verify FRESH=1: every bug in every codebase, three seeds,
every symptom at five seeds, every recorded run on each kernel path), then the slow tests (`@pytest.mark.slow`) over
the same two workers, with --slow: they come after the proof so that the runs it made (.cache/symptoms/, keyed by
the bytes of the code they ran) are read rather than made again.
"""
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_katas import children_cpu


ROOT = Path(__file__).resolve().parent.parent
PROOF = [sys.executable, "-m", "grpo_katas.proof.verify", "--tier", "static"]


WORKERS = 2  # the tests wait on the processes they start much of the time: two side by side keep the cores busy


def workers(marker: str, durations: int, argv: list, share: str) -> list:
    """WORKERS pytest commands over tests/ that share out the tests `marker` selects through the folder `share`."""
    return [[sys.executable, "-m", "pytest", "-q", "-o", "console_output_style=classic", f"--durations={durations}",
             "-m", marker, "tests", f"--share={share}", *argv] for _ in range(WORKERS)]


def steps(argv: list, share: str) -> list:
    """(what, [command, ...]) of the parts that run in turn while the proof runs beside them; a part's commands
    run side by side (the tests, in WORKERS pytest processes that share them out through the folder `share`)."""
    return [("the tests", workers("not slow", 6, argv, share)),
            ("the checks on the reference", [[sys.executable, "-m", "pytest", "-q", "checks"]])]


def slow_steps(argv: list, share: str) -> list:
    """The slow tests alone (CI, after the proof), over the same workers."""
    return [("the slow tests", workers("slow", 12, argv, share))]


def replay(cmd: list, log) -> None:
    """A command line and the output it wrote to the (temporary) file `log`, as if it had run in the foreground."""
    print(f"\n$ {' '.join(cmd[1:])}", flush=True)
    log.seek(0)
    sys.stdout.write(log.read())


def side_by_side(cmds: list, cwd) -> int:
    """Run the commands at once: the first one's output as it comes, each other's after it, whole, but for what it
    writes to stderr, which comes at once (the tests name each failure there as it happens: a run cut short still
    says which failed). The exit status is the first command's that failed, or 0."""
    print(f"\n$ {' '.join(cmds[0][1:])}" + "".join(f"\n  and beside it: {' '.join(c[1:])}" for c in cmds[1:]),
          flush=True)
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in cmds[1:]]
        procs = [subprocess.Popen(cmds[0], cwd=cwd)]
        procs += [subprocess.Popen(c, cwd=cwd, stdout=log) for c, log in zip(cmds[1:], logs)]  # stderr: at once
        try:
            codes = [p.wait() for p in procs]
        finally:
            for p in procs:  # an interruption: none is left running
                if p.poll() is None:
                    p.terminate()
                    p.wait()
        for c, log in zip(cmds[1:], logs):
            replay(c, log)
    return next((code for code in codes if code), 0)


def run(parts: list, proof: list | None, cwd=ROOT, name: str = "make test") -> int:
    """Run the parts in turn and the proof beside them (None: no proof), niced; print the proof's report last, then
    each part's time and CPU-seconds under `name`. The exit status is that of the first part that failed, the proof
    last, or 0."""
    start, cpu = time.monotonic(), children_cpu()
    done = []  # (what, exit status, seconds, CPU-seconds)
    with tempfile.TemporaryFile("w+") as report:
        beside = proof and subprocess.Popen(proof, cwd=cwd, stdout=report, stderr=subprocess.STDOUT,
                                            preexec_fn=lambda: os.nice(10))
        try:
            if beside:
                print(f"the proof's static tier ({' '.join(proof[1:])}) runs beside the tests; its report comes last",
                      flush=True)
            for what, cmds in parts:
                t, c = time.monotonic(), children_cpu()
                done.append((what, side_by_side(cmds, cwd), time.monotonic() - t, children_cpu() - c))
            if beside:
                if beside.poll() is None:
                    print("\nwaiting for the proof ...", flush=True)
                code = beside.wait()  # reaped last: its CPU is what the children's grew by beside the parts'
                done.append(("the proof's static tier (from the start, beside them)", code, time.monotonic() - start,
                             children_cpu() - cpu - sum(d[3] for d in done)))
        except KeyboardInterrupt:  # the whole process group had the SIGINT; make sure the proof is gone too
            if beside:
                beside.terminate()
                try:
                    beside.wait(10)
                except subprocess.TimeoutExpired:
                    beside.kill()
            print("\ninterrupted")
            return 130
        if beside:
            replay(proof, report)
    print(f"\n{name}: " + "; ".join(f"{what} {seconds:.0f} s, {cpu_s:.0f} CPU-s "
                                     f"({'passed' if code == 0 else f'exit {code}'})"
                                     for what, code, seconds, cpu_s in done) +
          f"; {time.monotonic() - start:.0f} s, {children_cpu() - cpu:.0f} CPU-s in all", flush=True)
    return next((code for what, code, *_ in done if code), 0)


if __name__ == "__main__":
    slow = sys.argv[1:2] == ["--slow"]
    with tempfile.TemporaryDirectory(prefix="grpo-katas-tests-") as share:
        if slow:
            sys.exit(run(slow_steps(sys.argv[2:], share), None, name="the slow tests"))
        sys.exit(run(steps(sys.argv[1:], share), PROOF))
