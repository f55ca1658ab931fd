"""The call server: it holds the implementations under test and answers contract calls from the judge.

It runs inside the sandbox with nothing but the Python environment, lab/, this package's wire, stand-ins and
this file, and the target files; it talks to the judge over one socket (file descriptor FD) and nothing else:

    python -I -c "import sys; sys.path.insert(0, ROOT); from grpo_katas.judge.worker import main; main(FD)"

Requests and replies (see wire.py for the framing):
    {"op": "load", "key": k, "path": p, "stand_down": [(fn, why), ...]}
                                                -> {"ok": True} or {"ok": False, "error": {...}}
    {"op": "call", "key": k, "fn": name, "args": [...], "kwargs": [(name, value), ...],
     "grad_wrt": [i, ...], "rng": state, "grad_mode": bool}
                                                -> {"ok": True, "result": ..., "grads": [...], "updates": {...},
                                                    "rng": state} or {"ok": False, "error": {...}}
    {"op": "distributed", "key": k, "fn": name, "ranks": [{"args": [...], "kwargs": [...]}, ...], "wrap": "ddp",
     "record": bool, "rng": state, "grad_mode": bool}
                                                -> {"ok": True, "ranks": [one call reply per rank]}
    {"op": "bye"}

Arguments arrive as tagged dicts and are built into real objects here: tensors, lab models and stand-ins from
their config and state, optimizers over a model's parameters, generators from their state, the target's own
GRPOConfig and Rollout, lab tasks. After a call the worker sends back what the call changed (model state and
gradients, optimizer state and step count, generator state, the global RNG), so the judge's objects end up as
they would have if the call had run in its own process. A function that hung or crashed an earlier worker is
stood down at load: replaced by one that raises at once, so the target's own callers of it fail fast too.

The brief's run is not made here: the judge starts it in a run's sandbox of its own (judge/brief.py), out of reach
of whatever a file does in this process. Nothing in this file is trusted by the judge: it only ever receives data
and compares it.
"""
import datetime
import importlib.util
import os
import select
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist

from grpo_katas.judge import standins, wire

OPTIMIZERS = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}
RANK_TIMEOUT_S = 20   # a collective waits this long for a peer before it raises


class NotRunAgain(Exception):
    """Raised in place of a function that hung or crashed the worker earlier in this run."""


def stand_down(module, fn: str, why: str) -> None:
    """Replace fn in the module with one that fails at once, so callers inside the target fail fast too."""
    def fail(*args, **kwargs):
        raise NotRunAgain(f"{fn} is not run again: earlier, {why}")
    setattr(module, fn, fail)


def load(key: str, path: str):
    name = f"grpo_target_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ImportError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class Call:
    """One call's arguments built from the wire, and what the call changed, ready to send back."""

    def __init__(self, target):
        self.target = target
        self.objects = {}       # ref -> (kind, object, extra)

    def build(self, value):
        if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
            return value
        kind = value["kind"]
        if kind == "tensor":
            return wire.tensor_from_plain(value)
        if kind in ("list", "tuple"):
            items = [self.build(v) for v in value["items"]]
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            return {self.build(k): self.build(v) for k, v in value["items"]}
        if kind == "dtype":
            return wire.dtype(value["name"])
        ref = value.get("ref")
        if ref is not None and ref in self.objects:
            return self.objects[ref][1]
        obj, extra = getattr(self, "build_" + kind)(value)
        if ref is not None:
            self.objects[ref] = (kind, obj, extra)
        return obj

    def build_module(self, v):
        if v["class"] == "TinyLM":
            from lab import ModelConfig, TinyLM
            model = TinyLM(ModelConfig(**dict(v["config"]))).to(wire.dtype(v.get("dtype", "float32")))
        else:
            model = standins.StandIn(v["rule"], **{k: self.build(x) for k, x in v["params"]})
        model.load_state_dict({k: wire.tensor_from_plain(t).detach() for k, t in v["state"]})
        for name, p in model.named_parameters():
            p.requires_grad_(bool(dict(v["requires_grad"]).get(name, True)))
        grads = dict(v["grads"])
        for name, p in model.named_parameters():
            if name in grads:
                p.grad = wire.tensor_from_plain(grads[name]).detach()
        model.train(bool(v["training"]))
        return model, None

    def build_optimizer(self, v):
        model = self.build(v["module"])
        opt = OPTIMIZERS[v["class"]](model.parameters(), **dict(v["hyper"]))
        if v.get("state") is not None:
            opt.load_state_dict(v["state"])
        steps = [0]
        opt.register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
        return opt, steps

    def build_generator(self, v):
        gen = torch.Generator(device=v.get("device", "cpu"))
        gen.set_state(v["state"])
        return gen, None

    def build_config(self, v):
        return self.target.GRPOConfig(**{k: self.build(x) for k, x in v["overrides"]}), None

    def build_rollout(self, v):
        return self.target.Rollout(**{k: self.build(x) for k, x in v["fields"]}), None

    def build_task(self, v):
        from lab.tasks import TASKS
        return TASKS[v["name"]](**{k: self.build(x) for k, x in v["kwargs"]}), None

    def updates(self) -> dict:
        out = {}
        for ref, (kind, obj, extra) in self.objects.items():
            if kind == "module":
                params = dict(obj.named_parameters())
                out[ref] = {"state": [(k, wire.tensor_to_plain(t)) for k, t in obj.state_dict().items()],
                            "grads": [(k, wire.tensor_to_plain(p.grad)) for k, p in params.items()
                                      if p.grad is not None],
                            "requires_grad": [(k, p.requires_grad) for k, p in params.items()]}
                if isinstance(obj, standins.StandIn):
                    out[ref]["records"] = {"calls": obj.calls, "grad_enabled": list(obj.grad_enabled)}
            elif kind == "optimizer":
                out[ref] = {"state": obj.state_dict(), "steps": extra[0]}
            elif kind == "generator":
                out[ref] = {"state": obj.get_state()}
        return out


def error(exc: BaseException, path: str | None) -> dict:
    """What the judge shows for an exception: type, message, and the deepest line of the target file."""
    where, code = None, None
    if isinstance(exc, SyntaxError) and exc.filename == path:
        where, code = f"{exc.filename}:{exc.lineno}", (exc.text or "").strip()
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path and f.filename == path]
    if where is None and mine:
        where, code = f"{mine[-1].filename}:{mine[-1].lineno}", (mine[-1].line or "").strip()
    try:
        message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    except Exception:
        message = "<unprintable message>"
    if isinstance(exc, SystemExit):
        message = f"SystemExit({exc.code!r})"
    return {"type": type(exc).__name__, "message": message[:2000], "where": where, "code": (code or "")[:300]}


def call(targets: dict, req: dict, wrap: str | None = None, record: bool = False) -> dict:
    """Run one contract call. wrap="ddp": the first argument (the policy) is wrapped in DistributedDataParallel
    (a rank of a distributed call). record: the task argument records, at every step, the policy's parameters
    before the step and the rollout and rewards of the step (what a training run did, for the judge to replay)."""
    module, path = targets[req["key"]]
    fn = getattr(module, req["fn"], None)
    if fn is None:
        return {"ok": False, "error": {"type": "AttributeError", "message": f"the file defines no {req['fn']!r}",
                                       "where": None, "code": ""}}
    c = Call(module)
    try:
        args = [c.build(a) for a in req["args"]]
        kwargs = {k: c.build(v) for k, v in req["kwargs"]}
        wrt = list(req.get("grad_wrt") or [])
        for i in wrt:
            args[i] = args[i].detach().clone().requires_grad_(True)
        recorder = None
        if record:
            i = next(i for i, a in enumerate(args) if hasattr(a, "sample_prompts"))
            args[i] = recorder = RecordingTask(args[i], args[0])
        if wrap == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            args[0] = DistributedDataParallel(args[0])
        torch.set_rng_state(req["rng"])
        with torch.set_grad_enabled(bool(req.get("grad_mode", True))):
            result = fn(*args, **kwargs)
            grads = None
            if wrt:
                grads = [None] * len(wrt)
                if isinstance(result, torch.Tensor) and result.grad_fn is not None and result.numel() == 1:
                    got = torch.autograd.grad(result, [args[i] for i in wrt], allow_unused=True)
                    grads = [None if g is None else wire.tensor_to_plain(g) for g in got]
        return {"ok": True, "result": wire.to_plain(result), "grads": grads, "updates": c.updates(),
                "rng": torch.get_rng_state(), "records": wire.to_plain(recorder.steps) if recorder else None}
    except BaseException as exc:  # the target's code can raise anything; it is the target's answer
        return {"ok": False, "error": error(exc, path)}


class RecordingTask:
    """A lab task that notes what a training run does with it: before each step (when prompts are drawn) the
    policy's parameters, then the step's rollout and rewards (when it is scored)."""

    def __init__(self, task, policy):
        self.task, self.policy, self.steps = task, policy, []
        self.name, self.eos_id, self.pad_id = task.name, task.eos_id, task.pad_id

    def sample_prompts(self, batch_size, generator=None):
        self.steps.append({"params": {k: v.detach().clone() for k, v in self.policy.state_dict().items()}})
        return self.task.sample_prompts(batch_size, generator)

    def reward(self, rollout):
        rewards = self.task.reward(rollout)
        if self.steps:
            fields = ("input_ids", "attention_mask", "completion_mask", "prompt_len")
            self.steps[-1].update({f: getattr(rollout, f) for f in fields})
            self.steps[-1]["rewards"] = rewards.detach().clone()
        return rewards


class RankPool:
    """`world` processes forked from this one, each a rank of one gloo process group (on loopback, inside the
    sandbox), kept for later distributed calls: forking and joining a group is paid once, not per call."""

    def __init__(self, world: int, targets: dict, judge):
        self.world, self.ranks = world, []
        store = f"/tmp/grpo-pg-{os.getpid()}-{time.monotonic_ns()}"
        for rank in range(world):
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # the rank
                ours.close()
                judge.close()
                os.environ["GLOO_SOCKET_IFNAME"] = "lo"
                try:
                    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
                    while True:
                        req = wire.recv_blocking(theirs)
                        wire.send(theirs, call(targets, req, wrap=req.get("wrap"), record=req.get("record", False)))
                except BaseException:
                    pass
                os._exit(0)
            theirs.close()
            self.ranks.append((pid, ours))

    def run(self, requests: list) -> list:
        """Each rank's reply; a rank that does not answer (its peer failed inside a collective) gets an error."""
        for (_, sock), req in zip(self.ranks, requests):
            wire.send(sock, req)
        replies = [None] * self.world
        pending = {sock.fileno(): i for i, (_, sock) in enumerate(self.ranks)}
        deadline = None
        while pending:
            ready, _, _ = select.select(list(pending), [], [], 1.0)
            for fd in ready:
                i = pending.pop(fd)
                try:
                    replies[i] = wire.recv_blocking(self.ranks[i][1])
                except (EOFError, OSError, wire.ProtocolError) as exc:
                    replies[i] = {"ok": False, "error": {"type": "RankDied", "message": f"rank {i} ended: {exc}",
                                                         "where": None, "code": ""}}
                if not replies[i].get("ok") and deadline is None:
                    deadline = time.monotonic() + RANK_TIMEOUT_S  # its peers may be waiting in a collective
            if deadline is not None and time.monotonic() > deadline:
                for i in pending.values():
                    replies[i] = {"ok": False, "error": {"type": "RankStuck", "message": f"rank {i} did not finish "
                                  f"after another rank failed (waiting in a collective?)", "where": None, "code": ""}}
                break
        return replies

    def close(self) -> None:
        for pid, sock in self.ranks:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
            sock.close()


def distributed(targets: dict, pools: dict, req: dict, judge) -> dict:
    """One contract call on `world` ranks at once: rank r gets its own arguments, req["ranks"][r]."""
    world = len(req["ranks"])
    if world not in pools:
        for pool in pools.values():
            pool.close()
        pools.clear()
        pools[world] = RankPool(world, targets, judge)
    common = {k: req[k] for k in ("key", "fn", "rng", "grad_mode", "wrap", "record") if k in req}
    replies = pools[world].run([{**common, **r, "grad_wrt": []} for r in req["ranks"]])
    if not all(r.get("ok") for r in replies):
        pools.pop(world).close()  # a group that saw a failure is not trusted with the next call
    return {"ok": True, "ranks": replies}


def serve(sock) -> None:
    targets, pools = {}, {}
    while True:
        try:
            req = wire.recv_blocking(sock)
        except EOFError:
            return
        op = req.get("op")
        if op == "load":
            try:
                module = load(req["key"], req["path"])
                for fn, why in req.get("stand_down", []):
                    stand_down(module, fn, why)
                targets[req["key"]] = (module, req["path"])
                reply = {"ok": True, "key": req["key"]}
            except BaseException as exc:
                reply = {"ok": False, "key": req["key"], "error": error(exc, req["path"])}
        elif op == "call":
            reply = call(targets, req)
        elif op == "distributed":
            reply = distributed(targets, pools, req, sock)
        elif op == "bye":
            return
        else:
            reply = {"ok": False, "error": {"type": "ProtocolError", "message": f"unknown op {op!r}",
                                            "where": None, "code": ""}}
        try:
            wire.send(sock, reply)
        except Exception as exc:  # a result torch.save cannot write (an exotic tensor): say so instead
            wire.send(sock, {"ok": False, "error": {"type": type(exc).__name__, "message":
                             f"the result cannot be sent back: {str(exc)[:500]}", "where": None, "code": ""}})


def warm_up() -> None:
    """Import what every call needs before the first request, while the judge is still collecting its checks:
    the lab and the optimizer machinery (torch imports its compiler stack on the first optimizer)."""
    importlib.import_module("lab")
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.zeros(1)
    torch.optim.SGD([p], lr=0.0).step()


def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    warm_up()
    wire.send(sock, {"ok": True, "op": "hello", "pid": os.getpid(), "torch": str(torch.__version__)})
    serve(sock)
    os._exit(0)  # do not wait for threads the targets may have left running
