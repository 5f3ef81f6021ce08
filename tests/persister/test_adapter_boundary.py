"""Only the PostgreSQL adapter (persister/store.py) imports asyncpg; its errors leave it
translated into the persister's own error tree."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncpg

from persister.errors import ConflictError, RowRejected, StoreError, StoreUnavailable
from persister.store import translate

PACKAGE = Path(__file__).resolve().parents[2] / "persister"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_store_imports_asyncpg() -> None:
    importers = sorted(path.name for path in PACKAGE.rglob("*.py") if "asyncpg" in _imports(path))
    assert importers == ["store.py"]


def test_asyncpg_errors_map_to_our_tree() -> None:
    assert isinstance(translate(asyncpg.UniqueViolationError("dup")), ConflictError)
    assert isinstance(translate(asyncpg.CheckViolationError("check")), RowRejected)
    assert isinstance(translate(asyncpg.NumericValueOutOfRangeError("range")), RowRejected)
    assert isinstance(translate(asyncpg.DataError("argument")), RowRejected)
    assert isinstance(translate(ConnectionRefusedError()), StoreUnavailable)
    assert isinstance(translate(asyncpg.ConnectionDoesNotExistError("gone")), StoreUnavailable)
    assert isinstance(translate(asyncpg.DeadlockDetectedError("deadlock")), StoreUnavailable)
    other = translate(asyncpg.UndefinedTableError("no table"))
    assert type(other) is StoreError
