"""Which shard serves a user, and the calls the gateway makes to it.

`ShardEndpoint` is one shard: the process's one shared `ShardLink` (every
client's commands leave in the same batches) plus a channel for queries and the
egress subscription. `StaticRouting` puts every user on one shard at epoch 0;
a `RoutingTable` reading epoch-versioned membership from etcd can replace it
behind the same `route` / `newer_epoch` pair. `ShardRouter.execute` stamps the
routing epoch on a command and re-routes when the shard answers NOT_OWNER and a
newer epoch exists (never with static routing: there is nowhere else to go).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import grpc

from gateway.errors import GatewayError, timed_out, unavailable
from gateway.statistics import GatewayCounters
from protos.oms.v1 import shard_pb2, shard_pb2_grpc
from services.clients.channels import mesh_channel
from services.clients.shard_link import ShardLink, ShardUnavailableError

MAX_REROUTES = 3


class ShardEndpoint:
    def __init__(self, address: str, *, timeout_s: float, counters: GatewayCounters) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.counters = counters
        self.link = ShardLink(address)
        self.links_replaced = 0
        self._retired_batches = 0
        self._retired_commands = 0
        self._closing: set[asyncio.Task[None]] = set()
        self.channel = mesh_channel(address)
        self.stub = shard_pb2_grpc.UserShardStub(self.channel)

    async def execute(self, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult:
        """The command's final result; UNAVAILABLE / TIMEOUT errors say: retry, same ids."""
        link = self.link
        try:
            async with asyncio.timeout(self.timeout_s):
                return await link.execute(command)
        except ShardUnavailableError as error:
            self.counters.add("shard_unavailable")
            self._replace_broken(link)
            raise unavailable(str(error)) from error
        except TimeoutError as error:
            self.counters.add("shard_timeouts")
            raise timed_out(
                f"shard {self.address} gave no result in {self.timeout_s:g} s"
            ) from error

    @property
    def sent_batches(self) -> int:
        return self._retired_batches + self.link.sent_batches

    @property
    def sent_commands(self) -> int:
        return self._retired_commands + self.link.sent_commands

    async def actor(self, user_id: int) -> shard_pb2.ActorView:
        try:
            view: shard_pb2.ActorView = await self.stub.GetActor(
                shard_pb2.ActorQuery(user_id=user_id), timeout=self.timeout_s
            )
            return view
        except grpc.aio.AioRpcError as error:
            raise self._query_failed("GetActor", error) from error

    async def applied_position(self) -> int:
        try:
            status = await self.stub.GetStatus(
                shard_pb2.ShardStatusRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise self._query_failed("GetStatus", error) from error
        return int(status.applied_position)

    def _replace_broken(self, link: ShardLink) -> None:
        """A fresh link after a break: a broken link can lose the next command it queues.

        The request iterator of a call that ended with an error is not cancelled by
        `call.cancel()` (the call is already done), so it stays parked on the link's
        queue and takes the next command to a dead call (found in the fault tests;
        see the report on ShardLink). A new link has a queue of its own; the old one
        is closed and dropped.
        """
        if self.link is not link:
            return
        self._retired_batches += link.sent_batches
        self._retired_commands += link.sent_commands
        self.link = ShardLink(self.address)
        self.links_replaced += 1
        closing = asyncio.get_running_loop().create_task(link.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await self.link.close()
        await self.channel.close()

    def _query_failed(self, call: str, error: grpc.aio.AioRpcError) -> GatewayError:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.counters.add("shard_timeouts")
            return timed_out(f"shard {self.address} {call}: no answer in {self.timeout_s:g} s")
        self.counters.add("shard_unavailable")
        return unavailable(f"shard {self.address} {call}: {error.code().name}")


@dataclass(frozen=True, slots=True)
class ShardRoute:
    endpoint: ShardEndpoint
    epoch: int


class Routing(Protocol):
    def route(self, user_id: int) -> ShardRoute: ...

    def endpoints(self) -> tuple[ShardEndpoint, ...]: ...

    async def newer_epoch(self, epoch: int) -> bool:
        """Whether routing has moved past `epoch` (after waiting briefly for it to)."""
        ...


class StaticRouting:
    """One shard for every user (a single-shard mesh), epoch 0."""

    def __init__(self, endpoint: ShardEndpoint) -> None:
        self._route = ShardRoute(endpoint, 0)

    def route(self, user_id: int) -> ShardRoute:
        return self._route

    def endpoints(self) -> tuple[ShardEndpoint, ...]:
        return (self._route.endpoint,)

    async def newer_epoch(self, epoch: int) -> bool:
        return False


class ShardRouter:
    def __init__(self, routing: Routing, counters: GatewayCounters) -> None:
        self.routing = routing
        self.counters = counters

    def endpoint(self, user_id: int) -> ShardEndpoint:
        return self.routing.route(user_id).endpoint

    async def execute(self, user_id: int, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult:
        for _ in range(MAX_REROUTES):
            route = self.routing.route(user_id)
            which = command.WhichOneof("command")
            if which == "place":
                command.place.routing_epoch = route.epoch
            elif which == "cancel":
                command.cancel.routing_epoch = route.epoch
            result = await route.endpoint.execute(command)
            if result.reject_reason != shard_pb2.SHARD_REJECT_REASON_NOT_OWNER:
                return result
            self.counters.add("shard_not_owner")
            if not await self.routing.newer_epoch(route.epoch):
                return result
        return result

    async def close(self) -> None:
        for endpoint in self.routing.endpoints():
            await endpoint.close()
