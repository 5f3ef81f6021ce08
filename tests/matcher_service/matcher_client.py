"""A thin async client over the generated `MatcherStub`, for tests.

Reads of the event stream are bounded by a deadline and by a target sequence
taken from `GetOpenOrders(...).as_of_sequence` (the durable end of a shard's
stream), so a test never waits on a fixed sleep.
"""

from __future__ import annotations

import asyncio

import grpc

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from tests.matcher_service.matcher_messages import (
    BUY,
    IOC,
    REFERENCE_TICKS,
    OrderFactory,
    batch,
    submit,
)

READ_TIMEOUT_S = 10.0


class MatcherClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = matcher_pb2_grpc.MatcherStub(channel)

    # --- commands -----------------------------------------------------------------------

    async def execute(
        self, *batches: matcher_pb2.MatcherCommandBatch
    ) -> list[matcher_pb2.MatcherResultBatch]:
        """Send `batches` on one Execute stream; their result batches, in order."""
        call = self.stub.Execute(iter(batches))
        results = [result async for result in call]
        assert len(results) == len(batches)
        return results

    async def run(
        self, *commands: matcher_pb2.MatcherCommand
    ) -> list[matcher_pb2.MatcherCommandResult]:
        """One batch of `commands`; one result per command, correlated by id."""
        (results,) = await self.execute(batch(*commands))
        assert [r.correlation_id for r in results.results] == [c.correlation_id for c in commands]
        return list(results.results)

    async def submit(self, *orders: matcher_pb2.Order) -> list[matcher_pb2.MatcherCommandResult]:
        return await self.run(*(submit(order) for order in orders))

    # --- queries ------------------------------------------------------------------------

    async def get_order(self, order_id: str) -> matcher_pb2.OrderState | None:
        """The order's state, or None when the matcher answers NOT_FOUND."""
        try:
            state: matcher_pb2.OrderState = await self.stub.GetOrder(
                matcher_pb2.OrderQuery(order_id=order_id), timeout=READ_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return state

    async def open_orders(self, shard: str, user_id: int) -> matcher_pb2.OpenOrdersSnapshot:
        snapshot: matcher_pb2.OpenOrdersSnapshot = await self.stub.GetOpenOrders(
            matcher_pb2.OpenOrdersQuery(oms_shard=shard, user_id=user_id),
            timeout=READ_TIMEOUT_S,
        )
        return snapshot

    async def last_sequence(self, shard: str) -> int:
        """The durable end of `shard`'s event stream (0 before its first event)."""
        return (await self.open_orders(shard, 0)).as_of_sequence

    # --- events -------------------------------------------------------------------------

    async def events(
        self,
        shard: str,
        from_sequence: int = 1,
        through_sequence: int | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> list[matcher_pb2.MatcherEvent]:
        """Subscribe from `from_sequence` and read through `through_sequence`.

        `through_sequence` defaults to the stream's durable end right now; reading
        stops there, or fails after `timeout_s` seconds.
        """
        if through_sequence is None:
            through_sequence = await self.last_sequence(shard)
        if through_sequence < from_sequence:
            return []
        received: list[matcher_pb2.MatcherEvent] = []
        call = self.stub.Subscribe(
            matcher_pb2.SubscribeRequest(oms_shard=shard, from_sequence=from_sequence)
        )

        async def read() -> None:
            async for event_batch in call:
                received.extend(event_batch.events)
                if received and received[-1].sequence >= through_sequence:
                    return

        try:
            async with asyncio.timeout(timeout_s):
                await read()
        except TimeoutError as error:
            raise AssertionError(
                f"{shard}: got {len(received)} events from {from_sequence}, "
                f"wanted through {through_sequence} within {timeout_s:g} s"
            ) from error
        finally:
            call.cancel()
        return received

    async def next_events(
        self, shard: str, from_sequence: int, count: int, timeout_s: float = READ_TIMEOUT_S
    ) -> list[matcher_pb2.MatcherEvent]:
        """The `count` events from `from_sequence` on, waiting for them to happen."""
        return await self.events(shard, from_sequence, from_sequence + count - 1, timeout_s)

    async def events_before_fence(
        self, factory: OrderFactory, user_id: int, after_sequence: int
    ) -> list[matcher_pb2.MatcherEvent]:
        """Every event of the factory's shard after `after_sequence`, up to a fence.

        The fence is a new IOC buy far below the reference (nothing to match: it is
        Accepted, then Cancelled). Its two events close the list, so the events
        before them are all that happened in between, and no test waits for an
        absence.
        """
        fence = factory.limit(user_id, BUY, REFERENCE_TICKS[factory.symbol] * 95 // 100, 4)
        fence.time_in_force = IOC
        (result,) = await self.submit(fence)
        assert not result.duplicate and not result.reject_reason, result
        end = await self.last_sequence(factory.shard)
        events = await self.events(factory.shard, after_sequence + 1, end)
        assert [(e.order_id, e.WhichOneof("event")) for e in events[-2:]] == [
            (fence.order_id, "accepted"),
            (fence.order_id, "cancelled"),
        ], events[-2:]
        return events[:-2]
