"""The trainer: overrides, the checkpoint round trip and a two-step CPU run. Run: pytest tests/test_trainer.py"""
import dataclasses
import json
import subprocess
import sys
from typing import Optional

import pytest
import torch

from grpo_katas import REFERENCE, ROOT
from grpo_katas.loader import load_target
from grpo_katas.curves import summarize
from grpo_katas.runs import RunConfig, drive, parse_overrides
from grpo_katas.trainer import Trainer
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
    from grpo_katas.catalogue import load_katas
    from grpo_katas.loader import load_target
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
    r = subprocess.run([sys.executable, "-m", "grpo_katas.trainer", "--steps", "2", "--batch-size", "4",
                        "--device", "cpu", "--set", "group_size=4", "beta=0.1", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reward" in r.stdout and (tmp_path / "metrics.jsonl").exists()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["grpo"]["beta"] == 0.1 and config["grpo"]["num_iterations"] == 2
    r = subprocess.run([sys.executable, "-m", "grpo_katas.trainer", "--set", "betta=1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown setting 'betta'" in r.stdout


@pytest.mark.slow
def test_the_gpu_check_script_runs_its_cpu_smoke_test():
    r = subprocess.run([sys.executable, "-m", "grpo_katas.gpu_check", "--device", "cpu", "--small"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "gpu-check passed" in r.stdout and "FAIL" not in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_a_step_count_below_one_is_refused_in_one_line(steps):
    r = subprocess.run([sys.executable, "-m", "grpo_katas.trainer", "--steps", steps], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and (r.stdout + r.stderr).strip() == f"error: --steps must be at least 1, got {steps}"


def test_a_truncated_checkpoint_names_the_file_and_what_to_do(tmp_path):
    Trainer(RunConfig(**{**SMALL, "steps": 2}), tmp_path).fit()
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    r = subprocess.run([sys.executable, "-m", "grpo_katas.trainer", "--out", str(tmp_path), "--resume"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**ENV, "COLUMNS": "300"})
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2 and len(out.splitlines()) == 1 and str(ckpt) in out and "delete it" in out, out


def test_every_bench_stage_reports_its_progress(monkeypatch):
    from grpo_katas import bench
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


def test_the_curves_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    from grpo_katas.curves import plot_png
    history = [{"step": i, "reward_mean": 0.1 * i, "kl": 0.01 * i, "grad_norm": 1.0} for i in range(1, 6)]
    assert plot_png({"yours": history, "reference": history[:3]}, tmp_path / "run.png", "a title")
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
