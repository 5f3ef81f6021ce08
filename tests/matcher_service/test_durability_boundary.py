"""Nothing leaves the matcher before it is durable: Subscribe and queries on a held log.

In-process, on the real service and file log, but each record is reported durable
only when the test releases it (`held_log`), so "applied but not yet durable" is a
state the test can hold the matcher in and look at.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.event_replay import kind
from tests.matcher_service.held_log import (
    held_host,
    serve,
    serving_at_newest_version,
    stop_host,
    wait_until,
)
from tests.matcher_service.matcher_client import READ_TIMEOUT_S, MatcherClient
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    OPEN,
    REFERENCE_TICKS,
    OrderFactory,
    submits,
)
from tests.matcher_service.matcher_process import aio_channel

REFERENCE = REFERENCE_TICKS[BTC]


async def test_subscribe_never_delivers_an_event_whose_record_is_not_durable(
    tmp_path: Path,
) -> None:
    host, log = held_host(tmp_path)
    serving, _ = serve(host)
    try:
        await serving_at_newest_version(host)
        orders = OrderFactory("boundary")
        durable = orders.limit(1, BUY, REFERENCE - 1, 1)
        held = orders.limit(1, BUY, REFERENCE - 2, 1)
        async with aio_channel(f"127.0.0.1:{host.bound_port}") as channel:
            client = MatcherClient(channel)
            await client.submit(durable)
            log.holding = True
            execute = client.stub.Execute()
            await execute.write(submits(held))
            await wait_until(lambda: len(log.held) == 1)  # applied, written, not durable

            stream = aiter(
                client.stub.Subscribe(
                    matcher_pb2.SubscribeRequest(oms_shard=orders.shard, from_sequence=1)
                )
            )
            async with asyncio.timeout(READ_TIMEOUT_S):
                first = await anext(stream)
            assert [(e.sequence, e.order_id) for e in first.events] == [(1, durable.order_id)]

            log.release_next()
            async with asyncio.timeout(READ_TIMEOUT_S):
                second = await anext(stream)
            assert [(e.sequence, e.order_id, kind(e)) for e in second.events] == [
                (2, held.order_id, "accepted")
            ]
            await execute.done_writing()
            assert len([result async for result in execute]) == 1
    finally:
        await stop_host(host, log, serving)


async def test_a_query_waits_until_the_record_it_would_see_is_durable(tmp_path: Path) -> None:
    host, log = held_host(tmp_path)
    serving, _ = serve(host)
    try:
        await serving_at_newest_version(host)
        orders = OrderFactory("boundary")
        held = orders.limit(1, BUY, REFERENCE - 2, 3)
        async with aio_channel(f"127.0.0.1:{host.bound_port}") as channel:
            client = MatcherClient(channel)
            log.holding = True
            execute = client.stub.Execute()
            await execute.write(submits(held))
            await wait_until(lambda: len(log.held) == 1)

            by_id = asyncio.create_task(client.get_order(held.order_id))
            open_orders = asyncio.create_task(client.open_orders(orders.shard, 1))
            await wait_until(lambda: host.ingress.holds == 2)
            assert not by_id.done() and not open_orders.done()

            log.release_next()
            async with asyncio.timeout(READ_TIMEOUT_S):
                state = await by_id
            async with asyncio.timeout(READ_TIMEOUT_S):
                snapshot = await open_orders
            assert state is not None and (state.order, state.status) == (held, OPEN)
            assert snapshot.as_of_sequence == 1
            assert list(snapshot.orders) == [state]
            await execute.done_writing()
            assert len([result async for result in execute]) == 1
    finally:
        await stop_host(host, log, serving)
