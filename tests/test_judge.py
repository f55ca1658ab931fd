"""The judge's parts: the wire refuses malformed data, the sandbox hides what it should, a correct target never
fails from load alone, and the plain-process fallback gives the same verdicts. Run: pytest tests/test_judge.py"""
import json
import socket
import subprocess
import sys
import time

import pytest
import torch

from grpo_katas import ROOT
from grpo_katas.catalogue import fail_to_pass, find_kata, load_bugs
from grpo_katas.judge import sandbox, wire
from grpo_katas.judge.client import CallFailed, Target, Worker

BWRAP = sandbox.resolve("auto")[0] == "bubblewrap"

PROBE = '''
import os, socket, torch

def group_advantages(rewards, group_size, eps):
    """What the worker can see and do, as flags: 1.0 = yes."""
    seen = [os.path.exists(p) for p in PATHS]
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
        reached = True
    except OSError:
        reached = False
    try:
        open(__file__, "a").close()
        wrote = True
    except OSError:
        wrote = False
    return torch.tensor([float(x) for x in seen + [reached, wrote]])
'''


def test_malformed_data_from_a_worker_is_a_protocol_error():
    for bad in [b"not a torch file", b"\x80\x02c__builtin__\neval\n.", wire.pack({"kind": "tensor"})[9:]]:
        with pytest.raises(wire.ProtocolError):
            wire.unpack(bad)
    for value in [{"kind": "tensor", "data": 3}, {"kind": "dict", "items": 5}, {"kind": "surprise"}, [1, 2],
                  {"kind": "list", "items": [{"kind": "object"}]}]:
        with pytest.raises(wire.ProtocolError):
            wire.from_plain(value)
    with pytest.raises(wire.ProtocolError):
        wire.frame_length(wire.HEADER.pack(wire.MAX_FRAME + 1))
    t = torch.arange(6.0).view(2, 3).requires_grad_()
    back = wire.from_plain(wire.to_plain({"x": [t * 2, (1, "a")], "n": None}))
    assert torch.equal(back["x"][0], (t * 2).detach()) and back["x"][0].requires_grad and back["x"][1] == (1, "a")


@pytest.mark.skipif(not BWRAP, reason="bubblewrap cannot run here")
def test_the_sandboxed_worker_sees_no_repository_no_network_and_cannot_write(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    paths = [str(ROOT / "checks"), str(ROOT / "solutions" / "grpo.py"), str(ROOT / "katas"), str(tmp_path),
             str(ROOT / "lab")]
    probe = tmp_path / "probe.py"
    probe.write_text(f"PATHS = {paths!r}\nPORT = {server.getsockname()[1]}\n" + PROBE)
    w = Worker({"p": probe})
    try:
        flags = Target(w, "p", probe).group_advantages(torch.zeros(2), 2, 0.0).tolist()
    finally:
        w.close()
        server.close()
    assert flags == [0.0] * 7, dict(zip(paths + ["network", "write"], flags))


def test_a_python_or_checkout_under_tmp_is_not_hidden_by_the_sandbox_s_empty_tmp(monkeypatch):
    """bwrap mounts in order: the empty /tmp must come before every bind beneath it (a repository cloned to /tmp,
    its .venv there too, once made every worker fail to start)."""
    monkeypatch.setattr(sys, "prefix", "/tmp/clone/.venv")
    args = sandbox.command("bubblewrap", {"t": "/tmp/clone/work/grpo.py"}, 3, sandbox.Limits())
    binds = [args[i + 2] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")]
    assert "/tmp/clone/.venv" in binds
    tmpfs = args.index("--tmpfs")
    assert args[tmpfs + 1] == "/tmp" and all(
        args.index(dest) > tmpfs for dest in binds if dest.startswith("/tmp")), args


def test_without_a_sandbox_the_same_worker_can_see_out(tmp_path):
    """The fallback is honest about what it is: a plain process sees the repository (README: threat model)."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"PATHS = {[str(ROOT / 'checks')]!r}\nPORT = 9\n" + PROBE)
    w = Worker({"p": probe}, sandbox_mode="process")
    try:
        assert Target(w, "p", probe).group_advantages(torch.zeros(2), 2, 0.0)[0] == 1.0
    finally:
        w.close()


def test_a_hang_is_one_budget_and_later_calls_fail_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr("grpo_katas.judge.client.DEFAULT_CALL_CPU_S", 1.0)
    target = tmp_path / "grpo.py"
    target.write_text("def kl_penalty(a, b):\n    while True:\n        pass\n\n"
                      "def grpo_loss(logp, old, ref, adv, mask, cfg):\n    return kl_penalty(logp, ref).sum()\n")
    w = Worker({"t": target})
    g = Target(w, "t", target)
    try:
        with pytest.raises(CallFailed, match="kl_penalty did not return"):
            g.kl_penalty(torch.zeros(2), torch.zeros(2))
        start = time.monotonic()
        with pytest.raises(CallFailed, match="kl_penalty did not return"):
            g.kl_penalty(torch.zeros(2), torch.zeros(2))
        with pytest.raises(CallFailed, match="kl_penalty is not run again"):  # the target's own caller, too
            g.grpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.ones(2), None)
        assert time.monotonic() - start < 15  # a restart, no second budget
    finally:
        w.close()
    assert len(w.events) == 1


@pytest.mark.slow
def test_a_correct_target_never_fails_from_load_alone():
    """Two check runs side by side while two processes burn both cores: budgets are CPU time, not wall time."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        runs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "checks"],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for _ in range(2)]
        outs = [r.communicate(timeout=600)[0] for r in runs]
    finally:
        for h in hogs:
            h.kill()
    assert all(r.returncode == 0 for r in runs), "\n".join(o[-2000:] for o in outs)


def failing(tmp_path, mode, target) -> dict:
    out = tmp_path / f"{mode}.json"
    subprocess.run([sys.executable, "-m", "grpo_katas.matrix", "--sandbox", mode, "--out", str(out), str(target)],
                   cwd=ROOT, capture_output=True, timeout=300)
    data = json.loads(out.read_text())
    return data["sandbox"], sorted(c for c, v in data["verdicts"][0]["0"].items() if not v["passed"])


@pytest.mark.slow
@pytest.mark.skipif(not BWRAP, reason="bubblewrap cannot run here")
def test_the_plain_process_fallback_gives_the_same_verdicts(tmp_path):
    kata = find_kata(18)
    target = kata.loop
    (mode_a, in_sandbox), (mode_b, in_process) = failing(tmp_path, "auto", target), failing(tmp_path, "process", target)
    assert mode_a == "bubblewrap" and mode_b.startswith("process")
    assert in_sandbox == in_process == sorted(str(c) for c in fail_to_pass(kata, load_bugs()))
