"""Queries stay live while Execute streams keep the log busy.

GetOrder and GetOpenOrders answer only from a state that is entirely durable.
Under load the sequencer applies the next record while the previous one is
being written, so the two are rarely equal when a query looks; a query must
still be answered promptly, not whenever the load happens to pause.
"""

from __future__ import annotations

import asyncio
import time

from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import OrderFactory
from tests.matcher_service.matcher_process import MatcherProcess
from tests.matcher_service.order_load import LoadGenerator
from tests.matcher_service.order_mix import OrderMix

QUERIES = 40
# Far above what one query costs when answered after the queue drains (a few ms), far
# below what it costs when it has to wait for a pause in the load (seconds in all).
TOTAL_BUDGET_S = 5.0


async def test_queries_are_answered_promptly_under_a_sustained_load(
    matcher: MatcherClient,
    shared_matcher: MatcherProcess,
    orders: OrderFactory,
    users: tuple[int, ...],
) -> None:
    shards = (orders, OrderFactory(f"{orders.shard}-b"))
    loads = [
        LoadGenerator(
            shared_matcher.address, OrderMix((shard,), users[index::2], seed=index), 50, 8
        )
        for index, shard in enumerate(shards)
    ]
    running = [asyncio.create_task(load.run()) for load in loads]
    latencies: list[float] = []
    try:
        for load in loads:
            await load.wait_acknowledged(5, timeout_s=20)
        known = loads[0].acknowledged[0][0].commands[0].submit.order
        for index in range(QUERIES):
            started = time.perf_counter()
            if index % 2:
                assert await matcher.get_order(known.order_id) is not None
            else:
                await matcher.open_orders(orders.shard, known.user_id)
            latencies.append(time.perf_counter() - started)
        busy = sum(len(load.acknowledged) for load in loads)
    finally:
        for load in loads:
            load.stop.set()
        async with asyncio.timeout(20):
            statuses = await asyncio.gather(*running)
    assert statuses == [None, None]
    assert sum(len(load.acknowledged) for load in loads) > busy  # the load ran throughout
    assert sum(latencies) < TOTAL_BUDGET_S, f"query latencies (s): {latencies}"
