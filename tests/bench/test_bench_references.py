"""Every name one benchmark takes from another exists.

The benchmarks are not type-checked (they are scripts, not the product), so a helper moved
or renamed in one of them used to break another only when that one ran: CI once failed an
hour in because `bench.agent_loop` still called a function `bench.sandbox_api` had handed to
`bench.procs`. This reads each module's syntax tree and checks, in a second, that every
`from bench.x import y` and every `x.y` on an imported bench module resolves."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def references(tree: ast.Module) -> list[tuple[str, str, int]]:
    """(module, attribute, line) for each name this module takes from a bench module."""
    aliases: dict[str, str] = {}
    found: list[tuple[str, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            for name in node.names:
                aliases[name.asname or name.name] = f"bench.{name.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
            found += [(str(node.module), name.name, node.lineno) for name in node.names]
        elif isinstance(node, ast.Import):
            for name in node.names:
                if name.name.startswith("bench.") and name.asname:
                    aliases[name.asname] = name.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append((aliases[node.value.id], node.attr, node.lineno))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_names_taken_from_other_benchmarks_exist(name: str) -> None:
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    missing = [
        f"bench/{name}.py:{line}: {module}.{attr}"
        for module, attr, line in references(tree)
        if not hasattr(importlib.import_module(module), attr)
    ]
    assert not missing, "names that do not exist:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_name() -> None:
    tree = ast.parse(
        "from bench import procs as p\nfrom bench.procs import start, nowhere\np.gone(1)\n"
    )
    refs = references(tree)
    assert ("bench.procs", "nowhere", 2) in refs and ("bench.procs", "gone", 3) in refs
    absent = [r for r in refs if not hasattr(importlib.import_module(r[0]), r[1])]
    assert [a for _, a, _ in absent] == ["nowhere", "gone"]
