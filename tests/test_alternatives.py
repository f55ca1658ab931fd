"""The checks pass a correct implementation written nothing like the reference. Run: pytest tests/test_alternatives.py"""
import subprocess
import sys

import pytest

from grpo_katas import ROOT

ALTERNATIVE = ROOT / "tests" / "alternatives" / "loop_grpo.py"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_differently_written_correct_grpo_passes_every_check(seed):
    r = subprocess.run([sys.executable, "-m", "pytest", "checks", "-q", "-p", "no:cacheprovider",
                        f"--target={ALTERNATIVE}", f"--seed={seed}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
