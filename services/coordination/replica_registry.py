"""Which replicas of a group are alive, and what each could recover from.

Every replica keeps one key, `<prefix>replicas/<its address>`, under a lease of its
own: the value is the position of the oldest snapshot it keeps on its disk, and the
state-machine versions its build implements (the leader logs a switch to a version
only once every live replica implements it: `services/runtime/upgrades.py`). The
leader deletes log records only below the lowest such position (`truncation_floor`),
so a live replica that restarts always finds the records after its snapshot. A
replica that is gone longer than the lease loses its say: the log is truncated
past it, and when it comes back it installs a snapshot from a peer
(`services/runtime/snapshot_transfer.py`), which the same keys name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

import structlog

from services.coordination.errors import CoordinationUnavailable, LeaseLost
from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import GroupKeys

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaEntry:
    address: str
    snapshot_position: int  # the oldest snapshot it keeps; 0: none yet
    # The state-machine versions its build implements (a build from before versions
    # wrote none: it implements version 1 only).
    implemented_versions: tuple[int, ...] = (1,)


class ReplicaRegistry:
    def __init__(
        self,
        session: EtcdSession,
        keys: GroupKeys,
        address: str,
        *,
        ttl_s: int,
        implemented_versions: frozenset[int] = frozenset({1}),
    ) -> None:
        self.session = session
        self.keys = keys
        self.address = address
        self.ttl_s = ttl_s
        self.implemented_versions = tuple(sorted(implemented_versions))
        self.key = keys.replicas + address.encode()
        self.lease = 0
        self.snapshot_position = 0

    async def join(self, snapshot_position: int) -> None:
        self.lease = await self.session.grant_lease(self.ttl_s)
        await self.publish(snapshot_position)

    async def publish(self, snapshot_position: int) -> None:
        self.snapshot_position = snapshot_position
        value = json.dumps(
            {
                "snapshot_position": snapshot_position,
                "implemented_versions": list(self.implemented_versions),
            }
        ).encode()
        await self.session.put(self.key, value, lease=self.lease)

    async def keep(self) -> None:
        """Keep the entry alive; a lease etcd let go is taken again (the entry then
        reappears: this replica still holds what it said)."""
        interval_s = self.ttl_s / 3
        renewed_at = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            try:
                if await self.session.keep_alive(self.lease) > 0:
                    renewed_at = time.monotonic()
                    continue
                log.warning("replica_registry.lease_gone", key=self.key.decode())
                await self.join(self.snapshot_position)
            except CoordinationUnavailable as error:
                if time.monotonic() - renewed_at > self.ttl_s:
                    log.warning("replica_registry.unrenewed", error=str(error))

    async def leave(self) -> None:
        if self.lease:
            with contextlib.suppress(CoordinationUnavailable, LeaseLost):
                await self.session.revoke_lease(self.lease)
            self.lease = 0

    async def members(self) -> list[ReplicaEntry]:
        entries = await self.session.range(self.keys.replicas, prefix_end(self.keys.replicas))
        found = []
        for entry in entries:
            try:
                value = json.loads(entry.value)
                position = int(value["snapshot_position"])
                versions = tuple(int(v) for v in value.get("implemented_versions", (1,)))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not ours to read: it holds nothing back
            address = entry.key[len(self.keys.replicas) :].decode()
            found.append(ReplicaEntry(address, position, versions))
        return sorted(found, key=lambda member: member.address)

    async def truncation_floor(self) -> int:
        """The log may lose every record at or below this position: each live replica
        holds a snapshot at or after it. 0 while any of them holds none."""
        members = await self.members()
        if not members:
            return 0
        return min(member.snapshot_position for member in members)
