"""A peer's snapshot over `oms.v1.ReplicaSnapshots/Fetch`, the one its egress floor
keeps when that one is recent enough (`core/snapshot_policy.py`): a replica that had to
install a peer's state then replays from there, and the persister behind finds its rows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.coordination.replica_registry import ReplicaEntry
from services.infra.ports import LOOPBACK
from services.runtime.snapshot_files import FileSnapshotStore, Snapshot, write_snapshot_file
from services.runtime.snapshot_transfer import SnapshotServer, install_from_peers


class Floor:
    def __init__(self) -> None:
        self.position: int | None = None

    def __call__(self) -> int | None:
        return self.position


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[tuple[str, FileSnapshotStore, Floor]]:
    store = FileSnapshotStore(tmp_path / "peer", retained=2)
    for position in (100, 200, 300):
        write_snapshot_file(
            store.staging_path(position),
            Snapshot(position, position * 10, b"h" * 32, f"state at {position}".encode()),
        )
        store.publish(position, egress_floor=150)  # 100 is kept for the floor
    assert store.positions() == [100, 200, 300]
    floor = Floor()
    server = grpc.aio.server()
    SnapshotServer(store, floor).register(server)
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    await server.start()
    try:
        yield f"{LOOPBACK}:{port}", store, floor
    finally:
        await server.stop(None)


async def test_the_floors_snapshot_is_sent_when_recent_enough_else_the_newest(
    peer: tuple[str, FileSnapshotStore, Floor], tmp_path: Path
) -> None:
    address, _, floor = peer
    entries = [ReplicaEntry(address, 100)]

    async def installed(min_position: int, folder: str) -> int:
        return await install_from_peers(entries, FileSnapshotStore(tmp_path / folder), min_position)

    assert await installed(50, "no-floor") == 300  # no consumer behind: the newest
    floor.position = 150
    assert await installed(50, "floor") == 100  # the persister resumes after 150
    assert await installed(150, "too-old") == 300  # the log no longer follows 100
    floor.position = 320
    assert await installed(50, "caught-up") == 300
