"""Fixtures for the repository's own tests (the checks' plugin is the top-level conftest.py)."""
import shutil
import subprocess

import pytest

from grpo_katas import ROOT


@pytest.fixture
def repo(tmp_path):
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, tmp_path / f)
    return tmp_path
