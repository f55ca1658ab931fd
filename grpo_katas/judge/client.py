"""The judge's side of the wire: a worker process serving the targets, and the `Target` the checks call.

A check calls `grpo.group_advantages(rewards, 4, 1e-4)` as if the implementation were imported; the call is
encoded, sent to the worker, run there, and its result comes back as data. Every comparison happens here.

Budgets, not wall-clock timeouts: a call fails as hung when the worker's process tree has used more CPU time
than the call's budget, or has used none at all for IDLE_S seconds (blocked: a sleep, a lock, a read). Both
are independent of how busy the machine is, so a correct implementation never fails from load alone. After a
hang or a crash the worker is killed with everything it started and a fresh one is started on the next call.
Later calls of the function that hung or crashed fail at once, naming what happened, and the fresh worker
stands that function down inside the target too (it raises at once), so the target's own functions that call
it fail fast instead of hanging again: a hang costs one budget, not one per check. A deadline, when given,
bounds the whole run.
"""
import select
import signal
import tempfile
import time
from pathlib import Path

import torch

from grpo_katas import children_cpu
from grpo_katas.judge import contract, sandbox, wire
from grpo_katas.judge.standins import StandIn

CALL_CPU_S = {"train": 30.0}     # CPU-seconds a call may use: the reference needs under 0.5 s for train
DEFAULT_CALL_CPU_S = 10.0       # and well under 0.1 s for every other call
IDLE_S = 10.0                    # seconds with no CPU used at all before a call counts as blocked
START_CPU_S, START_IDLE_S = 120.0, 60.0   # starting the worker: importing torch, cold disks included
MAX_COUNT = 10**6                # a count a reply carries (optimizer steps, stand-in calls): more is malformed
LOAD_CPU_S, LOAD_IDLE_S = 20.0, 20.0      # importing one target


class CallFailed(Exception):
    """A contract call that did not give an answer: it raised, hung, crashed the worker, or broke the protocol."""


class Hang(Exception):
    pass


class Died(Exception):
    pass


class Worker:
    """One worker process (sandboxed unless told otherwise) serving a set of targets, restarted when needed."""

    def __init__(self, targets: dict, *, sandbox_mode: str = "auto", limits: sandbox.Limits = sandbox.Limits(),
                 deadline: float | None = None, spawned: sandbox.Spawned | None = None):
        self.targets = {k: Path(p) for k, p in targets.items()}      # key -> path on this machine
        self.mode, self.why = (spawned.mode, spawned.why) if spawned else sandbox.resolve(sandbox_mode)
        self.limits, self.deadline = limits, deadline
        self.inside = sandbox.visible_paths(self.mode, self.targets)  # key -> path the worker sees
        self.load_errors = {}      # key -> message
        self.broken = {}           # (key, fn) -> what happened: later calls fail at once
        self.events = []           # hangs, crashes and restarts, for the record
        self.unreaped_cpu = 0.0    # CPU-seconds its processes used that no wait of this process counts: a sandbox's
                                   # tree is killed, not reaped here (what a proof's cost adds to the judge's)
        self.proc = self.sock = None
        self.caps = ""
        self.buffer = b""
        self.log_dir = spawned.log_dir if spawned else Path(tempfile.mkdtemp(prefix="grpo-worker-"))
        self.loaded = self.was_loaded = False
        self.spawned = spawned     # the first start adopts this process instead of launching one

    # --- life cycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process and queue the loads; returns at once (the worker imports torch meanwhile)."""
        if self.spawned is not None:
            (self.proc, self.sock), self.spawned = (self.spawned.proc, self.spawned.sock), None
        else:
            self.proc, self.sock = sandbox.launch(self.mode, self.targets, self.log_dir, self.limits)
        self.caps = self.proc.group.describe(self.limits)  # what holds its whole tree, for the record
        self.buffer, self.loaded = b"", False
        self.sock.setblocking(False)
        try:
            for key in self.targets:
                down = [(fn, why) for (k, fn), why in self.broken.items() if k == key]
                self._send({"op": "load", "key": key, "path": self.inside[key], "stand_down": down})
        except OSError:
            pass  # the worker is already gone: ready() finds out how

    def ready(self) -> None:
        """Wait for the worker's hello and the replies to the loads; records load errors."""
        if self.proc is None:
            self.start()
        if self.loaded:
            return
        pending = list(self.targets)  # the worker imports them in this order
        started = False
        try:
            if self._receive(START_CPU_S, START_IDLE_S, "starting").get("op") != "hello":
                raise wire.ProtocolError("no hello")
            started = True
            while pending:
                reply = self._receive(LOAD_CPU_S, LOAD_IDLE_S, "importing the file")
                if reply.get("key") != pending[0]:
                    raise wire.ProtocolError("a load reply out of order")
                if reply.get("ok") is not True:
                    self.load_errors[pending[0]] = self._describe_error(pending[0], reply.get("error"), "importing")
                pending.pop(0)
        except (Hang, Died, wire.ProtocolError, OSError) as exc:
            if self.was_loaded and self.out_of_time():  # a restart the time limit cut short: the file imports
                self.stop()
                return
            if not started:
                message = f"the worker process did not start: {exc}"
            else:
                message = f"importing it did not finish: {exc}" if isinstance(exc, Hang) else \
                    f"importing it broke the protocol: {exc}" if isinstance(exc, wire.ProtocolError) else \
                    f"importing it ended the worker process: {exc}"
            self.events.append(f"{display(self.targets[pending[0]])}: {message}")
            for key in pending:
                self.load_errors[key] = message if key == pending[0] else "not imported: the worker stopped first"
            self.stop()
            return
        self.loaded = self.was_loaded = True

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.sock.setblocking(True)
                self.sock.settimeout(0.5)
                wire.send(self.sock, {"op": "bye"})
            except OSError:
                pass
            used, reaped = sandbox.cpu_seconds(self.proc.pid), children_cpu()
            sandbox.kill(self.proc)
            self.unreaped_cpu += max(0.0, used - (children_cpu() - reaped))
            self.sock.close()
        self.proc = self.sock = None
        self.loaded = False

    def close(self) -> None:
        self.stop()
        for f in self.log_dir.glob("*"):
            f.unlink()
        self.log_dir.rmdir()

    # --- calls ----------------------------------------------------------------------------------------

    def call(self, key: str, fn: str, request: dict, op: str = "call", cpu_budget: float | None = None) -> dict:
        """The worker's ok-reply to a call, or CallFailed with a message that says what happened. The call's CPU
        budget is its function's (CALL_CPU_S, times the ranks of a distributed call) unless given."""
        __tracebackhide__ = True  # a failing check's traceback ends at the check's own line
        if key in self.load_errors:
            raise CallFailed(f"the file could not be imported: {self.load_errors[key]}")
        if (key, fn) in self.broken:
            raise CallFailed(f"{fn} {self.broken[(key, fn)]} (earlier in this run; it is not run again)")
        if self.out_of_time():
            raise CallFailed("not run: the time limit for the whole run ran out")
        self.ready()
        if key in self.load_errors:
            raise CallFailed(f"the file could not be imported: {self.load_errors[key]}")
        if not self.loaded:
            raise CallFailed("not run: the time limit for the whole run ran out while the worker restarted")
        try:
            self._send({"op": op, "key": key, "fn": fn, **request})
            ranks = len(request.get("ranks", [None]))  # a distributed call's budget covers all its ranks
            budget = cpu_budget or ranks * CALL_CPU_S.get(fn, DEFAULT_CALL_CPU_S)
            reply = self._receive(budget, IDLE_S, f"running {fn}")
        except Hang as exc:
            return self._give_up(key, fn, f"did not return: {exc}")
        except Died as exc:
            return self._give_up(key, fn, f"ended the worker process: {exc}")
        except (wire.ProtocolError, OSError) as exc:
            return self._give_up(key, fn, f"broke the protocol: {exc}")
        if reply.get("ok") is True:
            return reply
        raise CallFailed(self._describe_error(key, reply.get("error"), f"calling {fn}"))

    def _give_up(self, key, fn, what):
        """Record that fn hung, crashed or broke the protocol, stop the worker, and fail this call."""
        __tracebackhide__ = True
        message = f"{fn} {what}"
        self.events.append(message)
        self.stop()
        if "time limit" not in what:
            self.broken[(key, fn)] = what
            message += f"; later calls of {fn} fail at once"
        raise CallFailed(message) from None

    def _describe_error(self, key, err, doing) -> str:
        if not isinstance(err, dict):
            return f"{doing} failed and the worker gave no reason"
        where = str(err.get("where") or "")[:300]
        if where and key in self.inside:
            where = where.replace(self.inside[key], display(self.targets[key]), 1)
        kind, message = str(err.get("type", "Error"))[:100], str(err.get("message", ""))[:1500]
        text = f"{kind}: {message}" if message else kind
        if where:
            code = str(err.get("code") or "")[:300]
            text += f" (at {where}" + (f": `{code}`" if code else "") + ")"
        return text

    # --- the wire, read under budgets -----------------------------------------------------------------

    def _send(self, obj) -> None:
        data = wire.pack(obj)
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def _receive(self, cpu_budget: float, idle_s: float, what: str):
        """One message, while watching the worker: CPU over budget or idle too long is a Hang, exit is Died."""
        start = time.monotonic()
        cpu0 = last_cpu = None
        last_progress = start
        wait = 0.01
        while True:
            message = self._take_message()
            if message is not None:
                return message
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                try:
                    chunk = self.sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise Died(self._exit_status())
                self.buffer += chunk
                continue
            wait = min(wait * 2, 0.2)
            now = time.monotonic()
            if self.proc.poll() is not None:
                raise Died(self._exit_status())
            if self.deadline is not None and now > self.deadline:
                raise Hang("the time limit for the whole run ran out")
            cpu = sandbox.cpu_seconds(self.proc.pid)
            if cpu0 is None:
                cpu0 = last_cpu = cpu
            if cpu - cpu0 > cpu_budget:
                raise Hang(f"it used {cpu - cpu0:.0f} s of CPU time while {what} (the budget is {cpu_budget:.0f} s): "
                           f"a loop that never ends?")
            if cpu > last_cpu:
                last_cpu, last_progress = cpu, now
            elif now - last_progress > idle_s:
                raise Hang(f"it used no CPU at all for {idle_s:.0f} s while {what}: blocked (a sleep, a lock, "
                           f"waiting for input?)")

    def _take_message(self):
        if len(self.buffer) < wire.HEADER.size:
            return None
        n = wire.frame_length(self.buffer[:wire.HEADER.size])
        if len(self.buffer) < wire.HEADER.size + n:
            return None
        payload = self.buffer[wire.HEADER.size:wire.HEADER.size + n]
        self.buffer = self.buffer[wire.HEADER.size + n:]
        message = wire.unpack(payload)
        if not isinstance(message, dict):
            raise wire.ProtocolError(f"a {type(message).__name__} where a reply should be")
        return message

    def _exit_status(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except Exception:
            return "it closed the connection"
        # a plain process reports a signal as a negative status; bubblewrap passes it on as 128 + signal
        number = -code if code < 0 else code - 128 if self.mode == "bubblewrap" and code > 128 else None
        if number is None:
            return f"the process exited with status {code}"
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        native = " (a crash in native code, or a resource limit)" if name in ("SIGSEGV", "SIGBUS", "SIGABRT") else ""
        group = getattr(self.proc, "group", None)
        reached = group.reached() if group is not None else []
        if reached:  # the cgroup's cap on its whole tree, not a limit of its own
            native = f" (its sandbox reached its cap on {' and '.join(reached)})"
        return f"killed by {name}{native}"


def display(path: Path) -> str:
    """A path as the user knows it: relative to the current folder when it is below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --- the target, as the checks see it ------------------------------------------------------------------

class Optimizer:
    """An optimizer as a check sees it: its class, its hyperparameters and the model whose parameters it steps.
    The implementation gets a real one of that class; `steps` counts the steps it took, `state` is its state."""

    def __init__(self, name: str, model, **hyper):
        if name not in ("SGD", "Adam", "AdamW"):
            raise ValueError(f"unsupported optimizer {name!r}")
        self.name, self.model, self.hyper = name, model, hyper
        self.steps = 0
        self.state = None


class Encoder:
    """Arguments as plain data. Each model, optimizer and generator is sent once, by reference after that,
    and remembered so that what the call changed can be applied to it afterwards."""

    def __init__(self):
        self.refs = {}       # id(obj) -> ref
        self.objects = {}    # ref -> obj

    def __call__(self, v):
        if v is None or isinstance(v, (bool, int, float, str, torch.dtype)):
            return v
        if isinstance(v, torch.Tensor):
            return wire.tensor_to_plain(v)
        if isinstance(v, (list, tuple)):
            return {"kind": "tuple" if isinstance(v, tuple) else "list", "items": [self(x) for x in v]}
        if isinstance(v, dict):
            return {"kind": "dict", "items": [(self(k), self(x)) for k, x in v.items()]}
        if isinstance(v, contract.Config):
            return {"kind": "config", "overrides": [(k, self(x)) for k, x in v.overrides.items()]}
        if isinstance(v, (contract.Rollout, wire.Returned)):
            names = contract.ROLLOUT_FIELDS + tuple(f for f in ("sampler_logp",) if getattr(v, f, None) is not None)
            return {"kind": "rollout", "fields": [(f, self(getattr(v, f))) for f in names]}
        if hasattr(v, "sample_prompts") and hasattr(v, "reward"):  # a lab task
            return {"kind": "task", "name": v.name, "kwargs": [(k, self(x)) for k, x in vars(v).items()]}
        if id(v) in self.refs:
            return {"kind": "ref", "ref": self.refs[id(v)]}
        ref = len(self.refs)
        self.refs[id(v)], self.objects[ref] = ref, v
        if isinstance(v, torch.nn.Module):
            return self.module(v, ref)
        if isinstance(v, Optimizer):
            return {"kind": "optimizer", "ref": ref, "class": v.name, "module": self(v.model), "hyper": v.hyper,
                    "state": v.state}
        if isinstance(v, torch.Generator):
            return {"kind": "generator", "ref": ref, "device": str(v.device), "state": v.get_state()}
        raise TypeError(f"cannot send a {type(v).__name__} to the worker")

    def module(self, m, ref) -> dict:
        params = dict(m.named_parameters())
        out = {"kind": "module", "ref": ref, "training": m.training,
               "state": [(k, wire.tensor_to_plain(t)) for k, t in m.state_dict().items()],
               "grads": [(k, wire.tensor_to_plain(p.grad)) for k, p in params.items() if p.grad is not None],
               "requires_grad": [(k, p.requires_grad) for k, p in params.items()]}
        if isinstance(m, StandIn):
            return {**out, "class": "StandIn", "rule": m.rule, "params": [(k, self(x)) for k, x in m.params.items()]}
        from lab import TinyLM
        if isinstance(m, TinyLM):
            dtype = str(next(m.parameters()).dtype).removeprefix("torch.")
            return {**out, "class": "TinyLM", "config": list(vars(m.cfg).items()), "dtype": dtype}
        raise TypeError(f"cannot send a {type(m).__name__} model to the worker")

    def apply(self, updates) -> None:
        """What the call changed, applied to the check's own objects. Untrusted: malformed is a ProtocolError."""
        if not isinstance(updates, dict):
            raise wire.ProtocolError("updates are not a dict")
        try:
            for ref, u in updates.items():
                obj = self.objects[ref]
                if isinstance(obj, torch.nn.Module):
                    apply_module(obj, u)
                elif isinstance(obj, Optimizer):
                    obj.steps += wire.count(u["steps"], "an optimizer's step count", MAX_COUNT)
                    obj.state = u["state"]
                elif isinstance(obj, torch.Generator):
                    obj.set_state(u["state"])
        except wire.ProtocolError:
            raise
        except Exception as exc:  # untrusted data: whatever it makes fail here (1e400 as a count) is malformed
            raise wire.ProtocolError(f"malformed updates ({type(exc).__name__}: {str(exc)[:200]})") from None


def apply_module(model, u: dict) -> None:
    state = {k: wire.tensor_from_plain(t).detach() for k, t in u["state"]}
    own = model.state_dict()
    if set(state) != set(own) or any(state[k].shape != own[k].shape for k in own):
        raise ValueError("the model's state changed shape")
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(state[k])
    grads = {k: wire.tensor_from_plain(t).detach() for k, t in u["grads"]}
    flags = dict(u["requires_grad"])
    for name, p in model.named_parameters():
        g = grads.get(name)
        if g is not None and g.shape != p.shape:
            raise ValueError(f"a gradient of the wrong shape for {name}")
        p.grad = None if g is None else g.to(p.dtype)
        p.requires_grad_(bool(flags.get(name, p.requires_grad)))
    if isinstance(model, StandIn) and "records" in u:
        model.calls += wire.count(u["records"]["calls"], "a stand-in's call count", MAX_COUNT)
        flags = u["records"]["grad_enabled"]
        if not isinstance(flags, list) or not all(isinstance(x, bool) for x in flags):
            raise ValueError("a stand-in's grad modes are not a list of booleans")
        model.grad_enabled += flags


class Target:
    """The implementation under test as the checks see it: `grpo.kl_penalty(logp, ref)` runs in the worker.

    GRPOConfig and Rollout are the contract's own (judge-side) types; every contract function is a remote call
    whose result comes back as data. A call that raises, hangs or crashes fails the check with CallFailed."""

    Rollout = contract.Rollout

    def __init__(self, worker: Worker, key: str, path: Path):
        self.worker, self.key, self.path = worker, key, Path(path)

    def __repr__(self):
        return f"Target({display(self.path)})"

    @staticmethod
    def GRPOConfig(**overrides) -> contract.Config:
        return contract.Config(**overrides)

    def __getattr__(self, name):
        if name in contract.FUNCTIONS:
            def remote(*args, **kwargs):
                __tracebackhide__ = True
                return self.call(name, *args, **kwargs)
            return remote
        raise AttributeError(name)

    def call(self, fn: str, *args, **kwargs):
        __tracebackhide__ = True
        result, _ = self._call(fn, args, kwargs, ())
        return result

    def value_and_grad(self, fn: str, args: tuple, wrt: tuple, kwargs: dict | None = None):
        """fn(*args, **kwargs) and its gradient with respect to the tensor arguments at positions `wrt` (None
        where the result does not depend on them, or is not a scalar with a graph)."""
        __tracebackhide__ = True
        return self._call(fn, args, kwargs or {}, tuple(wrt))

    def distributed(self, fn: str, per_rank: list, wrap: str | None = None, record: bool = False) -> list:
        """fn on len(per_rank) ranks of one gloo process group at once, rank r called with per_rank[r] =
        (args, kwargs); wrap="ddp" wraps each rank's first argument (the policy) in DistributedDataParallel;
        record makes the task argument note each step's parameters, rollout and rewards. Returns, per rank,
        {"result", "records"}; what the call changed is applied to each rank's own objects."""
        __tracebackhide__ = True
        encoders = [Encoder() for _ in per_rank]
        ranks = [{"args": [e(a) for a in args], "kwargs": [(k, e(v)) for k, v in kwargs.items()]}
                 for e, (args, kwargs) in zip(encoders, per_rank)]
        request = {"ranks": ranks, "wrap": wrap, "record": record, "rng": torch.get_rng_state(),
                   "grad_mode": torch.is_grad_enabled()}
        reply = self.worker.call(self.key, fn, request, op="distributed")
        out = []
        try:
            replies = reply["ranks"]
            if not isinstance(replies, list) or len(replies) != len(per_rank):
                raise wire.ProtocolError("not one reply per rank")
            for rank, (enc, r) in enumerate(zip(encoders, replies)):
                if r.get("ok") is not True:
                    raise CallFailed(f"{fn} on rank {rank} of {len(per_rank)}: "
                                     + self.worker._describe_error(self.key, r.get("error"), f"calling {fn}"))
                result = wire.from_plain(r.get("result"))
                enc.apply(r.get("updates", {}))
                out.append({"result": result, "records": wire.from_plain(r.get("records"))})
        except CallFailed:
            raise
        except Exception as exc:  # untrusted data: whatever it makes fail here is malformed
            self.worker._give_up(self.key, fn, f"answered a distributed call with malformed data: {exc}")
        for r in out:
            problem = contract.check_return(fn, r["result"])
            if problem:
                raise CallFailed(problem)
        return out

    def _call(self, fn, args, kwargs, wrt):
        __tracebackhide__ = True
        enc = Encoder()
        request = {"args": [enc(a) for a in args], "kwargs": [(k, enc(v)) for k, v in kwargs.items()],
                   "grad_wrt": list(wrt), "rng": torch.get_rng_state(), "grad_mode": torch.is_grad_enabled()}
        reply = self.worker.call(self.key, fn, request)
        try:
            result = wire.from_plain(reply.get("result"))
            grads = reply.get("grads")
            grads = [None if g is None else wire.tensor_from_plain(g) for g in grads] if wrt else None
            enc.apply(reply.get("updates", {}))
            rng = reply.get("rng")
            if not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8):
                raise wire.ProtocolError("no RNG state")
            torch.set_rng_state(rng)
        except Exception as exc:  # untrusted data: whatever it makes fail here is malformed
            self.worker._give_up(self.key, fn, f"answered with malformed data: {exc}")
        problem = contract.check_return(fn, result)
        if problem:
            raise CallFailed(problem)
        return result, grads
