"""Contract 3 under crashes: SIGKILL the matcher under load, restart it on the same log.

Three times: two load generators, one per OMS shard, each keep a window of batches
in flight on their own Execute stream, the matcher is killed mid-stream, restarted
on the same data folder and port, and then

- every acknowledged result's order is known (GetOrder), as acknowledged or further;
- each in-flight batch (sent, never answered) was logged whole or not at all, the
  logged ones form a prefix of the stream's batches, and submitting it again is
  absorbed by dedup: `duplicate` where it was logged, created once where it was not,
  `duplicate` on a second try;

while two subscribers (one per OMS shard) resume from the last sequence they
received after every crash, and a third follows StreamLastPrices. At the end the
event streams hold every sequence exactly once, are identical to a fresh read of
the log's events, follow each order's grammar with one Accepted/Rejected per order
id, and imply every user's open orders; every streamed price is a trade of the log.
A snapshot every 50 log entries makes restarts recover from a snapshot plus the
log after it, as well as from the log alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.event_follower import BROKEN_STREAM, EventFollower, LastPriceFollower
from tests.matcher_service.event_replay import StreamReplay, assert_contiguous, snapshot_orders
from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import OrderFactory
from tests.matcher_service.matcher_process import MatcherProcess, aio_channel
from tests.matcher_service.order_load import LoadGenerator
from tests.matcher_service.order_mix import OrderMix

CYCLES = 3
BATCH_SIZE = 50
WINDOW = 8
ACKNOWLEDGED_BEFORE_KILL = 20  # batches per cycle
USERS = tuple(range(1, 13))
QUERY_CHUNK = 500

AcknowledgedBatch = tuple[matcher_pb2.MatcherCommandBatch, matcher_pb2.MatcherResultBatch]


def submitted_ids(batch: matcher_pb2.MatcherCommandBatch) -> list[str]:
    return [
        command.submit.order.order_id
        for command in batch.commands
        if command.WhichOneof("command") == "submit"
    ]


async def order_states(
    client: MatcherClient, order_ids: Sequence[str]
) -> list[matcher_pb2.OrderState | None]:
    states: list[matcher_pb2.OrderState | None] = []
    for start in range(0, len(order_ids), QUERY_CHUNK):
        chunk = order_ids[start : start + QUERY_CHUNK]
        states.extend(await asyncio.gather(*(client.get_order(oid) for oid in chunk)))
    return states


async def assert_acknowledged_orders_are_known(
    client: MatcherClient, acknowledged: Sequence[AcknowledgedBatch]
) -> int:
    answered = [
        result
        for batch, results in acknowledged
        for command, result in zip(batch.commands, results.results, strict=True)
        if command.WhichOneof("command") == "submit"
    ]
    states = await order_states(client, [result.order.order.order_id for result in answered])
    for result, state in zip(answered, states, strict=True):
        assert state is not None, f"acknowledged {result.order.order.order_id} was lost"
        assert state.order == result.order.order
        assert state.filled_lots >= result.order.filled_lots
    return len(answered)


async def resubmit_in_flight(
    client: MatcherClient, in_flight: Sequence[matcher_pb2.MatcherCommandBatch]
) -> tuple[int, int]:
    """Submit each in-flight batch twice; (batches found logged, batches found lost)."""
    logged_flags: list[bool] = []
    for batch in in_flight:
        order_ids = submitted_ids(batch)
        before = await order_states(client, order_ids)
        logged = [state is not None for state in before]
        assert all(logged) or not any(logged), "one batch is one log entry: all or nothing"
        logged_flags.append(all(logged))

        first, second = await client.execute(batch, batch)

        submits = [
            (command, one, two)
            for command, one, two in zip(batch.commands, first.results, second.results, strict=True)
            if command.WhichOneof("command") == "submit"
        ]
        after = await order_states(client, order_ids)
        for (command, one, two), prior, now in zip(submits, before, after, strict=True):
            assert one.duplicate == (prior is not None), command
            if prior is not None:
                assert one.order == prior
            assert two.duplicate and two.order == now, command
    assert logged_flags == sorted(logged_flags, reverse=True), "logged batches form a prefix"
    return sum(logged_flags), len(logged_flags) - sum(logged_flags)


@pytest.mark.slow
async def test_kill_9_under_load_loses_nothing_acknowledged_and_doubles_nothing(
    new_matcher: Callable[..., MatcherProcess],
) -> None:
    process = new_matcher(environment={"OMS_MATCHER_SNAPSHOT_ENTRIES": "50"})
    await asyncio.to_thread(process.start_serving)
    # Like OMS shards: each shard's orders (and users) on its own Execute stream.
    factories = (OrderFactory("crash-a"), OrderFactory("crash-b"))
    mixes = [
        OrderMix((factory,), USERS[index::2], seed=2024 + index)
        for index, factory in enumerate(factories)
    ]
    followers = [EventFollower(process.address, factory.shard) for factory in factories]
    prices = LastPriceFollower(process.address)
    following = [asyncio.create_task(follower.run()) for follower in followers]
    following.append(asyncio.create_task(prices.run()))
    in_flight_logged = in_flight_lost = acknowledged_orders = 0
    try:
        for _cycle in range(CYCLES):
            loads = [LoadGenerator(process.address, mix, BATCH_SIZE, WINDOW) for mix in mixes]
            running = [asyncio.create_task(load.run()) for load in loads]
            for load in loads:
                await load.wait_acknowledged(ACKNOWLEDGED_BEFORE_KILL, timeout_s=20)
            process.kill()
            async with asyncio.timeout(10):
                statuses = await asyncio.gather(*running)
            for status in statuses:
                assert status in BROKEN_STREAM
            await asyncio.to_thread(process.start_serving)

            async with aio_channel(process.address) as channel:
                client = MatcherClient(channel)
                for load in loads:
                    acknowledged_orders += await assert_acknowledged_orders_are_known(
                        client, load.acknowledged
                    )
                    logged, lost = await resubmit_in_flight(client, load.in_flight)
                    in_flight_logged += logged
                    in_flight_lost += lost
        assert in_flight_logged + in_flight_lost > 0, "no kill hit a batch in flight"
        assert not any(task.done() for task in following), [t.exception() for t in following]

        async with aio_channel(process.address) as channel:
            client = MatcherClient(channel)
            replays = []
            for follower in followers:
                end = await client.last_sequence(follower.shard)
                await follower.wait_through(end, timeout_s=10)
                assert_contiguous(follower.events)  # no gap, no duplicate, across every crash
                assert len(follower.resumed_from) > CYCLES
                assert follower.events == await client.events(follower.shard, 1, end)
                replays.append(StreamReplay(follower.shard).apply_all(follower.events))
                for user_id in USERS:
                    snapshot = await client.open_orders(follower.shard, user_id)
                    assert snapshot.as_of_sequence == end
                    assert snapshot_orders(snapshot) == replays[-1].open_for(user_id)

        # Every price streamed, also just before a crash, is that of a trade in the log.
        trades = {
            event.fill.trade_id: (
                event.fill.symbol,
                event.fill.price_ticks,
                event.consensus_time_ms,
            )
            for follower in followers
            for event in follower.events
            if event.WhichOneof("event") == "fill"
        }
        assert prices.prices
        for price in prices.prices:
            assert trades.get(price.trade_id) == (
                price.symbol,
                price.price_ticks,
                price.consensus_time_ms,
            ), f"streamed {price} is no trade of the log"

        created = [order_id for replay in replays for order_id in replay.created]
        assert len(created) == len(set(created))
        assert set(created) == {order.order_id for mix in mixes for order in mix.submitted}
        assert acknowledged_orders >= 2 * CYCLES * ACKNOWLEDGED_BEFORE_KILL * BATCH_SIZE // 2
    finally:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
        print(
            f"in-flight batches at the kills: {in_flight_logged} logged, {in_flight_lost} lost; "
            f"{acknowledged_orders} acknowledged orders checked"
        )
