"""`Subscriber`: a stream's bounded queue of messages serialized once for all.

It never grows past its bound: a book stream that reaches it drops what it holds and is
marked for a fresh book (RESYNC), a trade stream is ended (END); a writer waiting in
`next_ready` wakes for a message, a resynchronisation or an end.
"""

from __future__ import annotations

import asyncio

import pytest

from services.market_data.subscribers import Overflow, Subscriber

WAKE_DEADLINE_S = 10.0  # generous: the machine is shared; a missed wake fails, never flakes


async def settle() -> None:
    """Let every ready task run (no waiting on time)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_messages_queue_in_order_up_to_the_limit() -> None:
    subscriber: Subscriber[bytes] = Subscriber("ipv4:127.0.0.1:1", 3, Overflow.RESYNC)
    for message in (b"a", b"b", b"c"):
        assert subscriber.offer(message)
    assert list(subscriber.queue) == [b"a", b"b", b"c"]
    assert not subscriber.resync and not subscriber.ended
    assert subscriber.wake.is_set()


def test_take_gives_what_waits_within_a_budget_and_at_least_one_message() -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 10, Overflow.END)
    for message in (b"aaaa", b"bb", b"cc", b"dddddd"):
        subscriber.offer(message)
    assert subscriber.take(7, len) == [b"aaaa", b"bb"]
    assert subscriber.take(1, len) == [b"cc"]  # larger than the budget: alone
    assert subscriber.take_all() == [b"dddddd"]
    assert not subscriber.queue


def test_a_book_stream_over_its_limit_drops_its_queue_and_waits_for_a_fresh_book() -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 2, Overflow.RESYNC)
    assert subscriber.offer(b"1") and subscriber.offer(b"2")
    subscriber.wake.clear()
    assert not subscriber.offer(b"3")
    assert subscriber.resync and not subscriber.queue and not subscriber.ended
    assert subscriber.wake.is_set()
    # Until its writer sends the fresh book, nothing more is queued: the book covers it.
    assert not subscriber.offer(b"4")
    assert not subscriber.queue
    # The writer sent it (service.py clears the flag): messages queue again.
    subscriber.resync = False
    assert subscriber.offer(b"5") and list(subscriber.queue) == [b"5"]


def test_a_trade_stream_over_its_limit_is_ended() -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 2, Overflow.END)
    assert subscriber.offer(b"1") and subscriber.offer(b"2")
    subscriber.wake.clear()
    assert not subscriber.offer(b"3")
    assert subscriber.ended == "the stream fell 2 messages behind"
    assert not subscriber.resync and not subscriber.queue and subscriber.wake.is_set()
    assert not subscriber.offer(b"4") and not subscriber.queue


def test_end_says_why_and_drops_the_queue() -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 5, Overflow.END)
    subscriber.offer(b"1")
    subscriber.wake.clear()
    subscriber.end("trades 4..6 were lost")
    assert subscriber.ended == "trades 4..6 were lost"
    assert not subscriber.queue and subscriber.wake.is_set()
    assert not subscriber.offer(b"2")


async def test_next_ready_returns_at_once_when_something_is_waiting() -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 5, Overflow.RESYNC)
    subscriber.offer(b"1")
    async with asyncio.timeout(WAKE_DEADLINE_S):
        await subscriber.next_ready()
    resynced: Subscriber[bytes] = Subscriber("peer", 5, Overflow.RESYNC)
    resynced.resync = True
    async with asyncio.timeout(WAKE_DEADLINE_S):
        await resynced.next_ready()


@pytest.mark.parametrize("wake_by", ["offer", "resnapshot", "end"])
async def test_next_ready_waits_until_a_message_a_resync_or_an_end(wake_by: str) -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 1, Overflow.RESYNC)
    subscriber.offer(b"0")
    subscriber.queue.clear()  # the writer took it: the wake flag is still set
    waiting = asyncio.create_task(subscriber.next_ready())
    await settle()
    assert not waiting.done()  # a stale wake flag does not end the wait
    if wake_by == "offer":
        subscriber.offer(b"1")
    elif wake_by == "resnapshot":  # as MarketMirror._resynchronise marks it
        subscriber.resync = True
        subscriber.wake.set()
    else:
        subscriber.end("closing")
    async with asyncio.timeout(WAKE_DEADLINE_S):
        await waiting
    assert list(subscriber.queue) == ([b"1"] if wake_by == "offer" else [])


async def test_after_an_overflow_next_ready_returns_with_nothing_queued() -> None:
    for overflow in Overflow:
        subscriber: Subscriber[bytes] = Subscriber("peer", 1, overflow)
        subscriber.offer(b"1")
        subscriber.offer(b"2")
        async with asyncio.timeout(WAKE_DEADLINE_S):
            await subscriber.next_ready()
        assert not subscriber.queue
        assert (subscriber.resync, bool(subscriber.ended)) == (
            overflow is Overflow.RESYNC,
            overflow is Overflow.END,
        )


async def test_a_writer_takes_every_message_in_order_across_wakes() -> None:
    subscriber: Subscriber[bytes] = Subscriber("peer", 100, Overflow.END)
    received: list[bytes] = []

    async def writer() -> None:
        while len(received) < 6:
            await subscriber.next_ready()
            while subscriber.queue:
                received.append(subscriber.queue.popleft())

    task = asyncio.create_task(writer())
    for chunk in ([b"1"], [b"2", b"3"], [b"4"], [b"5", b"6"]):
        for message in chunk:
            assert subscriber.offer(message)
        await settle()
    async with asyncio.timeout(WAKE_DEADLINE_S):
        await task
    assert received == [b"1", b"2", b"3", b"4", b"5", b"6"]
