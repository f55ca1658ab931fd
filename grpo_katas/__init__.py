"""grpo-katas tooling: the catalogue, the check runner, verification, the practice CLI, grading, the trainer."""
import warnings
from pathlib import Path

# numpy is not a dependency; torch says so on import, once per process, and it means nothing here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "solutions" / "grpo.py"
KATAS = ROOT / "katas"
CHECKS = ROOT / "checks"


class UserError(Exception):
    """Something the user can fix: the CLI shows it as one line and exits with status 2."""
