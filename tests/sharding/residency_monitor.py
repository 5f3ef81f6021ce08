"""Samples every shard's resident users and records any user resident in two at once.

One sample reads the shards one after the other there and back (s1, s2, s3, s2, s1),
each read answered at the shard's applied position and finished before the next is
sent. A user seen in X, then in Y, then in X again within one sample was resident in
X and in Y at the same time, unless it moved X -> Y -> X within those milliseconds,
which the waves cannot do (a move is two epochs in etcd and a flush to PostgreSQL;
the controller moves a user once per operation). Such a user is a `double`. A user
seen in X then Y only (a move that happened between two reads) is not evidence, and
is counted apart (`handovers`) to show the monitor does catch users moving.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from services.routing.shard_probe import ShardProbe, ShardUnreachableError

PAUSE_S = 0.005


@dataclass
class ResidencyMonitor:
    probe: ShardProbe
    clusters: Sequence[str]
    samples: int = 0
    unreachable: int = 0
    handovers: int = 0  # a user seen in two shards one after the other within a sample
    doubles: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    ever: dict[str, set[int]] = field(default_factory=dict)  # cluster -> users ever seen
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[ResidencyMonitor]:
        """Samples for as long as the block runs."""
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            self.stop.set()
            await task

    async def run(self) -> None:
        order = [*self.clusters, *reversed(self.clusters[:-1])]
        while not self.stop.is_set():
            seen: dict[int, list[str]] = {}  # user -> the clusters it was seen in, in order
            try:
                for cluster_id in order:
                    users = await self.probe.residents(cluster_id)
                    self.ever.setdefault(cluster_id, set()).update(users)
                    for user in users:
                        trail = seen.setdefault(user, [])
                        if not trail or trail[-1] != cluster_id:
                            trail.append(cluster_id)
            except ShardUnreachableError:
                self.unreachable += 1
                continue
            self.samples += 1
            for user, trail in seen.items():
                if len(trail) >= 3 and any(trail[i] == trail[i + 2] for i in range(len(trail) - 2)):
                    self.doubles.append((user, tuple(trail)))
                elif len(trail) == 2:
                    self.handovers += 1
            await asyncio.sleep(PAUSE_S)
