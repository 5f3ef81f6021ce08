"""Which shard cluster serves a user, and sending a command there until one owns it.

`Routing` answers `route(user)` with a cluster and the epoch it was decided under:
`StaticRouting` puts every user on one cluster at epoch 0 (a mesh of one shard), and
`EtcdRouting` (`etcd_routing.py`) follows the routing document in etcd.
`ShardRouter.execute` stamps the epoch on the command and sends it; the shard, the
routing authority, answers NOT_OWNER with its own epoch when the user is not its own,
having changed nothing, so the same command (same ids) goes again as
`gateway/core/rerouting.py` decides (a lagging shard asked again in a moment, else
routed again once a newer epoch is known), or the user is in transit (a wave is
moving it): wait for the next epoch.

All within `reroute_s`; past it the last answer (NOT_OWNER, retryable) or UNAVAILABLE
goes to the client, which retries with the same ids.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from gateway.clusters import ShardCluster
from gateway.core.refusals import unavailable
from gateway.core.rerouting import NotOwnerStep, after_not_owner
from gateway.statistics import GatewayCounters
from protos.oms.v1 import shard_pb2

LAGGING_SHARD_WAIT_S = 0.02


@dataclass(frozen=True, slots=True)
class ShardRoute:
    cluster: ShardCluster | None  # None: the user is in transit under this epoch
    epoch: int


class Routing(Protocol):
    @property
    def epoch(self) -> int:
        """The epoch routed by now (0: static, or no document yet)."""
        ...

    def route(self, user_id: int) -> ShardRoute:
        """The user's cluster under the current epoch (UNAVAILABLE before any epoch)."""
        ...

    def clusters(self) -> tuple[ShardCluster, ...]:
        """Every cluster of the current epoch."""
        ...

    async def newer_epoch(self, epoch: int) -> bool:
        """Whether routing has moved past `epoch` (after waiting briefly for it to)."""
        ...

    async def run(self) -> None:
        """Follow the routing's source while the gateway runs."""
        ...

    async def changed(self) -> None:
        """Returns when the epoch changes (never, for static routing)."""
        ...

    async def close(self) -> None: ...


class StaticRouting:
    """One cluster for every user (a single-shard mesh), epoch 0."""

    def __init__(self, cluster: ShardCluster) -> None:
        self._route = ShardRoute(cluster, 0)

    @property
    def epoch(self) -> int:
        return 0

    def route(self, user_id: int) -> ShardRoute:
        return self._route

    def clusters(self) -> tuple[ShardCluster, ...]:
        assert self._route.cluster is not None
        return (self._route.cluster,)

    async def newer_epoch(self, epoch: int) -> bool:
        return False

    async def run(self) -> None:
        """Nothing to follow: waits until the gateway stops (a loop of the service host
        must not return)."""
        await asyncio.Event().wait()

    async def changed(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        """Nothing to release."""


class ShardRouter:
    def __init__(self, routing: Routing, counters: GatewayCounters, *, reroute_s: float) -> None:
        self.routing = routing
        self.counters = counters
        self.reroute_s = reroute_s

    async def cluster(self, user_id: int) -> ShardCluster:
        """The user's cluster now, waiting (within `reroute_s`) while it is in transit."""
        deadline = asyncio.get_running_loop().time() + self.reroute_s
        return (await self._owned(user_id, deadline))[0]

    async def _owned(self, user_id: int, deadline: float) -> tuple[ShardCluster, int]:
        """The user's cluster and the epoch that says so."""
        loop = asyncio.get_running_loop()
        while True:
            route = self.routing.route(user_id)
            if route.cluster is not None:
                return route.cluster, route.epoch
            self.counters.add("routing_in_transit_waits")
            if not await self.routing.newer_epoch(route.epoch) and loop.time() >= deadline:
                raise unavailable(
                    f"user {user_id} is moving between shards (epoch {route.epoch}): retry"
                )

    async def execute(self, user_id: int, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reroute_s
        which = command.WhichOneof("command")
        while True:
            cluster, epoch = await self._owned(user_id, deadline)
            if which == "place":
                command.place.routing_epoch = epoch
            elif which == "cancel":
                command.cancel.routing_epoch = epoch
            result = await cluster.shard.execute(command)
            if result.reject_reason != shard_pb2.SHARD_REJECT_REASON_NOT_OWNER:
                return result
            self.counters.add("shard_not_owner")
            step = after_not_owner(
                shard_epoch=result.routing_epoch,
                routed_epoch=epoch,
                budget_spent=loop.time() >= deadline,
            )
            if step is NotOwnerStep.ANSWER:
                return result
            if step is NotOwnerStep.ASK_AGAIN:
                self.counters.add("shard_epoch_behind")
                await asyncio.sleep(LAGGING_SHARD_WAIT_S)
            elif not await self.routing.newer_epoch(epoch):
                return result  # routing did not move past ours: nothing to re-route by
