"""A replica's snapshot, sent to a peer that has none recent enough (chunked, checksummed).

Every replica serves `oms.v1.ReplicaSnapshots/Fetch`: its newest published local
snapshot file (or the one it keeps for its egress floor, when that one is recent
enough), as of one log position, in chunks of `CHUNK_BYTES`, with a SHA-256
of the whole on the last chunk. A replica that starts with an empty disk, or with a
snapshot older than the oldest record the etcd log still holds, asks the live
peers the replica registry names (the most advanced first), writes what it
receives to a staging file, checks the digest and the file's own checksum and
position, and only then publishes it where recovery looks. A peer that fails
mid-transfer costs only that attempt.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import structlog

from protos.oms.v1 import replica_pb2
from services.clients.channels import mesh_channel
from services.coordination.replica_registry import ReplicaEntry
from services.runtime.core.snapshot_policy import floor_snapshot
from services.runtime.file_log import fsync_directory
from services.runtime.snapshot_files import (
    FileSnapshotStore,
    SnapshotCorruptedError,
    read_snapshot_file,
)

log = structlog.get_logger(__name__)
SERVICE_NAME = "oms.v1.ReplicaSnapshots"
CHUNK_BYTES = 1024 * 1024
FETCH_TIMEOUT_S = 120.0


class SnapshotInstallError(RuntimeError):
    """No live peer could send a snapshot recent enough."""


class SnapshotServer:
    def __init__(
        self, snapshots: FileSnapshotStore, egress_floor: Callable[[], int | None] | None = None
    ) -> None:
        self.snapshots = snapshots
        # The machine's egress floor: the snapshot sent is the newest at or before it
        # when one is recent enough, so the peer's egress covers what the persister
        # still needs (`core/snapshot_policy.py`); else the newest.
        self._egress_floor = egress_floor
        self.sent = 0

    async def fetch(
        self, request: replica_pb2.SnapshotRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[replica_pb2.SnapshotChunk]:
        positions = [p for p in self.snapshots.positions() if p >= request.min_position]
        if not positions:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no snapshot at or after {request.min_position}"
            )
        position = positions[-1]
        floor = self._egress_floor() if self._egress_floor is not None else None
        if floor is not None:
            position = floor_snapshot(positions, floor) or position
        try:
            # Opened once: a prune that unlinks the file meanwhile leaves this copy readable.
            with self.snapshots.path_for(position).open("rb") as source:
                total = os.fstat(source.fileno()).st_size
                digest = hashlib.sha256()
                offset = 0
                while True:
                    data = await asyncio.to_thread(source.read, CHUNK_BYTES)
                    digest.update(data)
                    last = offset + len(data) >= total
                    yield replica_pb2.SnapshotChunk(
                        position=position,
                        total_bytes=total,
                        offset=offset,
                        data=data,
                        sha256=digest.digest() if last else b"",
                    )
                    offset += len(data)
                    if last:
                        break
        except FileNotFoundError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"snapshot {position} was pruned")
        self.sent += 1
        log.info("snapshot_transfer.sent", position=position, total_bytes=total)

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_stream_rpc_method_handler(
            self.fetch,
            request_deserializer=replica_pb2.SnapshotRequest.FromString,
            response_serializer=replica_pb2.SnapshotChunk.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {"Fetch": handler}),)
        )


async def install_from_peers(
    peers: Sequence[ReplicaEntry], snapshots: FileSnapshotStore, min_position: int
) -> int:
    """Fetch and publish a snapshot at `min_position` or later; its position."""
    failures = []
    for peer in sorted(peers, key=lambda member: -member.snapshot_position):
        try:
            position = await _fetch(peer.address, snapshots, min_position)
        except (grpc.aio.AioRpcError, SnapshotCorruptedError, OSError) as error:
            failures.append(f"{peer.address}: {error!r}")
            log.warning("snapshot_transfer.peer_failed", peer=peer.address, error=repr(error))
            continue
        log.info("snapshot_transfer.installed", peer=peer.address, position=position)
        return position
    raise SnapshotInstallError(
        f"no peer sent a snapshot at or after {min_position}: {failures or 'no live peer'}"
    )


async def _fetch(address: str, snapshots: FileSnapshotStore, min_position: int) -> int:
    method = f"/{SERVICE_NAME}/Fetch"
    async with mesh_channel(address) as channel:
        call = channel.unary_stream(
            method,
            request_serializer=replica_pb2.SnapshotRequest.SerializeToString,
            response_deserializer=replica_pb2.SnapshotChunk.FromString,
        )(replica_pb2.SnapshotRequest(min_position=min_position), timeout=FETCH_TIMEOUT_S)
        position = 0
        staging = None
        digest = hashlib.sha256()
        received = 0
        try:
            async for chunk in call:
                if staging is None:
                    position = int(chunk.position)
                    if position < min_position:
                        raise SnapshotCorruptedError(f"{address} sent position {position}")
                    staging = snapshots.staging_path(position).open("wb")
                if chunk.position != position or chunk.offset != received:
                    raise SnapshotCorruptedError(f"{address}: chunk out of order")
                staging.write(chunk.data)
                digest.update(chunk.data)
                received += len(chunk.data)
                if chunk.sha256:
                    if received != chunk.total_bytes or chunk.sha256 != digest.digest():
                        raise SnapshotCorruptedError(f"{address}: digest or size mismatch")
                    staging.flush()
                    os.fsync(staging.fileno())
                    staging.close()
                    staging = None
                    path = snapshots.staging_path(position)
                    # The file's own checksum and position, as recovery will read it.
                    await asyncio.to_thread(read_snapshot_file, path, position)
                    snapshots.publish(position)
                    fsync_directory(snapshots.directory)
                    return position
            raise SnapshotCorruptedError(f"{address} ended the transfer early")
        except BaseException:
            if staging is not None:
                staging.close()
            if position:
                snapshots.discard_staged(position)
            raise
