"""The simulated mesh draws randomness only from its seeded `random.Random`.

import-linter keeps clocks, I/O, threads and event loops out of `simulation/core`
(`.importlinter`, simulation-deterministic); this reads the source for what an import
graph cannot see: the module-level `random` functions (a process-wide, unseeded
generator), and `hash()`/`id()`, which differ from one process to the next.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "simulation" / "core"


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_no_unseeded_randomness_nor_per_process_values(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            if (
                isinstance(function, ast.Attribute)
                and isinstance(function.value, ast.Name)
                and function.value.id == "random"
                and function.attr != "Random"
            ):
                found.append(f"line {node.lineno}: random.{function.attr}()")
            if isinstance(function, ast.Name) and function.id in {"hash", "id", "open"}:
                found.append(f"line {node.lineno}: {function.id}()")
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            found.append(f"line {node.lineno}: from random import ...")
    assert not found, f"{path.name}: {found}"
