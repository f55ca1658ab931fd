"""The checks' pytest plugin: targets that cannot be loaded get one clear line. Run: pytest tests/test_conftest.py"""
import subprocess
import sys

import pytest

from grpo_katas import ROOT

BROKEN = {
    "syntax": ("def f(:\n    pass\n", "SyntaxError", ":1"),
    "import": ("import no_such_module_here\n", "ModuleNotFoundError", ":1"),
    "exit": ("import sys\nsys.exit(3)\n", "SystemExit(3)", ":2"),
    "raise": ("x = 1\nraise RuntimeError('boom')\n", "RuntimeError: boom", ":2"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_target_is_one_clear_error(tmp_path, case):
    source, expected, line = BROKEN[case]
    target = tmp_path / "grpo.py"
    target.write_text(source)
    r = subprocess.run([sys.executable, "-m", "pytest", "checks/test_kl.py", "-q", "-p", "no:cacheprovider",
                        f"--target={target}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert expected in out and f"{target}{line}" in out, out
    assert "Traceback" not in out, out


def test_the_report_header_names_target_and_seed():
    r = subprocess.run([sys.executable, "-m", "pytest", "checks/test_kl.py", "-p", "no:cacheprovider",
                        "--seed=5", "-k", "never"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "grpo-katas: target" in r.stdout and "seed 5" in r.stdout, r.stdout
