"""The durable egress feed: bounded by items as well as records (what costs memory),
the newest record always kept, and subscribers woken by `publish` without a task."""

from __future__ import annotations

import asyncio

import pytest

from services.runtime.core.log_batch import LogBatch
from services.runtime.egress_feed import DurableEgressFeed, EgressWindowExceededError


def _publish(feed: DurableEgressFeed[str], first: int, items: int) -> None:
    """One record of one entry at `first` holding `items` items."""
    feed.publish(
        LogBatch(first, 1_000 + first, [(0, b"")]), [[f"{first}.{n}" for n in range(items)]]
    )


async def test_the_window_drops_the_oldest_records_past_its_items() -> None:
    feed: DurableEgressFeed[str] = DurableEgressFeed(100, retained_items=10)
    for position in range(1, 6):
        _publish(feed, position, 4)
    # 20 items published, at most 10 kept: the two newest records (8 items).
    assert feed.retained == (2, 8)
    assert feed.oldest_position == 4
    with pytest.raises(EgressWindowExceededError):
        await anext(feed.subscribe(3))
    kept = feed.subscribe(4)
    assert [(await anext(kept)).first_position for _ in range(2)] == [4, 5]
    # A record larger than the whole bound is still kept alone: a subscriber at the
    # head never misses one.
    _publish(feed, 6, 25)
    assert feed.retained == (1, 25) and feed.oldest_position == 6


async def test_subscribers_wake_on_publish_and_on_close_without_tasks() -> None:
    feed: DurableEgressFeed[str] = DurableEgressFeed(100)
    received: list[int] = []

    async def follow() -> None:
        async for record in feed.subscribe(1):
            received.append(record.first_position)

    followers = [asyncio.create_task(follow()) for _ in range(3)]
    await asyncio.sleep(0)  # each is waiting now
    tasks_before = len(asyncio.all_tasks())
    _publish(feed, 1, 2)
    assert len(asyncio.all_tasks()) == tasks_before  # publishing starts no task
    feed.close()  # each still takes what was published, then ends
    async with asyncio.timeout(5):
        await asyncio.gather(*followers)
    assert received == [1, 1, 1]
