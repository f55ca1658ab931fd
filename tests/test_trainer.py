"""The trainer: overrides, the checkpoint round trip and a two-step CPU run. Run: pytest tests/test_trainer.py"""
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from grpo_katas import REFERENCE, ROOT
from grpo_katas.training.curves import summarize
from grpo_katas.training.loader import load_target
from grpo_katas.training.runs import RunConfig, drive, parse_overrides
from grpo_katas.training.train import Trainer
from lab import ModelConfig
from tests.cli_helpers import ENV


SMALL = dict(steps=4, batch_size=4, model=ModelConfig(d_model=16, n_layer=1, n_head=2), device="cpu",
             checkpoint_every=2, grpo={"group_size": 4})


def test_overrides_are_typed_and_unknown_keys_rejected():
    @dataclasses.dataclass(frozen=True)
    class C:
        beta: float = 0.0
        group_size: int = 8
        name: str = "x"
        flag: bool = False
    assert parse_overrides(["beta=0.1", "group_size=4", "name=y", "flag=true"], C) == \
        {"beta": 0.1, "group_size": 4, "name": "y", "flag": True}
    with pytest.raises(ValueError, match="unknown setting 'betta'"):
        parse_overrides(["betta=0.1"], C)
    with pytest.raises(ValueError, match="group_size takes a int"):
        parse_overrides(["group_size=four"], C)
    with pytest.raises(ValueError, match="not key=value"):
        parse_overrides(["beta"], C)


def test_an_optional_setting_takes_a_value_or_none():
    @dataclasses.dataclass(frozen=True)
    class C:
        is_cap: Optional[float] = None
        clip_eps_high: float | None = None
    assert parse_overrides(["is_cap=3.0", "clip_eps_high=0.28"], C) == {"is_cap": 3.0, "clip_eps_high": 0.28}
    assert parse_overrides(["is_cap=none"], C) == {"is_cap": None}
    with pytest.raises(ValueError, match="is_cap takes a float or none"):
        parse_overrides(["is_cap=high"], C)


def test_every_kata_s_run_settings_read_back_through_its_own_config():
    """make run hands a kata's [run] settings to the runner as KEY=VALUE words (is_cap=3.0 once failed there)."""
    from grpo_katas.catalogue.katas import load_katas
    from grpo_katas.training.loader import load_target
    for kata in load_katas():
        config = load_target(kata.loop).GRPOConfig
        assert parse_overrides(kata.settings, config) == kata.run["set"], kata.name


def test_a_resumed_run_matches_an_uninterrupted_one(tmp_path):
    straight = Trainer(RunConfig(**SMALL)).fit()
    first = Trainer(RunConfig(**{**SMALL, "steps": 2}), tmp_path)
    first.fit()
    resumed = Trainer.resume(tmp_path, steps=4)
    assert resumed.step == 2
    rest = resumed.fit()
    assert [h["step"] for h in rest] == [3, 4]
    for a, b in zip(straight[2:], rest):
        assert a["reward_mean"] == b["reward_mean"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3, 4]


def test_a_checkpoint_is_replaced_atomically(tmp_path):
    t = Trainer(RunConfig(**SMALL), tmp_path)
    t.fit()
    assert (tmp_path / "checkpoint.pt").exists() and not list(tmp_path.glob("*.tmp"))
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert state["step"] == 4 and state["config"]["grpo"]["group_size"] == 4


def test_the_trainer_takes_the_same_steps_as_the_references_own_train():
    """make train (resumable steps) and make run's reference curve (the file's train() through runs.drive)."""
    run = RunConfig(**SMALL)
    trainer = Trainer(run).fit()
    driven = drive(load_target(REFERENCE), run)
    for a, b in zip(trainer, driven, strict=True):
        assert a["step"] == b["step"] and a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["kl"] == pytest.approx(b["kl"], abs=1e-6)


def test_drive_takes_a_train_with_or_without_a_log_callback():
    class Quiet:  # a loop whose train only returns its list
        GRPOConfig = load_target(REFERENCE).GRPOConfig

        @staticmethod
        def train(policy, task, cfg, *, steps, batch_size, seed):
            return [{"reward_mean": 0.5, "kl": 0.0, "loss": 1.0} for _ in range(steps)]
    seen = []
    history = drive(Quiet, RunConfig(**SMALL), seen.append)
    assert [h["step"] for h in history] == [1, 2, 3, 4] and seen == history and all(h["seconds"] >= 0 for h in seen)


def test_summarize_gives_window_means_and_the_step_a_target_is_reached():
    history = [{"step": i, "reward_mean": r} for i, r in enumerate([0.0, 0.2, 0.4, 1.0, 1.0, 1.0], 1)]
    s = summarize(history, target=0.8, window=2)
    assert (s.first, s.last, s.reached) == (pytest.approx(0.1), 1.0, 5)
    assert summarize(history[:1]).first == 0.0 and summarize(history, target=2.0).reached is None


def test_two_steps_from_the_command_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--steps", "2", "--batch-size", "4",
                        "--device", "cpu", "--set", "group_size=4", "beta=0.1", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reward" in r.stdout and (tmp_path / "metrics.jsonl").exists()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["grpo"]["beta"] == 0.1 and config["grpo"]["num_iterations"] == 2
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--set", "betta=1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown setting 'betta'" in r.stdout


@pytest.mark.slow
def test_the_gpu_check_script_runs_its_cpu_smoke_test():
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.gpu_check", "--device", "cpu", "--small"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "gpu-check passed" in r.stdout and "FAIL" not in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_a_step_count_below_one_is_refused_in_one_line(steps):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--steps", steps], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and (r.stdout + r.stderr).strip() == f"error: --steps must be at least 1, got {steps}"


def test_a_data_parallel_run_s_refusal_is_one_line_before_torchrun_starts(tmp_path):
    """The ranks refused a bad setting each, and torchrun then printed its own 40-line ChildFailedError."""
    (tmp_path / "x").write_text("a run's file")
    for args, said in ((["--set", "beta=-1"], "error: --set beta must be a finite number, 0 or more"),
                       (["--out", str(tmp_path)], f"error: --out {tmp_path} is not empty")):
        r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--nproc", "2", "--steps", "2", *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
        out = (r.stdout + r.stderr).strip()
        assert r.returncode == 2 and out.startswith(said) and len(out.splitlines()) <= 2, out


@pytest.mark.slow
def test_a_truncated_checkpoint_names_the_file_and_what_to_do(tmp_path):
    Trainer(RunConfig(**{**SMALL, "steps": 2}), tmp_path).fit()
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", "--out", str(tmp_path), "--resume"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**ENV, "COLUMNS": "400"})
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2 and len(out.splitlines()) == 1 and str(ckpt) in out and "mv " in out, out
    # what it says leads somewhere: moved aside, the folder takes a new run (and the old one is kept)
    mv = re.search(r"\(mv (\S+) (\S+)\)", out)
    subprocess.run(["mv", mv[1], mv[2]], check=True)
    code, said = trainer("--steps", "2", "--out", str(tmp_path), *TINY)
    assert code == 0 and (tmp_path / "checkpoint.pt").is_file() and (Path(mv[2]) / "metrics.jsonl").is_file()
    code, said = trainer("--steps", "3", "--out", str(tmp_path), "--resume", *TINY)
    assert code == 0, said


def test_a_folder_that_holds_a_run_without_a_checkpoint_says_how_to_start_again(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    code, said = trainer("--steps", "1", "--out", str(out), *TINY)
    assert code == 2 and "holds a run with no checkpoint to resume" in said and f"mv {out} {out}.old" in said
    subprocess.run(["mv", str(out), f"{out}.old"], check=True)
    assert trainer("--steps", "1", "--out", str(out), *TINY)[0] == 0


def test_every_bench_stage_reports_its_progress(monkeypatch):
    from grpo_katas.training import bench
    seen = []

    def tick(stage):
        return lambda done, total, note="": seen.append((stage, done, total))
    t = Trainer(RunConfig(**SMALL))
    bench.bench_sampling(t, new_tokens=4, repeats=1, tick=tick("sampling"))
    bench.bench_time_to_target("cpu", seeds=(0,), max_steps=2, tick=lambda seed: tick(f"seed {seed}"))
    bench.bench_breakdown(t, steps=2, tick=tick("breakdown"))
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: ran.append(command[1:3]))  # no check run here
    bench.bench_judge(repeats=1, tick=tick("judge"))
    assert seen == [("sampling", 1, 2), ("sampling", 2, 2), ("seed 0", 1, 2), ("seed 0", 2, 2),
                    ("breakdown", 1, 2), ("breakdown", 2, 2), ("judge", 1, 2), ("judge", 2, 2)]
    assert ran == [["-c", "import torch, pytest"], ["-m", "pytest"]]


@pytest.mark.plot
def test_the_curves_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    from grpo_katas.training.curves import plot_png
    history = [{"step": i, "reward_mean": 0.1 * i, "kl": 0.01 * i, "grad_norm": 1.0} for i in range(1, 6)]
    assert plot_png({"yours": history, "reference": history[:3]}, tmp_path / "run.png", "a title")
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_mac_s_gpu_is_taken_where_torch_sees_one_and_refused_in_one_line_elsewhere(monkeypatch):
    """DEVICE=mps: refused in one line where torch sees no MPS (here, on Linux); where it does (mocked), the run takes
    a GPU's dtypes (float32 weights, bf16 autocast), one rank only, and auto still means CUDA or the CPU."""
    from grpo_katas.training import runs
    if not torch.backends.mps.is_available():
        code, out = trainer("--device", "mps", "--steps", "1")
        assert code == 2 and out == ("error: --device mps asked for, but torch sees no Apple GPU (MPS is on Apple "
                                     "silicon, macOS 14 and later)"), out
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    device = runs.resolve_device(RunConfig(device="mps").device)
    cast = runs.autocast(device)
    assert device == torch.device("mps") and runs.lab_dtype(device) == torch.float32
    assert isinstance(cast, torch.autocast) and (cast.device, cast.fast_dtype) == ("mps", torch.bfloat16)
    assert runs.resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert runs.lab_dtype(torch.device("cpu")) == torch.float64 and not isinstance(runs.autocast(torch.device("cpu")),
                                                                                  torch.autocast)
    with pytest.raises(runs.ConfigError, match="data-parallel ranks run on CUDA GPUs or on the CPU"):
        RunConfig(device="mps", nproc=2)


@pytest.mark.parametrize("setting, problem", [
    ("max_new_tokens=0", "must be from 1 to 48"), ("num_iterations=0", "must be at least 1"),
    ("temperature=nan", "must be a finite number above 0"), ("group_size=100000", "must be from 2"),
    ("clip_eps=-1", "must be a finite number above 0"), ("clip_eps_high=-3", "must be none"),
    ("is_cap=0", "of at least 1"), ("beta=-1", "0 or more"), ("grad_accum_steps=17", "to the batch size, 16")])
def test_a_setting_that_cannot_work_is_refused_where_it_enters(setting, problem):
    """Each once crashed a run, hung it (group_size=100000) or was taken silently; now RunConfig refuses it."""
    from grpo_katas.training.runs import ConfigError, flag_words
    key = setting.split("=")[0]
    with pytest.raises(ConfigError) as caught:
        RunConfig(grpo=parse_overrides([setting], load_target(REFERENCE).GRPOConfig))
    words = flag_words(caught.value.setting, caught.value.problem)
    given, got = setting.split("=")[1], words.rsplit(", got ", 1)[1]
    assert words.startswith(f"--set {key} ") and problem in words
    assert got == given == "nan" or float(got) == float(given)


def trainer(*args, env=None):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.training.train", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**ENV, "COLUMNS": "300", **(env or {})})
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r.returncode, (r.stdout + r.stderr).strip()


TINY = ["--batch-size", "4", "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--device", "cpu",
        "--set", "group_size=4"]


@pytest.mark.slow
def test_a_run_in_out_is_never_overwritten_and_resume_continues_it_as_it_was_set_up(tmp_path):
    out = tmp_path / "run with spaces"
    assert trainer("--steps", "2", "--out", str(out), *TINY)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, said = trainer("--steps", "4", "--out", str(out), *TINY)
    assert code == 2 and len(said.splitlines()) == 1 and "is not empty (it holds a run" in said and "--resume" in said
    code, said = trainer("--steps", "4", "--out", str(out), "--resume=no", *TINY)  # RESUME=no means no
    assert code == 2 and "is not empty" in said
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    code, said = trainer("--steps", "4", "--out", str(out), "--resume", "--task", "copy", "--set", "beta=0.1")
    assert code == 2 and len(said.splitlines()) == 1 and "--task (sum in the run, copy given)" in said
    assert "--set beta (0.04 in the run, 0.1 given)" in said and {p.name: p.read_bytes() for p in out.iterdir()} == before
    code, said = trainer("--steps", "4", "--out", str(out), "--resume", *TINY)  # the same settings again are fine
    assert code == 0 and "mean of the first and last 5 steps of 4" in said, said  # the whole run, not steps 3-4
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_an_out_that_cannot_hold_a_run_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("mine")
    code, said = trainer("--steps", "1", "--out", str(tmp_path / "a-file"), *TINY)
    assert code == 2 and said == f"error: --out {tmp_path / 'a-file'} is a file; give a folder (a new one, or a run's " \
                                  f"with --resume)" and (tmp_path / "a-file").read_text() == "mine"
    code, said = trainer("--steps", "1", "--out", str(tmp_path / "a-file" / "run"), *TINY)
    assert code == 2 and said.startswith("error: --out") and "cannot be written: Not a directory" in said


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, said = trainer("--steps", "1", "--out", str(locked / "run"), *TINY)
    assert code == 2 and "cannot be written: Permission denied" in said


def test_ctrl_c_ends_the_run_after_its_step_with_a_checkpoint_that_resumes_it(tmp_path):
    import signal
    import time

    from tests.cli_helpers import interruptible
    out = tmp_path / "run"
    proc = interruptible(["--steps", "500", "--out", str(out), *TINY], ROOT, module="grpo_katas.training.train")
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    said, _ = proc.communicate(timeout=120)
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    saved = torch.load(out / "checkpoint.pt", weights_only=False)
    assert proc.returncode == 130 and "Traceback" not in said and saved["step"] == steps[-1] < 500, said
    assert f"stopped at step {steps[-1]} of 500" in said and "--resume" in said
    code, _ = trainer("--steps", str(steps[-1] + 1), "--out", str(out), "--resume", *TINY)
    assert code == 0 and [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, steps[-1] + 2))


def test_make_train_passes_an_out_with_spaces_whole(repo):
    from tests.cli_helpers import make
    code, said = make(repo, "train", "STEPS=1", "OUT=runs/a run", "SET=group_size=4", "RESUME=0")
    assert code == 0 and (repo / "runs" / "a run" / "checkpoint.pt").exists(), said


@pytest.mark.plot
def test_a_nan_curve_shows_in_the_png(tmp_path, monkeypatch):
    """A line through NaN draws nothing, nor does a line of one point: the run that went NaN after one step must
    still show, a dot where it was finite and an x on the panel's top edge where not, in its own colour."""
    pytest.importorskip("matplotlib")
    import math

    import matplotlib.pyplot as plt

    from grpo_katas.training.curves import plot_png
    healthy = [{"step": i, "reward_mean": 0.1 * i, "kl": 0.01 * i, "grad_norm": 0.3} for i in range(1, 11)]
    broken = [{"step": 1, "reward_mean": 0.1, "kl": 0.0, "grad_norm": math.nan},
              {"step": 2, "reward_mean": math.nan, "kl": math.nan, "grad_norm": math.nan}]
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at what was drawn
    assert plot_png({"yours": broken, "healthy": healthy}, tmp_path / "run.png")
    reward, _, grad = figures[0].axes
    yours = reward.lines[0]
    assert yours.get_marker() == "." and list(yours.get_xdata()) == [1]
    for ax, steps in ((reward, [2]), (grad, [1, 2])):
        marks = [l for l in ax.lines if l.get_marker() == "x"]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == steps
        assert marks[0].get_color() == ax.lines[0].get_color() and set(marks[0].get_ydata()) == {ax.get_ylim()[1]}


def test_a_run_stopped_at_once_says_truly_what_its_folder_keeps(tmp_path):
    from grpo_katas.training.train import left_behind
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")
    assert "left empty" in left_behind(tmp_path) and not any(tmp_path.iterdir())  # the next run may use it
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert "no checkpoint yet" in left_behind(tmp_path) and (tmp_path / "metrics.jsonl").exists()
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert "keeps its last checkpoint" in left_behind(tmp_path) and left_behind(None) == ""


def test_a_ctrl_c_before_a_command_is_ready_is_one_line_and_sigint():
    r = subprocess.run([sys.executable, "-c", "import grpo_katas\nraise KeyboardInterrupt"], capture_output=True,
                       text=True, timeout=60)
    assert r.stderr == "interrupted\n" and r.returncode == -2  # ended as SIGINT ends it: 130 in a shell


def test_a_mistake_in_the_flags_is_one_line_not_the_usage_first():
    code, said = trainer("--steps", "x")
    assert code == 2 and said == ("error: argument --steps: invalid int value: 'x'; `python -m grpo_katas.training.train "
                                  "--help` says more")
    code, said = trainer("--eval-every", "-1")
    assert code == 2 and said == "error: --eval-every must be at least 0, got -1"


@pytest.mark.parametrize("width", [80, 120])
def test_the_progress_line_fits_the_terminal_and_does_not_wrap(tmp_path, width):
    from tests.cli_helpers import on_a_terminal, plain
    code, out = on_a_terminal(ROOT, ["--steps", "3", "--out", str(tmp_path / "run"), *TINY],
                              module="grpo_katas.training.train", columns=width, env={"COLUMNS": str(width)})
    lines = plain(out).splitlines()
    bar = [line for line in lines if re.match(r"step \d+/3 ", line)]
    assert code == 0 and bar and max(map(len, lines)) <= width, out
    assert ("tok/s" in bar[-1]) == (width == 120) and "reward" in bar[-1]  # as many fields as fit, in order


def test_the_log_shows_samples_and_a_held_out_reward_and_keeps_both(tmp_path):
    out = tmp_path / "run"
    code, said = trainer("--steps", "4", "--out", str(out), "--eval-every", "2", "--samples", "2", *TINY)
    lines = said.splitlines()
    held = [line.split()[2] for line in lines if line.startswith("           held-out reward")]
    assert code == 0 and len(held) == 2 and re.search(r"held-out reward [\d.]+ \(step 2\) -> [\d.]+ \(step 4\)", said)
    assert any(re.match(r" +'\d+=' -> '.*' \(reward [\d.]+\)$", line) for line in lines), said
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval_reward_mean" in m] == [2, 4]
    assert f"{metrics[-1]['eval_reward_mean']:.3f}" == held[-1]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and set(samples[0]) == {"step", "prompt", "completion", "reward"}
    assert "TensorBoard: not installed" in said or (out / "tensorboard").is_dir()


def test_the_held_out_evaluation_leaves_the_training_as_it_was():
    """Its prompts come from a stream of their own and its sampling from a generator of its own."""
    plain_run = Trainer(RunConfig(**SMALL)).fit()
    evaluated = Trainer(RunConfig(**SMALL), eval_every=1, eval_prompts=4).fit()
    assert [h["reward_mean"] for h in plain_run] == [h["reward_mean"] for h in evaluated]
    assert all("eval_reward_mean" in h for h in evaluated) and "eval_reward_mean" not in plain_run[0]
    first = Trainer(RunConfig(**SMALL), eval_prompts=4)
    assert first.evaluate() == first.evaluate()  # the same prompts and samples each time: numbers that compare


class FakeWriter:
    """torch.utils.tensorboard.SummaryWriter as the trainer uses it."""

    def __init__(self, log_dir=None):
        self.log_dir, self.scalars, self.closed = log_dir, [], False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        self.closed = True


def test_metrics_go_to_tensorboard_where_it_is_installed(tmp_path, monkeypatch):
    import types

    from grpo_katas.training.train import tensorboard_writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    writer, note = tensorboard_writer(tmp_path / "tensorboard")
    assert isinstance(writer, FakeWriter) and note is None and writer.log_dir == str(tmp_path / "tensorboard")
    Trainer(RunConfig(**{**SMALL, "steps": 2}), tmp_path, eval_every=2, eval_prompts=4, writer=writer).fit()
    tags = {(tag, step) for tag, _, step in writer.scalars}
    assert {("train/reward_mean", 1), ("train/kl", 2), ("train/loss", 2), ("eval/reward_mean", 2)} <= tags
    assert writer.closed and all(isinstance(v, (int, float)) for _, v, _ in writer.scalars)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails: not installed
    writer, note = tensorboard_writer(tmp_path / "tensorboard")
    assert writer is None and note.startswith("TensorBoard: not installed") and len(note.splitlines()) == 1
