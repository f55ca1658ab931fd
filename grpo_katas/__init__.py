"""grpo-katas tooling: the catalogue, the check runner, verification, the practice CLI, grading, the trainer."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "solutions" / "grpo.py"
KATAS = ROOT / "katas"
CHECKS = ROOT / "checks"


class UserError(Exception):
    """Something the user can fix: the CLI shows it as one line and exits with status 2."""
