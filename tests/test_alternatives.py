"""The checks pass a correct implementation written nothing like the reference. Run: pytest tests/test_alternatives.py"""
import subprocess
import sys

from grpo_katas import ROOT

ALTERNATIVE = ROOT / "tests" / "alternatives" / "loop_grpo.py"


def test_a_differently_written_correct_grpo_passes_every_check_at_three_seeds():
    r = subprocess.run([sys.executable, "-m", "pytest", "checks", "-q", "-p", "no:cacheprovider",
                        f"--target={ALTERNATIVE}", "--seed=0", "--seed=1", "--seed=2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "364 passed" in r.stdout, r.stdout[-4000:]
