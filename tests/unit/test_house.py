"""The house rules that keep the code legible, checked on the source: short functions, no import cycle
between packages, a trainer that does not import most of the package, and a config reference that is
generated from the dataclasses (docs/config.md never drifts)."""
import ast
from pathlib import Path

import pytest

from turbotrain.config import config_reference

SRC = Path(__file__).resolve().parents[2] / "src" / "turbotrain"
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


def _imports(tree: ast.Module) -> set[str]:
    """turbotrain modules imported anywhere in the module (top level and inside functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("turbotrain"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("turbotrain"))
    return found


def test_no_function_is_longer_than_60_lines():
    long = [f"{name}.{n.name}: {n.end_lineno - n.lineno + 1} lines" for name, tree in _modules().items()
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_no_import_cycle_between_packages():
    """Subpackages (accel, data, distributed, models, monitor) depend on each other without a cycle."""
    mods = _modules()
    pkgs = {m.split(".")[1] for m in mods if m.count(".") >= 2}
    edges = {p: set() for p in pkgs}
    for name, tree in mods.items():
        src = name.split(".")[1] if name.count(".") >= 1 else None
        if src not in pkgs:
            continue
        for imp in _imports(tree):
            parts = imp.split(".")
            if len(parts) > 1 and parts[1] in pkgs and parts[1] != src:
                edges[src].add(parts[1])

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = [p for p in pkgs if p in reach(p)]
    assert not cycles, {p: sorted(edges[p]) for p in cycles}


def test_the_trainer_imports_few_modules():
    mods = _modules()
    own = {i for i in _imports(mods["turbotrain.trainer"]) if i in mods}
    assert len(own) <= 12, sorted(own)
    assert len(own) < len(mods) / 4


def test_config_reference_is_generated_and_current():
    path = SRC.parents[1] / "docs" / "config.md"
    assert path.read_text() == config_reference() + "\n", (
        "docs/config.md drifted from the config dataclasses; regenerate it: "
        "turbotrain config --reference > docs/config.md")


@pytest.mark.parametrize("section", ["run", "model", "data", "train", "precision", "compile", "memory", "kernels",
                                     "parallel", "monitor", "checkpoint"])
def test_every_key_is_documented(section):
    text = config_reference()
    block = text.split(f"## [{section}]")[1].split("## [")[0]
    rows = [r for r in block.splitlines() if r.startswith("| `")]
    assert rows and all(not r.rstrip().endswith("|  |") for r in rows), block
