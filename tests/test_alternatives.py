"""The checks pass correct implementations written nothing like the reference: one with loops, one whose records
are NamedTuples (the judge must carry a tuple subclass's fields). Run: pytest tests/test_alternatives.py"""
import re
import subprocess
import sys

import pytest

from grpo_katas import ROOT

ALTERNATIVES = [ROOT / "tests" / "alternatives" / name for name in ("loop_grpo.py", "records_grpo.py")]


@pytest.mark.slow
def test_differently_written_correct_grpos_pass_every_check_at_three_seeds():
    r = subprocess.run([sys.executable, "-m", "pytest", "checks", "-q", "-p", "no:cacheprovider",
                        *[f"--target={a}" for a in ALTERNATIVES], "--seed=0", "--seed=1", "--seed=2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    summary = r.stdout.strip().splitlines()[-1]
    passed = re.fullmatch(r"(\d+) passed in .*", summary)  # nothing failed, skipped or deselected
    assert r.returncode == 0 and passed and int(passed.group(1)) % len(ALTERNATIVES) == 0, r.stdout[-4000:]
    reference = subprocess.run([sys.executable, "-m", "pytest", "checks", "-q", "-p", "no:cacheprovider",
                                "--collect-only", "--seed=0", "--seed=1", "--seed=2"], cwd=ROOT, capture_output=True,
                               text=True, timeout=600)
    assert int(passed.group(1)) == len(ALTERNATIVES) * int(re.search(r"(\d+) tests? collected",
                                                                       reference.stdout).group(1)), summary
