"""A paced egress subscription (the persister's): what becomes durable within an
interval goes in one message, and an urgent kind (a hydration request) goes at once.

Bounds are read against the time the test itself measured, never assumed: the
records are made one command at a time, and the number of messages that carried
them is held to what the interval allows over the time they took.
"""

from __future__ import annotations

import asyncio
import math
import time

from persister.egress_follower import KINDS, URGENT_KINDS
from protos.oms.v1 import shard_pb2
from tests.shard_service.shard_client import (
    WAIT_S,
    ShardClient,
    deposit,
    hydrate,
    limit_order,
)

INTERVAL_MS = 3_000
RECORDS = 12


async def test_a_paced_subscription_gathers_records_and_sends_reads_at_once(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    funded, cold = users[0], users[1]
    (ready,) = await shard.run(hydrate(funded), deposit(funded, 10**12))
    assert ready.accepted
    start = (await shard.status()).applied_position + 1
    call = shard.stub.SubscribeEgress(
        shard_pb2.EgressSubscription(
            from_position=start,
            kinds=list(KINDS),
            through_positions=True,
            min_interval_ms=INTERVAL_MS,
            urgent_kinds=list(URGENT_KINDS),
        )
    )
    received: asyncio.Queue[tuple[float, shard_pb2.ShardEgressBatch]] = asyncio.Queue()

    async def read() -> None:
        async for message in call:
            received.put_nowait((time.monotonic(), message))

    reader = asyncio.create_task(read())
    try:
        # One record per command, one after another.
        started = time.monotonic()
        positions = []
        for number in range(RECORDS):
            (done,) = await shard.run(deposit(funded, 1 + number))
            assert done.accepted
            positions.append(done.stamp.position)
        made_s = time.monotonic() - started
        carried = 0
        through = 0
        while through < positions[-1]:
            async with asyncio.timeout(WAIT_S + INTERVAL_MS / 1000):
                _, message = await received.get()
            carried += 1
            through = max(through, message.through_position)
        # The first message may go at once; after it, one per interval at most.
        assert carried <= 2 + math.floor(made_s * 1000 / INTERVAL_MS), (carried, made_s)
        assert carried < RECORDS

        # A command for a user not resident parks and asks for a hydration: the request
        # reaches the subscriber at once, not at the end of the interval.
        async with shard.execute() as stream:
            (correlation_id,) = stream.send(
                limit_order(cold, "cold-1", price_ticks=6_500_000, quantity_lots=1)
            )
            parked = await stream.wait_parked(correlation_id)
            asked_at = time.monotonic()
            while True:
                async with asyncio.timeout(WAIT_S):
                    arrived_at, message = await received.get()
                requests = [
                    item for item in message.items if item.WhichOneof("egress") == "hydrate_request"
                ]
                if any(item.hydrate_request.user_id == cold for item in requests):
                    break
            assert parked.parked
            assert arrived_at - asked_at < INTERVAL_MS / 1000 / 2, arrived_at - asked_at
            stream.cancel()
    finally:
        reader.cancel()
        call.cancel()
