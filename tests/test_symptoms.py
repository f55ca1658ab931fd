"""The numbers a brief cites are the numbers `make run` shows. Run: pytest tests/test_symptoms.py"""
import json
import subprocess
import sys

import pytest

from grpo_katas import ROOT
from grpo_katas.catalogue import find_kata
from grpo_katas.symptoms import run_loop


@pytest.mark.slow
def test_make_run_shows_the_run_the_symptoms_were_measured_on():
    """Float sums differ with torch's thread count, and over 40 steps so does the whole run: the runner behind
    make run and the symptom runs both use one thread, whatever the machine has (this one has two)."""
    kata = find_kata(14)
    settings = {**kata.run, "steps": 40}
    measured = [h["reward_mean"] for h in run_loop(kata.loop, settings).history]
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "grpo_katas.runner", str(kata.loop), "--steps", "40",
                          "--seed", str(kata.run["seed"]), "--set", *kata.settings],
                         cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    shown = [e["reward_mean"] for e in map(json.loads, out.splitlines()) if e.get("event") == "step"]
    assert shown == measured
