"""A drill drawn and filed in work/drills/dN/ (practice/drills.py draws, proves and files it), read back as a
Kata: `make check N=d3`, `make grade N=d3` and the judge name one by its key. drill.json holds the recipe sealed
(compressed and encoded: out of sight, not secret)."""
import base64
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from grpo_katas import WORK
from grpo_katas.catalogue.katas import RUN_DEFAULTS, CatalogueError, Kata


DRILLS = WORK / "drills"
DRILL_RUN = {**RUN_DEFAULTS, "steps": 30}


def is_drill(key) -> bool:
    return bool(re.fullmatch(r"\s*[dD]\d{1,4}\s*", str(key or "")))


@dataclass(frozen=True)
class Drill(Kata):
    """A drawn drill, handled as a kata: key dN, pristine files in work/drills/dN/, your copy in work/dN-drill/."""
    seed: int | None = None

    @property
    def name(self) -> str:
        return f"{self.path.name}-drill"  # a drill made before the names were dN everywhere keeps its dNN


def folder(number: int) -> Path:
    legacy = DRILLS / f"d{number:02d}"
    return legacy if legacy.is_dir() and not (DRILLS / f"d{number}").exists() else DRILLS / f"d{number}"


def seal(obj) -> str:
    return base64.b64encode(zlib.compress(json.dumps(obj).encode())).decode()


def unseal(text: str):
    return json.loads(zlib.decompress(base64.b64decode(text)))


def load(key) -> Drill:
    """The drill a user named (d3), as a Kata."""
    number = int(str(key).strip()[1:])
    meta = folder(number) / "drill.json"
    if not meta.exists():
        made = sorted({int(p.name[1:]) for p in DRILLS.iterdir() if is_drill(p.name) and (p / "drill.json").exists()}
                      if DRILLS.is_dir() else [])
        raise CatalogueError(f"there is no drill d{number}" + (f"; yours: {', '.join(f'd{n}' for n in made)}"
                                                               if made else "; draw one with `make drill`"))
    try:
        d = json.loads(meta.read_text())
        recipe = unseal(d["sealed"]) if "sealed" in d else d  # drills made before sealing hold it in the open
        return Drill(number, "drill", f"Drill d{number}", d["tier"], d["minutes"], recipe["codebase"],
                     tuple(recipe["bugs"]), tuple(recipe["hints"]), tuple(d["symptoms"]),
                     {**DRILL_RUN, "set": dict(d.get("set", {}))}, folder(number),
                     drill=True, seed=recipe.get("seed"))
    except (OSError, ValueError, KeyError, TypeError, zlib.error) as exc:
        raise CatalogueError(f"{meta} cannot be read ({type(exc).__name__}: {exc}); draw a new drill with "
                             f"`make drill`") from None


def made() -> list:
    """Every drill in work/drills/ that can be read, in order (make list shows them after the katas)."""
    numbers = sorted(int(p.name[1:]) for p in DRILLS.iterdir() if is_drill(p.name)) if DRILLS.is_dir() else []
    out = []
    for n in numbers:
        try:
            out.append(load(f"d{n}"))
        except CatalogueError:
            continue  # a drill.json that cannot be read is named when that drill is asked for
    return out
