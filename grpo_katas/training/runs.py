"""One run configuration and one way to drive a GRPO loop, shared by `make run` (a candidate's loop and, for
comparison, the reference), `make train` (the reference trainer), `make bench` and `make gpu-check`.

    RunConfig      what a run is: task, steps, batch, seed, device, the lab model (a ModelConfig) or a Hugging Face
                   one (hf_model), and the GRPOConfig overrides applied on top of PRACTICE_GRPO
    grpo_config    a loop file's GRPOConfig under a RunConfig
    build          the seeded policy and the task of a run (a text task when the model is a Hugging Face one)
    frozen_reference  the KL reference of a policy: a frozen copy (bf16 on a GPU for a Hugging Face model)
    drive          a loop file's own `train` under a RunConfig, step by step (with or without a log= callback)
    drive_ranks    the same on `nproc` data-parallel ranks: forked processes joined in one gloo group

(The one summary of a run, `summarize`, is in curves.py.)

The trainer cannot hand its loop to a file's `train` (it checkpoints the optimizer and the generators between
steps), so it takes each step itself; its step is the reference train()'s step, and tests/test_trainer.py holds
the two to the same numbers.
"""
import contextlib
import dataclasses
import inspect
import math
import os
import time
import typing
from dataclasses import dataclass, field

import torch

from grpo_katas import yes_or_no
from lab import ModelConfig, TinyLM, make_task
from lab.tasks import TASKS
from lab.text import task_names as text_task_names


# The GRPO settings every practice run uses where they differ from GRPOConfig's; `--set` / SET= overrides them.
PRACTICE_GRPO = {
    "num_iterations": 2,  # two updates per batch, so the ratio leaves 1 and the clip bites (the paper's 1 never clips)
    "max_new_tokens": 6,  # the toy tasks need at most 4 tokens and an EOS; longer only costs time
}

# On a Hugging Face model, the word problems are for a pretrained checkpoint: TRL's learning rate, room to answer,
# and the batch backpropagated in micro-batches of N / 8 rows (for loss_type grpo the same step, in less memory).
# The text sum task is for the tiny random Llama (python -m lab.hf random-llama), as untrained as the lab model:
# it keeps the practice settings.
TEXT_GRPO = {"lr": 1e-6, "max_new_tokens": 256, "grad_accum_steps": 8}
TASK_GRPO = {"arith": TEXT_GRPO, "arith-format": TEXT_GRPO, "gsm8k": TEXT_GRPO, "gsm8k-format": TEXT_GRPO}

# Help for the lab model's fields that the trainer exposes as flags (ModelConfig itself lives in lab/).
MODEL_HELP = {
    "d_model": "model width (default 64): raise it (512, as make gpu-check does) to give a GPU real work",
    "n_layer": "model depth (default 2): 8 for a GPU-sized run",
    "n_head": "attention heads (default 4); must divide --d-model",
}


class ConfigError(ValueError):
    """A run setting that cannot work; `setting` names it so that each front end can name its own flag (a
    GRPOConfig override is `grpo.NAME`, set with --set NAME=VALUE)."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting.removeprefix('grpo.')} {problem}")
        self.setting, self.problem = setting, problem


def flag_words(setting: str, problem: str) -> str:
    """A setting's error in the words of the flag that sets it: `--steps must be at least 1, got -5`, `--set beta
    must be a finite number, 0 or more (0 drops the KL term), got -1.0`."""
    via_make = bool(os.environ.get("GRPO_KATAS_MAKE"))  # the Makefile's commands: in the words of its settings
    if setting.startswith("grpo."):
        return f"SET={setting[5:]}=: {problem}" if via_make else f"--set {setting[5:]} {problem}"
    if setting in {f.name for f in dataclasses.fields(RunConfig)} - {"model", "grpo"}:
        if via_make:
            return f"{'MODEL' if setting == 'hf_model' else setting.upper()}=: {problem}"
        return f"--{setting.replace('_', '-')} {problem}"
    return f"{setting} {problem}"


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


MAX_GROUP = 1024   # completions per prompt; more only exhausts memory and time on any machine this runs on
PROMPT_ROOM = 16   # positions of the lab model kept for the prompt (the lab tasks' prompts take at most 4)

# What a GRPOConfig override may be, checked where a run's settings enter (SET=, --set, a saved run): a value that
# would crash the loop, hang it or quietly make the run meaningless is refused in one line. (check, the rule in
# words); a check takes the value and the RunConfig. Settings not named here are left to the loop's own GRPOConfig.
GRPO_RULES = {
    "group_size": (lambda v, r: isinstance(v, int) and 2 <= v <= MAX_GROUP,
                   f"must be from 2 (a group of one has no baseline) to {MAX_GROUP}"),
    "max_new_tokens": (lambda v, r: isinstance(v, int) and 1 <= v and (r.hf_model or v <= r.model.max_len - PROMPT_ROOM),
                       "must be from 1 to {top} (the lab model holds {max_len} positions; prompts take up to "
                       f"{PROMPT_ROOM})"),
    "num_iterations": (lambda v, r: isinstance(v, int) and v >= 1, "must be at least 1 (updates per batch)"),
    "grad_accum_steps": (lambda v, r: isinstance(v, int) and 1 <= v <= r.batch_size,
                         "must be from 1 to the batch size, {batch} (each micro-batch holds at least one group)"),
    "temperature": (lambda v, r: _number(v) and v > 0, "must be a finite number above 0"),
    "beta": (lambda v, r: _number(v) and v >= 0, "must be a finite number, 0 or more (0 drops the KL term)"),
    "clip_eps": (lambda v, r: _number(v) and v > 0, "must be a finite number above 0"),
    "clip_eps_high": (lambda v, r: v is None or (_number(v) and v > 0),
                      "must be none (the same as clip_eps; cispo's cap 5.0) or a finite number above 0"),
    "is_cap": (lambda v, r: v is None or (_number(v) and v >= 1),
               "must be none (no correction) or a finite number of at least 1 (a cap below 1 would shrink even a "
               "token the policy sampled itself, whose weight is 1)"),
    "adv_eps": (lambda v, r: _number(v) and v >= 0, "must be a finite number, 0 or more"),
    "lr": (lambda v, r: _number(v) and v >= 0, "must be a finite number, 0 or more"),
    "max_grad_norm": (lambda v, r: _number(v) and v > 0, "must be a finite number above 0"),
    # TRL 1.16's options (issue 33); how they combine (is_cap with rollout_is_mode, the bounds' order) is left to
    # the loop's GRPOConfig, which refuses in one line too
    "importance_sampling_level": (lambda v, r: v in ("token", "sequence"), "must be token or sequence"),
    "sapo_temperature_pos": (lambda v, r: _number(v) and v > 0, "must be a finite number above 0"),
    "sapo_temperature_neg": (lambda v, r: _number(v) and v > 0, "must be a finite number above 0"),
    "delta": (lambda v, r: v is None or (_number(v) and v > 1),
              "must be none (off) or a finite number above 1 (it bounds the ratio, which is 1 on-policy)"),
    "top_entropy_quantile": (lambda v, r: _number(v) and 0 <= v <= 1,
                             "must be from 0 to 1 (the share of tokens by entropy the policy term keeps; 1: all)"),
    "mask_truncated_completions": (lambda v, r: isinstance(v, bool), "must be yes or no"),
    "rollout_is_mode": (lambda v, r: v in (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
                        "must be none (off), token_truncate, token_mask, sequence_truncate or sequence_mask"),
    "rollout_is_clip_min": (lambda v, r: v is None or (_number(v) and v >= 0),
                            "must be none (no lower bound) or a finite number, 0 or more"),
    "rollout_is_clip_max": (lambda v, r: v is None or (_number(v) and v > 0),
                            "must be none (no upper bound) or a finite number above 0"),
    "use_bias_correction_kl": (lambda v, r: isinstance(v, bool), "must be yes or no"),
    "off_policy_mask_threshold": (lambda v, r: v is None or (_number(v) and v > 0),
                                  "must be none (off) or a finite number above 0"),
}


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class RunConfig:
    task: str = field(default="sum", metadata=_help(
        "the lab task: sum (digits that add up to a target, default) or copy (repeat the prompt); copy is harder. "
        "With --hf-model a text task: sum (the same, as text), arith (word problems generated locally) or gsm8k "
        "(through the datasets package), each of the last two also with -format (a 0.1 format reward)"))
    steps: int = field(default=200, metadata=_help(
        "training steps, one batch of rollouts each (default 200): fewer for a quick look, more to watch a slow drift"))
    batch_size: int = field(default=16, metadata=_help(
        "B prompts per step, N = B * group_size rows (default 16): larger is smoother and slower"))
    seed: int = field(default=0, metadata=_help(
        "seeds the model's initial weights, the prompts and the sampling (default 0): change it to see how much "
        "of a curve is luck"))
    device: str = field(default="auto", metadata=_help(
        "auto (CUDA when there is one), cpu, cuda or mps (a Mac's GPU; never chosen by auto: the lab's default model "
        "is small enough that a CPU is fast, and faster than MPS's kernel launches)"))
    model: ModelConfig = field(default_factory=ModelConfig, metadata=_help("the lab model's shape"))
    hf_model: str = field(default="", metadata=_help(
        "a Hugging Face causal LM instead of the lab model: a hub name (Qwen/Qwen2.5-0.5B-Instruct) or a local "
        "folder, which works offline (needs the hf extra: pip install -e '.[hf]'); empty: the lab model"))
    gradient_checkpointing: bool = field(default=False, metadata=_help(
        "with --hf-model, recompute each layer's activations in the backward pass: a third more compute for a "
        "fraction of the activation memory, to fit a larger model or batch on the GPU"))
    grpo: dict = field(default_factory=dict, metadata=_help(
        "GRPOConfig fields to override, on top of PRACTICE_GRPO (typed by parse_overrides)"))
    compile: bool = field(default=False, metadata=_help(
        "torch.compile the scoring model: pays off only for a large model on a GPU, after a slow first step"))
    nproc: int = field(default=1, metadata=_help(
        "data-parallel ranks, each a process on this machine in one gloo group (default 1): 2 shows the bugs that "
        "only a data-parallel run has; make train NPROC=2 uses torchrun instead"))
    checkpoint_every: int = field(default=50, metadata=_help(
        "steps between checkpoints when --out is given (default 50): lower loses less to a crash, costs disk time"))
    target_reward: float = field(default=0.9, metadata=_help(
        "the summary reports the first step whose 5-step mean reward reaches this (default 0.9)"))

    def __post_init__(self):
        tasks = text_task_names() if self.hf_model else list(TASKS)
        if self.task not in tasks:
            raise ConfigError("task", f"must be one of {', '.join(tasks)}"
                                      f"{' with a Hugging Face model' if self.hf_model else ''}, got {self.task!r}")
        for name in ("steps", "batch_size", "checkpoint_every", "nproc"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be at least 1, got {getattr(self, name)}")
        if not (self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")):
            raise ConfigError("device", f"must be auto, cpu, cuda or mps, got {self.device!r}")
        if self.device == "mps" and self.nproc > 1:
            raise ConfigError("nproc", "data-parallel ranks run on CUDA GPUs or on the CPU; mps is one GPU")
        m = self.model
        if min(m.d_model, m.n_layer, m.n_head) < 1 or m.d_model % m.n_head:
            raise ConfigError("model", f"needs positive sizes and n_head dividing d_model, got {m}")
        for name, value in self.grpo.items():
            check, rule = GRPO_RULES.get(name, (lambda v, r: True, ""))
            if not check(value, self):
                rule = rule.format(top=m.max_len - PROMPT_ROOM, max_len=m.max_len, batch=self.batch_size)
                raise ConfigError(f"grpo.{name}", f"{rule}, got {value!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """The inverse of dataclasses.asdict (a saved config.json or checkpoint); unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        if set(d) - known:
            raise ConfigError("saved run", f"has settings this version does not know: {', '.join(set(d) - known)}")
        return cls(**{**d, "model": ModelConfig(**d.get("model", {}))})


def parse_overrides(pairs, cls) -> dict:
    """["beta=0.1", "lr=3e-3"] -> {"beta": 0.1, "lr": 0.003}, typed by cls's fields; unknown keys are an error."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"override {pair!r} is not key=value")
        if key not in fields:
            raise ValueError(f"unknown setting {key!r}; valid: {', '.join(fields)}")
        kind, optional = setting_type(cls, fields[key])
        if optional and raw.lower() in ("none", "null"):
            out[key] = None
            continue
        try:
            out[key] = yes_or_no(raw) if kind is bool else kind(raw)
        except ValueError:
            raise ValueError(f"{key} takes a {kind.__name__}{' or none' if optional else ''}, got {raw!r}") from None
    return out


def setting_type(cls, f) -> tuple:
    """(type, may it be None) of a config field: from its annotation (Optional[float], float | None), else from
    its default; a field without either is read as a string."""
    try:
        hint = typing.get_type_hints(cls).get(f.name)
    except Exception:  # an annotation the loop file cannot resolve: fall back on the default
        hint = None
    if hint is None:
        return (str, True) if f.default is None else (type(f.default), False)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = len(args) < len(typing.get_args(hint))
    kind = args[0] if optional and len(args) == 1 else hint
    return (kind if kind in (bool, int, float, str) else str), optional


def grpo_config(loop, run: RunConfig):
    """The loop file's GRPOConfig: its own defaults, then PRACTICE_GRPO, then a real model's task settings
    (TASK_GRPO), then the run's overrides."""
    task = TASK_GRPO.get(run.task, {}) if run.hf_model else {}
    return loop.GRPOConfig(**{**PRACTICE_GRPO, **task, **run.grpo})


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", "cuda asked for, but torch sees no CUDA device")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device", "mps asked for, but torch sees no Apple GPU (MPS is on Apple silicon, macOS 14 "
                                    "and later)")
    return torch.device(name)


def on_a_gpu(device: torch.device) -> bool:
    """CUDA or a Mac's GPU (MPS): where a run takes a GPU's dtypes (see lab_dtype and autocast)."""
    return device.type in ("cuda", "mps")


def lab_dtype(device: torch.device) -> torch.dtype:
    """The lab model's dtype on `device`: float64 on the CPU, so that a run prints the same digits on every CPU (in
    float32 the last bits of the initial weights and of every sum depend on the CPU's vector width, and 40 steps of
    sampling and Adam amplify them; in float64 two CPUs part by about 1e-11 after 40 steps), float32 on a GPU, where
    float64 is slow (CUDA) or missing (MPS)."""
    return torch.float32 if on_a_gpu(device) else torch.float64


def autocast(device: torch.device):
    """A step's precision on `device`: bf16 autocast on a GPU, where the policy's float32 weights are the master
    copy; nothing on the CPU."""
    if on_a_gpu(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build(run: RunConfig, device: torch.device) -> tuple:
    """(policy, task): the lab model initialised from the run's seed, on `device` in lab_dtype(device), and the
    run's task; or the Hugging Face model run.hf_model behind the lab model's interface (lab/hf.py) and the text
    task."""
    torch.manual_seed(run.seed)
    if not run.hf_model:
        return TinyLM(run.model, dtype=lab_dtype(device)).to(device), make_task(run.task)
    from lab.hf import load
    from lab.text import make_text_task
    try:  # no transformers, no such model: one line
        policy = load(run.hf_model, device, gradient_checkpointing=run.gradient_checkpointing)
    except (ImportError, ValueError) as exc:
        raise ConfigError("hf_model", str(exc)) from None
    try:  # gsm8k without datasets or the hub
        return policy, make_text_task(run.task, policy.tokenizer)
    except ValueError as exc:
        raise ConfigError("task", str(exc)) from None


def frozen_reference(policy) -> torch.nn.Module:
    """The KL reference: a copy of the policy that is never stepped (an adapter's own frozen_copy, in bf16 on a
    GPU, where it has one)."""
    if hasattr(policy, "frozen_copy"):
        return policy.frozen_copy()
    import copy
    return copy.deepcopy(policy).requires_grad_(False)


def drive(loop, run: RunConfig, on_step=lambda stats: None) -> list:
    """Train with the loop file's own `train(policy, task, cfg, *, steps, batch_size, seed[, log])` under `run`.

    Each step's stats go to on_step with `step` (counted here) and the measured `seconds`: as they happen when
    `train` takes a log= callback, all at the end (each step the run's mean time) when it only returns its list.
    Whatever the loop raises is raised here: the caller decides how to show a candidate's crash."""
    policy, task = build(run, resolve_device(run.device))
    cfg = grpo_config(loop, run)
    kwargs = {"steps": run.steps, "batch_size": run.batch_size, "seed": run.seed}
    history, clock = [], [time.perf_counter()]

    def record(stats, seconds):  # the step is counted here, whatever the loop calls it
        history.append({**stats, "step": len(history) + 1, "seconds": seconds})
        on_step(history[-1])

    def log(stats):
        t, clock[0] = clock[0], time.perf_counter()
        record(stats, clock[0] - t)

    if "log" in inspect.signature(loop.train).parameters:
        loop.train(policy, task, cfg, **kwargs, log=log)
    else:
        returned = list(loop.train(policy, task, cfg, **kwargs))
        per_step = (time.perf_counter() - clock[0]) / max(1, len(returned))
        for stats in returned:
            record(stats, per_step)
    return history


def drive_ranks(path, run: RunConfig, on_step=lambda stats: None) -> list:
    """drive(loop at `path`, run) on run.nproc data-parallel ranks: processes forked from this one, joined in a
    gloo process group on loopback, each loading the loop file itself. Rank 0's stats are what on_step gets, with
    every other rank's next to them as key@rank (reward_mean@1); each step is passed on once every rank has
    logged it. A rank's crash is raised here as RankFailed with its message."""
    import json
    import os
    import select
    import tempfile

    from grpo_katas.training.loader import load_target

    folder = tempfile.mkdtemp(prefix="grpo-ranks-")
    store = os.path.join(folder, "store")
    pipes = []
    for rank in range(run.nproc):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank
            os.close(r)
            out = os.fdopen(w, "w")
            code = 0
            try:
                import torch.distributed as dist
                torch.set_num_threads(1)  # one core per rank: more threads would spin against the other rank
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
                dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=run.nproc)
                drive(load_target(path), run, lambda stats: print(json.dumps({"step": stats}), file=out, flush=True))
            except BaseException as exc:  # the loop's own crash, reported to the parent with its traceback
                import traceback
                print(json.dumps({"crash": f"{type(exc).__name__}: {exc}".splitlines()[0],
                                  "trace": traceback.format_exc()}), file=out, flush=True)
                code = 1
            out.close()
            os._exit(code)
        os.close(w)
        pipes.append((pid, os.fdopen(r)))
    steps = [[] for _ in pipes]
    history, crash = [], None
    try:
        open_pipes = {f.fileno(): i for i, (_, f) in enumerate(pipes)}
        while open_pipes and crash is None:
            ready, _, _ = select.select(list(open_pipes), [], [])
            for fd in ready:
                i = open_pipes[fd]
                line = pipes[i][1].readline()
                if not line:
                    del open_pipes[fd]
                    continue
                event = json.loads(line)
                if "crash" in event:
                    crash = (f"rank {i}: {event['crash']}", event.get("trace", ""))
                    break
                steps[i].append(event["step"])
            while all(len(s) > len(history) for s in steps):
                k = len(history)
                merged = dict(steps[0][k])
                for i in range(1, len(steps)):
                    merged.update({f"{key}@{i}": v for key, v in steps[i][k].items() if key not in ("step",)})
                history.append(merged)
                on_step(merged)
    finally:
        for pid, f in pipes:
            if crash is not None:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            os.waitpid(pid, 0)
            f.close()
        if os.path.exists(store):
            os.unlink(store)
        os.rmdir(folder)
    if crash is not None:
        raise RankFailed(*crash)
    return history


class RankFailed(RuntimeError):
    """A data-parallel rank's loop raised; the message names the rank, `trace` is the rank's own traceback."""

    def __init__(self, message: str, trace: str = ""):
        super().__init__(message)
        self.trace = trace
