"""The log's writer thread: submission order, errors to the awaiter, nothing lost on stop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.runtime.writer_thread import WriterThread


async def test_jobs_run_one_at_a_time_in_submission_order_on_one_thread() -> None:
    writer = WriterThread("test-writer")
    seen: list[int] = []
    threads: set[int] = set()

    def job(index: int) -> int:
        seen.append(index)
        threads.add(threading.get_ident())
        return index * 2

    # Submitted in bursts without awaiting, so wake-ups overlap with draining.
    futures = [writer.submit(job, index) for index in range(20_000)]
    assert await asyncio.gather(*futures) == [index * 2 for index in range(20_000)]
    assert seen == list(range(20_000))
    assert len(threads) == 1 and threading.get_ident() not in threads
    writer.stop()


async def test_an_error_reaches_its_own_awaiter_and_later_jobs_still_run() -> None:
    writer = WriterThread("test-writer")

    def fail() -> None:
        raise OSError("disk says no")

    failing = writer.submit(fail)
    after = writer.submit(lambda: "still here")
    with pytest.raises(OSError, match="disk says no"):
        await failing
    assert await after == "still here"
    writer.stop()


async def test_stop_finishes_queued_work_then_refuses_more() -> None:
    writer = WriterThread("test-writer")
    gate = threading.Event()
    done: list[int] = []
    first = writer.submit(gate.wait, 5)
    queued = [writer.submit(done.append, index) for index in range(3)]
    gate.set()
    writer.stop()  # returns only once the thread has run everything queued
    assert done == [0, 1, 2]
    await asyncio.gather(first, *queued)
    with pytest.raises(RuntimeError, match="stopped"):
        writer.submit(done.append, 9)


def test_no_thread_until_the_first_submission() -> None:
    before = threading.active_count()
    writer = WriterThread("test-writer")
    assert threading.active_count() == before
    writer.stop()
