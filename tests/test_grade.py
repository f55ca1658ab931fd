"""The grader: the reference, a kata, a partial fix, and a suite of broken and hostile submissions, each graded by
the real grader on a private copy of the repository. No broken or hostile submission may pass, results.json,
junit.xml and summary.md are always written and valid, and each grading ends within its time limit plus 10 s.
The hostile suite is graded three at a time, which also shows that verdicts do not depend on how busy the
machine is; the cases that hang get a short --time-limit, as a user would give one. It is slow: `make test` skips
it, CI runs it. Run: pytest tests/test_grade.py [-m "not slow"]"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from grpo_katas import REFERENCE, ROOT
from grpo_katas.catalogue.katas import codebase_source, find_kata, load_bugs, plant
from grpo_katas.judge import sandbox
from tests.cli_helpers import n_checks, private_copy

KATA = find_kata(1)                       # one planted bug: the KL penalty enters with the wrong sign
BUGGY = KATA.loop.read_text()
GOOD = REFERENCE.read_text()
TIME_LIMIT = 90
MARK = "grpo-katas-escapee"               # in the argv of processes a submission leaves behind, and in file names
MODE = sandbox.resolve("auto")[0]         # grading refuses a plain process unless asked: where no bubblewrap, ask
# a case that hangs gets a short limit, through the option a user has; it ends as a failure, or, where the machine
# is too busy for the judge to finish its last checks in the seconds after the limit, as an error: never a pass
SHORT = ("--time-limit", "30")


class Case(NamedTuple):
    source: str
    status: str                           # the results' status; alternatives separated by |
    words: str                            # expected in a test's message, the message or the events; | separates
    kata: int = KATA.number
    args: tuple = ()                      # the grader's options, as a user gives them
    resolved: str = "RESOLVED_NO"         # alternatives separated by |
    place: str = ""                       # what the submission's path is instead of a file holding the source:
                                          # link:TARGET, fifo, folder, unreadable (the source, chmod 000)


def time_limit(args) -> float:
    return float(args[args.index("--time-limit") + 1]) if "--time-limit" in args else TIME_LIMIT


def hostile(repo, out) -> dict:
    """name -> Case: the ways in that the graders so far met (issues 11 and 19), and broken submissions."""
    ref, checks = repo / "solutions" / "grpo.py", repo / "checks"
    nan = GOOD + ('\ngroup_advantages = lambda rewards, group_size, eps: torch.full_like(rewards, float("nan"))\n'
                  'kl_penalty = lambda logp, ref_logp: torch.full_like(logp, float("nan"))\n')
    skip_all = ("import pytest\n\ndef _skip(*args, **kwargs):\n    pytest.skip('nothing to judge')\n\n"
                "generate = completion_mask = group_advantages = token_logprobs = kl_penalty = grpo_loss = "
                "grpo_step = train = _skip\n")
    cases = {
        # the cases the first grader already handled
        "syntax-error": ("def generate(:\n", "error", "SyntaxError"),
        "sys-exit-at-import": ("import sys\nsys.exit(0)\n" + GOOD, "error", "SystemExit"),
        "os-exit-at-import": ("import os\nos._exit(0)\n" + GOOD, "error", "ended the worker process"),
        "hang-at-import": ("while True:\n    pass\n" + GOOD, "error", "CPU time while importing|time limit",
                           KATA.number, SHORT),
        "hang-in-a-function": (at_start_of(GOOD, "kl_penalty", "while True:\n    pass"),
                               "fail|error", "kl_penalty did not return|time limit", KATA.number, SHORT),
        "sleeps-in-a-function": (at_start_of(GOOD, "group_advantages", "import time; time.sleep(10**6)"), "fail|error",
                                 "used no CPU at all|time limit", KATA.number, SHORT),
        "segfault": (at_start_of(GOOD, "group_advantages", "import ctypes; ctypes.string_at(0)"), "fail", "SIGSEGV"),
        "eats-memory-at-import": ("hog = bytearray(64 * 2**30)\n" + GOOD, "error", "MemoryError"),
        "nan-everywhere": (nan, "fail", "checks pass"),
        "prints-fake-passes": ('print("PASSED " * 40)\nprint("===== 90 passed in 1.00s =====")\n' + BUGGY,
                               "fail", "checks pass"),
        "patches-torch-comparisons": ("import torch\ntorch.allclose = lambda *a, **k: True\n"
                                      "torch.isclose = lambda *a, **k: torch.tensor(True)\n" + BUGGY,
                                      "fail", "checks pass"),
        "patches-pytest-reporting": ("import _pytest.reports\n"
                                     "_pytest.reports.BaseReport.failed = property(lambda s: False)\n"
                                     "_pytest.reports.BaseReport.passed = property(lambda s: True)\n"
                                     "_pytest.reports.TestReport.outcome = 'passed'\n" + BUGGY,
                                     "fail", "checks pass"),
        "imports-the-reference-module": ("from solutions.grpo import *\n", "error", "ModuleNotFoundError"),
        "loads-the-reference-file": (f"exec(open({str(ref)!r}).read())\n", "error", "FileNotFoundError"),
        # the ways in that the first grader missed (issue 11)
        "skips-every-check": (skip_all, "fail", "Skipped"),
        "execs-the-reference-named-in-argv": (BUGGY + (
            "\nimport os, re\nfor _pid in os.listdir('/proc'):\n    try:\n"
            "        _argv = open(f'/proc/{_pid}/cmdline', 'rb').read().decode(errors='ignore')\n"
            "    except OSError:\n        continue\n"
            "    for _path in re.findall(r'[^\\x00]*solutions[^\\x00]*', _argv) + "
            f"[{str(ref)!r}]:\n        try:\n            exec(open(_path.removesuffix('/') + "
            "('' if _path.endswith('.py') else '/grpo.py')).read())\n        except OSError:\n            pass\n"),
            "fail", "checks pass"),
        "replaces-the-checks-in-memory": (BUGGY + (
            f"\nimport sys\nsys.path.insert(0, {str(repo)!r})\ntry:\n    import checks.test_kl as _t\n"
            "    for _n in dir(_t):\n        if _n.startswith('test_'):\n"
            "            setattr(_t, _n, lambda *a, **k: None)\nexcept ImportError:\n    pass\n"),
            "fail", "checks pass"),
        "rewrites-the-checks-on-disk": (BUGGY + (
            f"\nimport glob\nfor _f in glob.glob({str(checks)!r} + '/*.py') + glob.glob('/tmp/**/checks/*.py', "
            "recursive=True):\n    try:\n        open(_f, 'w').write('def test_nothing():\\n    pass\\n')\n"
            "    except OSError:\n        pass\n"), "fail", "checks pass"),
        "import-hook-rewrites-checks": (BUGGY + (
            "\nimport sys, importlib.abc\nclass _Hook(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.startswith('checks'):\n            raise ImportError('hooked')\n"
            "sys.meta_path.insert(0, _Hook())\n"), "fail", "checks pass"),
        "registers-a-pytest-plugin": (BUGGY + (
            "\nimport gc\ntry:\n    import _pytest.config\n    class _P:\n"
            "        def pytest_runtest_logreport(self, report):\n            report.outcome = 'passed'\n"
            "    for _o in gc.get_objects():\n        if isinstance(_o, _pytest.config.Config):\n"
            "            _o.pluginmanager.register(_P())\nexcept Exception:\n    pass\n"), "fail", "checks pass"),
        "delegates-to-the-oracle": (BUGGY + (
            f"\nimport sys, threading, time\nsys.path.insert(0, {str(repo)!r})\n"
            "def _rebind():\n    for _ in range(200):\n        try:\n            from checks import oracle\n"
            "            oracle.kl_k3 = kl_penalty\n            return\n        except ImportError:\n"
            "            time.sleep(0.05)\nthreading.Thread(target=_rebind, daemon=True).start()\n"), "fail",
            "checks pass"),
        "torch-function-mode": (BUGGY + (
            "\nimport torch\nfrom torch.overrides import TorchFunctionMode\nclass _Liar(TorchFunctionMode):\n"
            "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
            "        if func in (torch.allclose, torch.equal):\n            return True\n"
            "        return func(*args, **(kwargs or {}))\n_Liar().__enter__()\n"), "fail", "checks pass"),
        "patches-an-unwatched-operator": (BUGGY + (
            "\nimport torch\n_div = torch.Tensor.__truediv__\n"
            "torch.Tensor.__truediv__ = lambda a, b: _div(a, b)\n"), "fail", "checks pass"),
        "loads-the-reference-on-first-call": (at_start_of(BUGGY, "kl_penalty", (
            f"try:\n    exec(open({str(ref)!r}).read(), globals())\nexcept OSError:\n    pass")),
            "fail", "checks pass"),
        "forges-replies-from-a-thread": (GOOD + (
            "\nimport io, os, struct, threading, time\ndef _forge():\n    buf = io.BytesIO()\n"
            "    torch.save({'ok': True, 'result': None, 'updates': {}, 'rng': torch.get_rng_state()}, buf)\n"
            "    frame = struct.pack('>Q', len(buf.getvalue())) + buf.getvalue()\n    while True:\n"
            "        for _fd in os.listdir('/proc/self/fd'):\n            try:\n"
            "                if os.readlink(f'/proc/self/fd/{_fd}').startswith('socket:'):\n"
            "                    os.write(int(_fd), frame)\n            except OSError:\n                pass\n"
            "        time.sleep(0.02)\nthreading.Thread(target=_forge, daemon=True).start()\n"),
            "error|fail", "out of order|checks pass|undecodable|time limit|broke the protocol", KATA.number, SHORT),
        # a race of frames: a forged frame may land inside a real one, whose header then reads as a wrong length
        "escapes-and-rewrites-out": (BUGGY + (
            f"\nimport atexit, os, subprocess, time\n_out = {str(out)!r}\n"
            "def _forge_results():\n    for _name in ('results.json', 'summary.md', 'junit.xml'):\n        try:\n"
            "            open(os.path.join(_out, _name), 'w').write('{\"status\": \"pass\"}')\n"
            "        except OSError:\n            pass\natexit.register(_forge_results)\n"
            f"subprocess.Popen(['sleep', '3600', {MARK!r}], start_new_session=True, stdout=None, stderr=None)\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(4)\n    _forge_results()\n    os._exit(0)\n"),
            "fail", "checks pass"),
    }
    return {name: Case(*case) for name, case in cases.items()} | issue_19_cases() | issue_31_cases(ref)


def issue_19_cases() -> dict:
    """The ways in of issue 19: a grader run as root, hostile output, known inputs."""
    kata_30_half_fixed = plant(codebase_source("trainer"), [load_bugs()["clip-high-on-lower"]], "trainer")
    return {
        "remounts-its-binds-writable": Case(BUGGY + REMOUNT, "fail", "checks pass"),
        # partial: the bug left still fails its check; at some draws a check of the healed bug calls grpo_loss
        # directly with clip_eps_high set, gets the NaN, and fails too (a check that passed before: RESOLVED_NO)
        "nan-gradients-hide-a-bug": Case(kata_30_half_fixed + NAN_WHEN_CALLED_DIRECTLY, "fail", "clip_eps_high",
                                         kata=30, resolved="RESOLVED_PARTIAL|RESOLVED_NO"),
        "logs-a-100-mib-string": Case(GOOD + "\n_train = train\ndef train(*args, **kwargs):\n"
                                      "    history = _train(*args, **kwargs)\n"
                                      "    history[0]['loss'] = 'x' * (100 * 2**20)\n    return history\n",
                                      "fail", "a message of"),
        "lone-surrogate-in-a-message": Case(
            at_start_of(BUGGY, "group_advantages", "raise ValueError('\\udc80 <b>|</b> \\x00\\x07')"),
            "fail", "ValueError"),
        "fills-its-tmp": Case("_f = open('/tmp/fill', 'wb')\nfor _ in range(1536):\n    _f.write(b'x' * 2**20)\n"
                              + BUGGY, "error", "No space left|File too large", args=("--memory-gb", "1")),
        "floods-its-log": Case(
            at_start_of(BUGGY, "group_advantages", "import sys\nwhile True:\n    sys.stdout.write('x' * 2**20)"),
            "fail", "File too large"),
        "names-a-judge-function": Case(BUGGY + FORGES_A_DTYPE, "fail", "unknown dtype"),
        "stops-the-judge-in-process-mode": Case(
            at_start_of(BUGGY, "group_advantages", "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)"), "error",
            "did not finish within its time limit", args=("--sandbox", "process", "--time-limit", "60")),
        "stops-what-it-sees-in-the-sandbox": Case(at_start_of(BUGGY, "group_advantages", (
            "import os, signal\nfor _pid in (os.getppid(), -1):\n    try:\n        os.kill(_pid, signal.SIGSTOP)\n"
            "    except OSError:\n        pass")), "fail|error", "checks pass|time limit", args=SHORT),
        "knows-the-seed-0-draws": Case(GOOD + KNOWS_SEED_0, "fail", "the k3 estimate"),
        "ranks-share-prompts": Case(replaced(GOOD, "prompt_gen = torch.Generator().manual_seed(seed + seed_offset)",
                                             "prompt_gen = torch.Generator().manual_seed(seed)"),
                                    "fail", "both ranks drew the same"),
    }


def issue_31_cases(ref) -> dict:
    """The ways in of issue 31: a path that is no file of its own, the sandbox's memory-backed folders, a reply that
    amplifies or holds a number no count can be, and fixes that heal only when judged."""
    return {
        "links-to-the-reference": Case("", "error", "a symbolic link", place=f"link:{ref}"),
        "links-to-proc-self-mem": Case("", "error", "a symbolic link", place="link:/proc/self/mem"),
        "links-to-proc-self-pagemap": Case("", "error", "a symbolic link", place="link:/proc/self/pagemap"),
        "a-fifo": Case("", "error", "a FIFO", place="fifo"),
        "a-folder": Case("", "error", "a folder", place="folder"),
        # root reads it anyway: then it is graded as the unfixed kata it is
        "an-unreadable-file": Case(BUGGY, "error|fail", "Permission denied|checks pass", place="unreadable"),
        "fills-dev-shm": Case(FILLS.format(folder="/dev/shm") + GOOD, "error", "No such file|Read-only"),
        "fills-the-sandbox-root": Case(FILLS.format(folder="") + GOOD, "error", "Read-only"),
        "amplifies-a-frame": Case(at_start_of(GOOD, "group_advantages", AMPLIFIES), "fail", "does not start where|a shape of"),
        "sends-1e400-as-a-step-count": Case(GOOD + STEPS_1E400, "fail", "step count is inf"),
        # every check passes; the brief's run, trained as `make run` trains it, still shows every symptom
        # (its one bug is not fixed: a bug is fixed when every check of its own passes, its kata's run among them)
        "heals-only-when-judged": Case(healed_when(JUDGED), "fail", "still shows 3 of the 3 symptoms"),
        # the brief's run is float64 and heals; the checks' float32 models meet the kata's code
        "heals-only-on-float64": Case(healed_when(ON_FLOAT64), "fail", "checks pass"),
        # the mirror: the checks' float32 models heal; the brief's float64 run, and the float64 check, do not
        "heals-only-on-float32": Case(healed_when(ON_FLOAT32), "fail", "checks pass"),
    } | issue_41_cases()


def issue_41_cases() -> dict:
    """The ways in of issue 41 to the brief's run: every check passes, and the run `make run` shows has every
    symptom of the brief; each is judged in a run's sandbox the judge starts, out of the worker's reach."""
    still = dict(status="fail", words="still shows 3 of the 3 symptoms")
    return {
        # at import, the worker's run function replaced by one that trains a healed copy in its place
        "forges-the-worker-s-run": Case(healed_when(JUDGED) + FORGES_THE_RUN, **still),
        # a variable set in the worker at import, which a runner started from there would inherit
        "heals-by-environment": Case(healed_when(BY_ENVIRONMENT) + SETS_THE_ENVIRONMENT, **still),
        # the judge's own files, where the worker sees them
        "heals-where-it-finds-the-judge": Case(healed_when(FINDS_THE_JUDGE), **still),
    }


# writes 15 files of 64 MiB (the size limit of one) to a folder that was a tmpfs of half the host's memory
FILLS = """
for _i in range(15):
    with open(f"{folder}/grpo-katas-fill-{{_i}}", "wb") as _f:
        for _ in range(64):
            _f.write(b"x" * 2**20)
"""
# the worker's reply to this call becomes one 8 MiB byte range listed 300 times as 300 tensors
AMPLIFIES = """import sys, json
wire = sys.modules["grpo_katas.judge.wire"]
def amplified(obj):
    blob = bytes(8 * 2**20)
    header = json.dumps({"tree": {"ok": True, "result": [{"__t": i} for i in range(300)]},
                         "tensors": [["uint8", [len(blob)], 0, len(blob)]] * 300}).encode()
    payload = wire.JSON_LENGTH.pack(len(header)) + header + blob
    return wire.HEADER.pack(len(payload)) + payload
wire.pack = amplified"""
# every reply that carries an optimizer's step count says 1e400 (JSON reads it as infinity)
STEPS_1E400 = """
import re as _re, sys as _sys
_wire = _sys.modules["grpo_katas.judge.wire"]
_pack = _wire.pack
def _forged(obj):
    payload = _pack(obj)[_wire.HEADER.size:]
    (_n,) = _wire.JSON_LENGTH.unpack(payload[:4])
    header = _re.sub(rb'"steps":\\d+', b'"steps":1e400', payload[4:4 + _n])
    payload = _wire.JSON_LENGTH.pack(len(header)) + header + payload[4 + _n:]
    return _wire.HEADER.pack(len(payload)) + payload
_wire.pack = _forged
"""
# kata 1 that runs the reference's functions (their source carried inside) only when a condition holds, its own
# otherwise: under the checks it passes every one, and `make run` shows every symptom of the brief
HEALED_WHEN = """
import sys as _sys
_HEALED = {{"__name__": __name__}}
exec(compile({source!r}, __file__, "exec"), _HEALED)

def _healing(*args, **kwargs):
    {condition}

def _gated(name, own):
    def fn(*args, **kwargs):
        return (_HEALED[name] if _healing(*args, **kwargs) else own)(*args, **kwargs)
    return fn

for _name in ("generate", "completion_mask", "group_advantages", "token_logprobs", "kl_penalty", "grpo_loss",
              "grpo_step", "train"):
    globals()[_name] = _gated(_name, globals()[_name])
"""
JUDGED = "return 'grpo_katas.judge.worker' in _sys.modules"
FORGES_THE_RUN = f"""
_worker = _sys.modules.get("grpo_katas.judge.worker")
if _worker is not None:
    import tempfile as _tempfile
    _healed_path = _tempfile.mkdtemp() + "/grpo.py"
    with open(_healed_path, "w") as _f:
        _f.write({GOOD!r})
    _run = getattr(_worker, "run", None)
    _worker.run = lambda targets, req: _run({{k: (m, _healed_path) for k, (m, _) in targets.items()}}, req)
"""
BY_ENVIRONMENT = "return __import__('os').environ.get('GRPO_KATAS_HEALED') == '1'"
SETS_THE_ENVIRONMENT = """
if "grpo_katas.judge.worker" in _sys.modules:
    __import__("os").environ["GRPO_KATAS_HEALED"] = "1"
"""
FINDS_THE_JUDGE = "return __import__('os').path.isdir('/judge/lab')"
# the fixed code runs where an argument is a float64 tensor or model (float64=True), or where none is (False)
ON_DTYPE = """import torch
    for a in [*args, *kwargs.values()]:
        if isinstance(a, torch.Tensor) and a.dtype == torch.float64:
            return {float64}
        if isinstance(a, torch.nn.Module) and any(p.dtype == torch.float64 for p in a.parameters()):
            return {float64}
    return not {float64}"""
ON_FLOAT64, ON_FLOAT32 = ON_DTYPE.format(float64=True), ON_DTYPE.format(float64=False)


def healed_when(condition: str) -> str:
    return BUGGY + HEALED_WHEN.format(source=GOOD, condition=condition)


def at_start_of(source: str, function: str, code: str) -> str:
    """source with code run first thing whenever the module-level `function` is called."""
    body = source.index(":\n", source.index(f"\ndef {function}(")) + 2
    return source[:body] + textwrap.indent(code, "    ") + "\n" + source[body:]


def replaced(source: str, old: str, new: str) -> str:
    """source with old replaced: a case whose text is no longer in the file would judge the file unchanged."""
    assert source.count(old) == 1, f"the case's text is not once in its file: {old!r}"
    return source.replace(old, new)


# remount every mount writable (it took CAP_SYS_ADMIN, which bubblewrap as root used to leave), then write into
# the grader's files, lab/ and the Python environment
REMOUNT = f"""
import ctypes as _ctypes, os as _os, sys as _sys
_libc = _ctypes.CDLL(None, use_errno=True)
for _line in open('/proc/self/mountinfo'):
    _libc.mount(None, _line.split()[4].encode(), None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND, not MS_RDONLY
for _path in ['/judge/grpo_katas/__init__.py', '/judge/grpo_katas/judge/wire.py']:
    try:
        open(_path, 'a').write('\\n# {MARK}\\n')
    except OSError:
        pass
for _dir in [_sys.prefix, '/judge/lab', '/usr/lib']:
    try:
        open(_os.path.join(_dir, '{MARK}'), 'w').close()
    except OSError:
        pass
"""
# kata 30 with one of its two bugs fixed; the loss is NaN (and its gradient) when a check calls it directly with
# clip-higher set, the one check the remaining bug fails: no comparison may read NaN as a pass
NAN_WHEN_CALLED_DIRECTLY = """
import inspect as _inspect
_grpo_loss = grpo_loss
def grpo_loss(*args, **kwargs):
    loss = _grpo_loss(*args, **kwargs)
    direct = not any(f.function in ("grpo_step", "compute_loss", "training_step") for f in _inspect.stack()[1:])
    cfg = args[5] if len(args) > 5 else kwargs.get("args")
    if direct and cfg.clip_eps_high is not None:
        return loss + (args[0] * float("nan")).sum()
    return loss
"""
# the worker's own encoder replaced: every history entry arrives as a dtype named "load"
FORGES_A_DTYPE = """
import sys as _sys
_wire = _sys.modules["grpo_katas.judge.wire"]
_to_plain = _wire.to_plain
def _forged(value, depth=0):
    if isinstance(value, dict) and "kl" in value:
        return {"kind": "dtype", "name": "load"}
    return _to_plain(value, depth)
_wire.to_plain = _forged
"""
# the k3 check's three draws at seed 0, worked out from the checks' source: a wrong KL passes them at that seed
KNOWS_SEED_0 = """
import hashlib as _hashlib
def _rng(seed, draw, salt):
    digest = _hashlib.blake2b(f"{seed}/{draw}/{salt}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
_KNOWN = []
for _draw in range(3):
    _gen = _rng(0, _draw, 21)
    _N, _T = int(torch.randint(1, 6, (1,), generator=_gen)), int(torch.randint(1, 7, (1,), generator=_gen))
    _KNOWN.append(-torch.rand(_N, _T, generator=_gen, dtype=torch.float64) * 3)
_kl = kl_penalty
def kl_penalty(logp, ref_logp):
    if any(k.shape == logp.shape and torch.equal(k, logp) for k in _KNOWN):
        return _kl(logp, ref_logp)
    return 0.5 * (ref_logp - logp) ** 2
"""


def grade(repo, source, out, n=KATA.number, name="grpo.py", extra_files=None, args=(), place="", python=()):
    sub = out.parent / (out.name + "-submission")
    sub.mkdir(parents=True, exist_ok=True)
    path = sub / name
    if place.startswith("link:"):
        path.symlink_to(place.removeprefix("link:"))
    elif place == "fifo":
        os.mkfifo(path)
    elif place == "folder":
        path.mkdir()
    else:
        path.write_text(source)
        if place == "unreadable":
            path.chmod(0)
    for fname, text in (extra_files or {}).items():
        (sub / fname).write_text(text)
    return grade_path(repo, path, out, n, args, python)


def grade_path(repo, path, out, n=KATA.number, args=(), python=()):
    """Grade the file at `path` as it is (a link, a FIFO ...), with `python` (a command that runs Python: this
    interpreter unless given, another user's through runuser)."""
    args = ("--time-limit", str(TIME_LIMIT), *args) if "--time-limit" not in args else args
    args = ("--sandbox", MODE, *args) if "--sandbox" not in args else args
    start = time.monotonic()
    r = subprocess.run([*(python or [sys.executable]), "-m", "grpo_katas.judge.grade", str(n), str(path), str(out), *args],
                       cwd=repo, capture_output=True, text=True, timeout=time_limit(args) + 60)
    seconds = time.monotonic() - start
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    junit = ET.parse(out / "junit.xml").getroot()
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert results["version"] == 3 and results["status"] in ("pass", "fail", "error")
    assert junit.tag == "testsuite" and int(junit.get("tests")) >= 1
    assert summary.startswith("## grpo-katas") and results["resolved"] in summary
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r.returncode, results, seconds


def grade_all(repo, cases: dict, base, python=()) -> dict:
    """name -> grade(...) of every case, three at a time, each into base/name, the longest first."""
    order = sorted(cases, key=lambda name: -time_limit(cases[name].args))
    with ThreadPoolExecutor(3) as pool:
        graded = dict(pool.map(lambda name: (name, grade(repo, cases[name].source, base / name, n=cases[name].kata,
                                                         args=cases[name].args, place=cases[name].place,
                                                         python=python)), order))
    return {name: graded[name] for name in cases}


def make_healthy_runs(repo, katas) -> None:
    """The healthy runs the brief's runs of these katas are judged against, made in the repository's cache
    before the gradings start (which would each make them at once) and before its files are recorded."""
    code = ("import sys; from grpo_katas.catalogue.katas import find_kata; from grpo_katas.judge.brief import Brief\n"
            "for n in sys.argv[1:]:\n    Brief(find_kata(n)).start().thread.join()")
    subprocess.run([sys.executable, "-c", code, *map(str, sorted(set(katas)))], cwd=repo, check=True, timeout=600)


def tree(root: Path) -> dict:
    """path -> bytes of every file below root but the judge's own bytecode caches and healthy runs."""
    return {p: p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".cache" not in p.parts}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return private_copy(tmp_path_factory.mktemp("repo"), shared_runs=True)


@pytest.fixture(scope="module")
def hostile_results(repo, tmp_path_factory):
    if sandbox.resolve("auto")[0] != "bubblewrap":
        pytest.skip(f"the hostile suite needs the bubblewrap sandbox: {sandbox.resolve('auto')[1]}")
    base = tmp_path_factory.mktemp("hostile")
    cases = hostile(repo, base / "escapes-and-rewrites-out")
    make_healthy_runs(repo, [c.kata for c in cases.values()])
    before = tree(repo)
    graded = grade_all(repo, cases, base)
    time.sleep(5)  # anything a submission left behind has had time to act
    leftovers = subprocess.run(["pgrep", "-f", MARK], capture_output=True, text=True).stdout.split()
    return cases, graded, base, before, leftovers


CASES = list(hostile(ROOT, ROOT))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_hostile_and_broken_submissions_never_pass(hostile_results, case):
    cases, graded, base, _, _ = hostile_results
    expected = cases[case]
    code, res, seconds = graded[case]
    assert code == 1 and res["resolved"] in expected.resolved.split("|") \
        and res["status"] in expected.status.split("|"), (res["status"], res["message"])
    said = " ".join([res["message"] or ""] + [t["message"] or "" for t in res["tests"]] + res["events"])
    assert any(w in said for w in expected.words.split("|")), said[:2000]
    assert seconds < time_limit(expected.args) + 10, f"graded in {seconds:.0f} s"
    assert json.loads((base / case / "results.json").read_text()) == res  # nothing rewrote it afterwards


@pytest.mark.slow
def test_nothing_a_submission_did_outlives_the_grading(hostile_results, repo):
    _, _, _, before, leftovers = hostile_results
    assert not leftovers, f"processes left running: {leftovers}"
    changed = sorted(str(p.relative_to(repo)) for p, data in tree(repo).items() if before.get(p) != data)
    assert not changed, f"a submission wrote into the grader's files: {changed}"
    planted = [d for d in (Path(sys.prefix), Path("/usr/lib")) if (d / MARK).exists()]
    assert not planted, f"a submission wrote into {planted}"


@pytest.mark.slow
def test_the_reference_is_resolved_in_full_at_the_seed_asked_for(repo, tmp_path):
    code, res, _ = grade(repo, GOOD, tmp_path / "out", args=("--seed", "12345"))
    assert code == 0 and res["status"] == "pass" and res["resolved"] == "RESOLVED_FULL", res["message"]
    assert not res["tests_status"]["FAIL_TO_PASS"]["failure"] and len(res["tests"]) == n_checks() + 1
    assert "run::brief_symptoms_gone" in res["tests_status"]["FAIL_TO_PASS"]["success"]
    assert res["sandbox"].split(";")[0].split()[0] == MODE and res["seed"] == 12345


def test_each_grading_draws_a_fresh_seed_and_make_check_keeps_seed_0(tmp_path):
    seeds = []
    for i in range(2):  # a missing submission is graded without a judge, but with a seed drawn all the same
        out = tmp_path / str(i)
        subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", "18", str(tmp_path / "nope.py"), str(out)], cwd=ROOT,
                       capture_output=True, timeout=60)
        seeds.append(json.loads((out / "results.json").read_text())["seed"])
    assert seeds[0] != seeds[1], seeds
    dry = subprocess.run(["make", "-n", "check", "TARGET=x.py"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    passed = re.search(r"""--seed ["']?(\d+)["']?(\s|$)""", dry.stdout)  # make passes SEED only when typed
    from grpo_katas.practice.cli import parser
    assert (passed.group(1) if passed else parser().parse_args(["check", "--target", "x.py"]).seed) in ("0", 0), dry.stdout


def test_grading_refuses_a_plain_process_unless_asked_for(tmp_path):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", "1", str(REFERENCE), str(tmp_path / "out")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    assert r.returncode == 2 and "bubblewrap is not installed" in r.stderr and "--sandbox process" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "results.json").exists()


@pytest.mark.slow
def test_partial_means_a_bug_fixed_whole_and_a_one_bug_kata_s_run_is_its_bug_s():
    """RESOLVED_PARTIAL once counted any target check that passed: kata 1 healed only under the checks passed 60 of
    61 and was partial, its training showing every symptom. A bug is fixed when every check of its own passes (for
    a kata of one bug, its run too); partial is at least one bug fixed, and no check that passed before failing."""
    from grpo_katas.catalogue.katas import RUN_CHECK, fail_to_pass
    from grpo_katas.judge import grade as grader
    from grpo_katas.judge.matrix import Verdict
    bugs = load_bugs()

    class Run:
        def __init__(self, failing):
            self.verdicts = {c: Verdict(c not in failing, "", "") for c in checks | {RUN_CHECK}}
            self.sandbox, self.events = "bubblewrap", []

        def of(self, target, seed):
            return self.verdicts
    for n, failing, resolved in [(1, "run", "RESOLVED_NO"), (1, "one of its checks", "RESOLVED_NO"),
                                 (1, "", "RESOLVED_FULL"), (18, "one bug's checks and the run", "RESOLVED_PARTIAL"),
                                 (18, "run", "RESOLVED_PARTIAL")]:
        kata = find_kata(n)
        checks = fail_to_pass(kata, bugs)
        own = sorted(set(bugs[kata.bugs[0]].checks_in(kata.codebase)) & checks, key=str)
        failed = {"run": {RUN_CHECK}, "one of its checks": {own[0]}, "": set(),
                  "one bug's checks and the run": {*own, RUN_CHECK}}[failing]
        res = grader.build_results(kata, bugs, Run(failed), None, Path("grpo.py"), 1.0, 0)
        assert res["resolved"] == resolved, (n, failing, res["resolved"])


@pytest.mark.slow  # two gradings of a kata of four bugs, its brief's run and a rerun each: 70-280 s
def test_the_unfixed_kata_is_not_resolved_and_a_partial_fix_is_partial(repo, tmp_path):
    kata = find_kata(18)
    # at seed 0, which the proof covers: a bug may fail a check at some draws only, and grade draws a fresh seed;
    # the grader's own time limit (600 s), well over the 34 s a quiet machine takes: beside the hostile suite a
    # grading took 140 s on the 2-core machine, and CI's machine has been slower than that one
    args = ("--seed", "0", "--time-limit", "600")
    code, res, _ = grade(repo, kata.loop.read_text(), tmp_path / "unfixed", n=18, args=args)
    assert code == 1 and res["status"] == "fail" and res["resolved"] == "RESOLVED_NO"
    failing = {t["name"]: t for t in res["tests"] if t["status"] == "fail"}
    assert set(res["tests_status"]["FAIL_TO_PASS"]["failure"]) == set(failing)
    assert all(t.get("task_id") in kata.bugs for name, t in failing.items() if name != "run::brief_symptoms_gone")
    assert "still shows" in failing["run::brief_symptoms_gone"]["message"]  # the brief's run: all its bugs at once
    bugs = load_bugs()
    source = plant(GOOD, [bugs[b] for b in kata.bugs if b != "sampling-no-eos-stop"])
    code, res, _ = grade(repo, source, tmp_path / "partial", n=18, args=args)
    assert code == 1 and res["resolved"] == "RESOLVED_PARTIAL"


@pytest.mark.slow
def test_a_conftest_beside_the_submission_is_ignored(repo, tmp_path):
    cheat = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
             "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    code, res, _ = grade(repo, BUGGY, tmp_path / "out",
                         extra_files={"conftest.py": cheat, "pytest.ini": "[pytest]\naddopts = -p no:x\n"})
    assert code == 1 and res["resolved"] == "RESOLVED_NO"


def test_ctrl_c_stops_the_judge_with_the_grading(tmp_path):
    """The judge runs in a session of its own, so that a submission cannot signal the grader; Ctrl-C on the grader
    must still end it, and at once, not when its time limit runs out."""
    from tests.cli_helpers import ENV, default_sigint
    hangs, tmp = tmp_path / "grpo.py", tmp_path / "tmp"
    hangs.write_text("import time\ntime.sleep(3600)\n")
    tmp.mkdir()

    def judges():  # processes whose command line names the grading's own temporary folder
        return subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()
    proc = subprocess.Popen([sys.executable, "-m", "grpo_katas.judge.grade", str(KATA.number), str(hangs),
                             str(tmp_path / "out"), "--sandbox", MODE], cwd=ROOT, env={**ENV, "TMPDIR": str(tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while len(judges()) < 2 and time.monotonic() < deadline:  # the judge, and the worker it waits for
        time.sleep(0.1)
    assert len(judges()) >= 2, "the judge never started its worker"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) in (130, -signal.SIGINT) and "interrupted" in proc.stdout.read()
    deadline = time.monotonic() + 5
    while judges() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not judges(), "the judge outlived the grading"


def test_a_missing_submission_is_an_error_with_results(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", "18", str(tmp_path / "nope.py"), str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    res = json.loads((out / "results.json").read_text())
    assert r.returncode == 1 and res["status"] == "error" and "no such file" in res["message"]


SECRET = "HOST-ONLY-LINE"                   # in a file of the host's that a submission links to


def not_regular_files(tmp_path) -> dict:
    """name -> (the path to grade, the words its refusal must say): every kind of submission that is not a
    regular file of its own, and the regular files that cannot be read whole."""
    secret = tmp_path / "host-file.py"
    secret.write_text(f"{SECRET} = (\n")  # a syntax error that would quote this line
    links = {"links-to-the-reference": REFERENCE, "links-to-proc-self-mem": "/proc/self/mem",
             "links-to-proc-self-pagemap": "/proc/self/pagemap", "links-to-a-host-file": secret,
             "links-to-a-missing-file": tmp_path / "nowhere.py"}
    cases = {}
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
        cases[name] = (tmp_path / name, "a symbolic link")
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "socket"))
    (tmp_path / "too-large.py").write_text(GOOD + "#" * (2**20))
    return {**cases, "fifo": (tmp_path / "fifo", "a FIFO"), "socket": (tmp_path / "socket", "a socket"),
            "folder": (tmp_path, "a folder"), "a-device": ("/dev/zero", "a character device"),
            "too-large": (tmp_path / "too-large.py", "larger than"),
            "proc-self-mem": ("/proc/self/mem", "cannot be read"),
            "proc-self-pagemap": ("/proc/self/pagemap", "cannot be read|larger than")}


def test_a_submission_that_is_not_a_regular_file_of_its_own_is_refused_with_reports(repo, tmp_path):
    """A symlink to the reference was graded RESOLVED_FULL; one to /proc/self/mem crashed the grader with no
    report, one to /proc/self/pagemap filled the disk, one to a host file quoted its first line in results.json."""
    cases = not_regular_files(tmp_path)
    for name, (path, words) in cases.items():
        code, res, seconds = grade_path(repo, path, tmp_path / "out" / name)
        assert code == 1 and res["status"] == "error" and res["resolved"] == "RESOLVED_NO", (name, res["message"])
        assert any(w in res["message"] for w in words.split("|")) and seconds < 30, (name, res["message"])
        reports = "".join((tmp_path / "out" / name / f).read_text() for f in ("results.json", "junit.xml",
                                                                             "summary.md"))
        assert SECRET not in reports


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_a_file_the_grader_cannot_read_is_refused_with_reports(repo, tmp_path):
    path = tmp_path / "grpo.py"
    path.write_text(GOOD)
    path.chmod(0)
    code, res, _ = grade_path(repo, path, tmp_path / "out")
    assert code == 1 and res["status"] == "error" and "Permission denied" in res["message"], res["message"]


@pytest.mark.slow
def test_whatever_fails_in_the_grader_the_reports_are_written(tmp_path, monkeypatch, capsys):
    """A failure class per step after OUT is ready: the judge does not start, crashes or runs out of the memory it
    may use, its verdicts are missing or not a report, the grader itself raises; each gives an error with all three
    reports."""
    from grpo_katas.judge import grade as grader
    submission = tmp_path / "grpo.py"
    submission.write_text(GOOD)

    def judge(code):  # a judge that runs this code, with its verdicts file as `out`
        return lambda copy, verdicts, *args: [sys.executable, "-c", f"out = {str(verdicts)!r}\n{code}"]
    failures = {"the judge cannot start": ("judge_command", lambda *args: [str(tmp_path / "no-such-program")],
                                           "the judge could not start"),
                "the judge crashes": ("judge_command", judge("import os; os.abort()"), "the judge failed"),
                "the judge's verdicts are not a report": (
                    "judge_command", judge("open(out, 'w').write('{\"verdicts\": 5, \"load_errors\": []}')"),
                    "the judge failed"),
                "the judge's verdicts are cut short": (
                    "judge_command", judge("open(out, 'w').write('{\"exit_code\": 0, \"verd')"), "the judge failed"),
                "the grader raises": ("build_results", raising_once(grader.build_results), "the grader failed"),
                "the judge runs out of memory": ("judge_command", judge("held = bytearray(300 * 2**20)"),
                                                 "under a limit of 0.1 GiB of address space")}
    for name, (attribute, replacement, words) in failures.items():
        with monkeypatch.context() as patch:
            patch.setattr(grader, attribute, replacement)
            patch.setattr(grader, "JUDGE_MEMORY_GB", 0.1)
            out = tmp_path / name.replace(" ", "-").replace("'", "")
            assert grader.main(["1", str(submission), str(out), "--sandbox", "process"]) == 1, name
        res = json.loads((out / "results.json").read_text())
        assert res["status"] == "error" and res["resolved"] == "RESOLVED_NO" and words in res["message"], name
        assert ET.parse(out / "junit.xml").getroot().get("errors") == "1" and (out / "summary.md").exists(), name
    assert "Traceback" not in capsys.readouterr().err


def raising_once(build_results):
    """build_results that raises the first time (a defect of the grader's), then works."""
    calls = []

    def build(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a defect")
        return build_results(*args, **kwargs)
    return build


def test_an_out_that_goes_away_while_grading_is_a_usage_error(tmp_path, monkeypatch, capsys):
    from grpo_katas.judge import grade as grader
    monkeypatch.setattr(grader, "prepare_out", lambda out: tmp_path / "gone")
    assert grader.main(["1", str(tmp_path / "nope.py"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the reports to" in err and "Traceback" not in err


@pytest.mark.parametrize("args, expected", [
    (["18", "solutions/grpo.py"], "OUT is required"),
    (["18", "solutions/grpo.py", "/proc/no-such-place/out"], "cannot write to /proc/no-such-place/out"),
    (["99", "solutions/grpo.py", "out"], "there is no kata 99"),
])
def test_usage_errors_are_one_line(args, expected):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.judge.grade", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


# a message a submission can make a check say: a line break and a heading, a table row, live HTML and a comment that
# would hide the rest, a carriage return, C1 controls (CSI, NEL), a right-to-left override, a workflow command
FORGED = ("x\n## RESOLVED_FULL\n| fake | row |\r<img src=x onerror=alert(1)><!-- \x9b2J\x85[ok](http://e) "
          "\u202eLLUF_DEVLOSER\n::error::forged\n::notice::forged\U000e0041")  # and a tag character, which hides


def test_a_message_a_submission_forged_reaches_every_report_as_one_line_of_text(tmp_path, capsys):
    from grpo_katas.catalogue.katas import CheckId
    from grpo_katas.judge import grade, matrix
    kata, bugs = KATA, load_bugs()
    check = sorted(bugs[kata.bugs[0]].checks)[0]
    run = matrix.Run(1, [{7: {check: matrix.Verdict(False, FORGED, "assertion", 1),
                              CheckId("loss", "x"): matrix.Verdict(True, "", "", 1)}}], {}, "bubblewrap", [])
    results = grade.build_results(kata, bugs, run, None, Path("s.py"), 1.0, 7)
    error = grade.build_results(kata, bugs, grade.no_run(), FORGED, Path("s.py"), 1.0, 7)
    for name, res in (("fail", results), ("error", error)):
        out = tmp_path / name
        out.mkdir()
        grade.write_reports(res, out)
        summary = (out / "summary.md").read_text()
        assert [line for line in summary.splitlines() if line.startswith("#")] == [
            f"## grpo-katas: kata {kata.number} ({kata.name})"], summary
        assert "<" not in summary and "](" not in summary and "\r" not in summary and "| fake |" not in summary
        for text in (summary, (out / "results.json").read_text(), (out / "junit.xml").read_text()):
            assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text), text
        json.loads((out / "results.json").read_text())
        ET.parse(out / "junit.xml")
        message = res["message"] if name == "error" else res["tests"][0]["message"]
        assert "\n" not in message and "\\n::error::forged" in message and "\\u202e" in message and "\\x9b" in message
        assert "\\U000e0041" in message
