"""Where a service reaches a shard or a matcher group: a fixed address, or its leader's.

A setting that names an address takes either `host:port` or the word `etcd`: the
group's current leader, as its leader key in etcd names it. Callers ask
`resolve()` each time they (re)connect; leadership changes break their streams
(the old leader dies or refuses: `LeaderGate`), so that is when they need the new
address. An answer is reused for `CACHE_S` so a burst of reconnects costs one read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys
from services.coordination.leadership import current_leader

FROM_ETCD = "etcd"
CACHE_S = 0.2


class NoLeaderError(CoordinationUnavailable):
    """The group has no leader right now (an election is under way): retry."""


class AddressSource(Protocol):
    async def resolve(self) -> str:
        """The address to connect to now (raises `CoordinationUnavailable` if unknown)."""
        ...

    def describe(self) -> str:
        """What the setting said, for logs and status."""
        ...

    async def close(self) -> None: ...


class FixedAddress:
    def __init__(self, address: str) -> None:
        self.address = address

    async def resolve(self) -> str:
        return self.address

    def describe(self) -> str:
        return self.address

    async def close(self) -> None:
        """Nothing to release."""


class LeaderAddress:
    """The address the holder of `kind/name`'s leader key advertises."""

    def __init__(self, etcd_endpoints: Sequence[str], mesh_id: str, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        self.key = GroupKeys.of(mesh_id, kind, name).leader
        self._session = EtcdSession(etcd_endpoints)
        self._cached = ""
        self._cached_at = float("-inf")
        self.lookups = 0

    async def resolve(self) -> str:
        now = time.monotonic()
        if self._cached and now - self._cached_at < CACHE_S:
            return self._cached
        self.lookups += 1
        record = await current_leader(self._session, self.key)
        if record is None:
            self._cached = ""
            raise NoLeaderError(f"{self.kind} {self.name} has no leader right now")
        self._cached, self._cached_at = record.holder, now
        return record.holder

    def describe(self) -> str:
        return f"the leader of {self.kind} {self.name} ({self._cached or 'not yet known'})"

    async def close(self) -> None:
        await self._session.close()


def address_source(
    setting: str, *, kind: str, name: str, etcd_endpoints: Sequence[str], mesh_id: str
) -> AddressSource:
    """`setting` as a source: `host:port`, or `etcd` (needs etcd endpoints)."""
    if setting != FROM_ETCD:
        return FixedAddress(setting)
    if not etcd_endpoints:
        raise ValueError(f"{kind} {name}: the address says etcd, but no etcd endpoints are set")
    return LeaderAddress(etcd_endpoints, mesh_id, kind, name)
