"""The house: grpo_katas in packages by concern, each a floor above the one before, and no module in a circle.

Read from the code's own imports (every `import`, at the top or inside a function): a package imports only
itself and the floors below it, and no chain of imports leads a module back to itself. Run: pytest
tests/test_house.py
"""
import ast
from pathlib import Path

from grpo_katas import ROOT
from grpo_katas.judge.sandbox import RUN_FILES

FLOORS = ["training", "catalogue", "judge", "proof", "practice"]  # the ground first; grpo_katas/__init__ under all


def modules() -> dict:
    """module name -> the grpo_katas modules it imports."""
    out = {}
    for path in sorted((ROOT / "grpo_katas").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "grpo_katas":
                for alias in node.names:  # `from grpo_katas.judge import sandbox`: the module, where it is one
                    full = f"{node.module}.{alias.name}"
                    out[name].add(full if module_path(full).exists() else node.module)
            elif isinstance(node, ast.Import):
                out[name] |= {a.name for a in node.names if a.name.split(".")[0] == "grpo_katas"}
        out[name].discard(name)
    return out


def module_path(name: str) -> Path:
    path = ROOT.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def floor(name: str) -> int:
    parts = name.split(".")
    return FLOORS.index(parts[1]) + 1 if len(parts) > 1 and parts[1] in FLOORS else 0


def test_every_module_lives_in_a_package_by_concern():
    loose = [m for m in modules() if m.count(".") == 1 and m.split(".")[1] not in FLOORS]
    assert not loose, f"modules outside the packages {FLOORS}: {loose}"


def test_no_package_imports_one_on_a_floor_above_it():
    up = sorted(f"{m} -> {d}" for m, deps in modules().items() for d in deps if floor(d) > floor(m))
    assert not up, "imports that run back up (" + " < ".join(FLOORS) + "): " + "; ".join(up)


def test_no_module_is_in_a_circle():
    graph, circles = modules(), []
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                circles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"
    for m in graph:
        if m not in state:
            visit(m, [m])
    assert not circles, f"circles: {circles}"


def test_what_a_run_s_sandbox_binds_imports_nothing_it_does_not_bind():
    """The run's sandbox holds RUN_FILES alone of grpo_katas: an import of anything else fails there."""
    graph = modules()
    bound = {".".join(Path(f).with_suffix("").parts).removesuffix(".__init__") for f in RUN_FILES}
    missing = sorted(f"{m} -> {d}" for m in bound for d in graph[m] if d not in bound)
    assert not missing, f"a run's sandbox lacks what its files import: {missing}"
