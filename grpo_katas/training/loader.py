"""Import a GRPO loop in this process, turning every way it can fail at import into one TargetError line that
names the file and line. For running a loop (`make run`, `make train`), never for judging one: the checks import
targets only in a worker process (grpo_katas/judge)."""
import hashlib
import importlib.util
import os
import signal
import sys
import traceback
from pathlib import Path


IMPORT_TIMEOUT_S = int(os.environ.get("GRPO_KATAS_IMPORT_TIMEOUT", "30"))


class TargetError(Exception):
    """A target file that cannot be loaded; the message names the file and line."""


def _where(exc: BaseException, path: Path) -> str:
    """file:line of the deepest frame inside the target file (or of the syntax error)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else str(path)


def _on_alarm(signum, frame):
    raise TimeoutError(f"importing it took longer than {IMPORT_TIMEOUT_S} s")


def load_target(path) -> object:
    """Import a file as a fresh module, turning every way it can fail into one TargetError line."""
    path = Path(path).resolve()
    if not path.is_file():
        raise TargetError(f"{path}: no such file")
    name = "grpo_target_" + hashlib.sha1(str(path).encode()).hexdigest()[:10]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(IMPORT_TIMEOUT_S)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise TargetError(f"{_where(exc, path)}: the file exits at import (SystemExit({exc.code!r}))") from None
    except BaseException as exc:  # a broken submission can raise anything, KeyboardInterrupt included
        detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise TargetError(f"{_where(exc, path)}: {type(exc).__name__}: {detail}") from None
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    sys.modules[name] = module
    return module
