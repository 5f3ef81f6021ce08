"""Fixtures: a shard, matchers g1 and g2, a bridge and a (not yet started) reconciler.

Each test gets its own processes (the tests stop and restart the bridge and
inject drift), and every process is reaped at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bridge.mesh import MeshProcesses
from tests.reconciler.reconciler_process import ReconcilerProcess


@dataclass
class ReconciledMesh:
    processes: MeshProcesses
    reconciler: ReconcilerProcess


@pytest.fixture
def new_reconciled_mesh(tmp_path: Path) -> Iterator[Callable[..., ReconciledMesh]]:
    made: list[MeshProcesses] = []

    def make(
        *,
        matcher_environment: Mapping[str, Mapping[str, str]] | None = None,
        reconciler_environment: Mapping[str, str] | None = None,
    ) -> ReconciledMesh:
        folder = tmp_path / f"mesh-{len(made) + 1}"
        processes = MeshProcesses.create(folder, matcher_environment=matcher_environment)
        made.append(processes)
        reconciler = ReconcilerProcess(
            folder / "reconciler",
            shard_address=processes.shard.address,
            matchers=processes.matcher_addresses,
            environment=reconciler_environment,
        )
        processes.extra.append(reconciler)
        return ReconciledMesh(processes, reconciler)

    try:
        yield make
    finally:
        for processes in made:
            processes.stop()
