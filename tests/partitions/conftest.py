"""Fixtures: a whole mesh of real processes per test, always reaped (its database dropped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.full_mesh import FullMesh, running_mesh


@pytest.fixture
def mesh(tmp_path: Path, database_url: str) -> Iterator[FullMesh]:
    with running_mesh(tmp_path / "mesh", database_url) as mesh:
        yield mesh
