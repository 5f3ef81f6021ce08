"""One shard as the gateway reaches it: the process's one shared `ShardLink` (every
client's commands leave in the same batches) plus a channel for queries and the
egress subscription, at the shard's address (its leader's, when replicated)."""

from __future__ import annotations

import asyncio

import grpc

from gateway.core.refusals import GatewayError, timed_out, unavailable
from gateway.statistics import GatewayCounters
from protos.oms.v1 import shard_pb2, shard_pb2_grpc
from services.clients.channels import mesh_channel
from services.clients.shard_link import (
    DEFAULT_LINGER_S,
    LinkState,
    ShardLink,
    ShardUnavailableError,
)
from services.coordination.addresses import AddressSource
from services.coordination.errors import CoordinationUnavailable


class ShardEndpoint:
    def __init__(
        self,
        address: AddressSource,
        *,
        timeout_s: float,
        counters: GatewayCounters,
        unanswered_batches: int | None = None,
    ) -> None:
        self.source = address
        self.address = address.describe()
        self.timeout_s = timeout_s
        self.counters = counters
        # Holding while a batch is unanswered gathers a burst better than a linger after
        # an idle spell, and costs the lone order at a low rate no wait and no timer.
        self.link = ShardLink(
            address,
            max_unanswered_batches=unanswered_batches,
            linger_s=0.0 if unanswered_batches else DEFAULT_LINGER_S,
        )
        self._channel: grpc.aio.Channel | None = None
        self._channel_address = ""
        self._stub: shard_pb2_grpc.UserShardStub | None = None

    async def stub(self) -> shard_pb2_grpc.UserShardStub:
        """The query stub of the shard's current address (its leader's, when replicated)."""
        try:
            address = await self.source.resolve()
        except CoordinationUnavailable as error:
            self.counters.add("shard_unavailable")
            raise unavailable(f"shard {self.address}: {error}") from error
        if self._stub is None or address != self._channel_address:
            if self._channel is not None:
                await self._channel.close()
            self._channel = mesh_channel(address)
            self._channel_address = self.address = address
            self._stub = shard_pb2_grpc.UserShardStub(self._channel)
        return self._stub

    async def execute(self, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult:
        """The command's final result; UNAVAILABLE / TIMEOUT errors say: retry, same ids."""
        try:
            return await self.link.execute(command, timeout_s=self.timeout_s)
        except (ShardUnavailableError, TimeoutError) as error:
            raise self.link_failure(error) from error

    def submit(
        self, command: shard_pb2.ShardCommand
    ) -> asyncio.Future[shard_pb2.ShardResult] | None:
        """`execute` as a future, failing with the link's own errors (`link_failure` says
        what the client is told); None while the link is away: use `execute`."""
        return self.link.submit(command, timeout_s=self.timeout_s)

    def link_failure(self, error: ShardUnavailableError | TimeoutError) -> GatewayError:
        """A link's failure as the client sees it, counted."""
        if isinstance(error, ShardUnavailableError):
            self.counters.add("shard_unavailable")
            return unavailable(str(error))
        self.counters.add("shard_timeouts")
        return timed_out(f"shard {self.address} gave no result in {self.timeout_s:g} s")

    async def actor(self, user_id: int, *, orders_only: bool = False) -> shard_pb2.ActorView:
        """The user's actor as the shard has it (`orders_only`: without its state)."""
        self._refuse_if_away("GetActor")
        try:
            # Waits for the query channel to connect (it may still be backing off from a
            # try made before the shard was up), within the deadline; a shard the link
            # knows to be away was refused above.
            stub = await self.stub()
            view: shard_pb2.ActorView = await stub.GetActor(
                shard_pb2.ActorQuery(user_id=user_id, orders_only=orders_only),
                timeout=self.timeout_s,
                wait_for_ready=True,
            )
            return view
        except grpc.aio.AioRpcError as error:
            raise self._query_failed("GetActor", error) from error

    async def actor_batch(self, user_ids: list[int]) -> shard_pb2.ActorBatch:
        """Many users' actors in one call, one view per id in order, as of one position."""
        self._refuse_if_away("GetActorBatch")
        try:
            stub = await self.stub()
            batch: shard_pb2.ActorBatch = await stub.GetActorBatch(
                shard_pb2.ActorBatchQuery(user_ids=user_ids),
                timeout=self.timeout_s,
                wait_for_ready=True,
            )
            return batch
        except grpc.aio.AioRpcError as error:
            raise self._query_failed("GetActorBatch", error) from error

    async def applied_position(self) -> int:
        self._refuse_if_away("GetStatus")
        try:
            stub = await self.stub()
            status = await stub.GetStatus(
                shard_pb2.ShardStatusRequest(), timeout=self.timeout_s, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as error:
            raise self._query_failed("GetStatus", error) from error
        return int(status.applied_position)

    def _refuse_if_away(self, call: str) -> None:
        if self.link.state is LinkState.AWAY:
            self.counters.add("shard_unavailable")
            raise unavailable(f"shard {self.address} {call}: the shard is unavailable")

    async def close(self) -> None:
        await self.link.close()
        if self._channel is not None:
            await self._channel.close()
        await self.source.close()

    def _query_failed(self, call: str, error: grpc.aio.AioRpcError) -> GatewayError:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.counters.add("shard_timeouts")
            return timed_out(f"shard {self.address} {call}: no answer in {self.timeout_s:g} s")
        self.counters.add("shard_unavailable")
        return unavailable(f"shard {self.address} {call}: {error.code().name}")
