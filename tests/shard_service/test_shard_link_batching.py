"""Commands that arrive while the link's batch waits for its answer leave together.

The gateway's link holds at most one unanswered batch of client commands
(`max_unanswered_batches`): whatever arrives meanwhile, from any number of callers,
leaves in the next batch, one message and one log entry, and comes back in one. A
`parked` answer answers a batch as well as a final one does. The shard is stopped
(SIGSTOP) while the first batch waits, so what is held is known exactly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from services.clients.shard_link import MAX_COMMANDS_PER_BATCH, ShardLink
from tests.shard_service.shard_client import ShardClient, deposit, hydrate
from tests.shard_service.shard_process import ShardProcess, aio_channel

CALLERS = 50
TIMEOUT_S = 10.0
USERS = range(9_101, 9_111)
NOT_RESIDENT = 9_150


async def _until(condition: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("limit", [1, None], ids=["held", "unbounded"])
async def test_callers_arriving_while_a_batch_is_unanswered_share_the_next_one(
    new_shard: Callable[..., ShardProcess], limit: int | None
) -> None:
    process = new_shard()
    process.start_serving()
    link = ShardLink(process.address, max_unanswered_batches=limit)
    try:
        await link.send([hydrate(user_id) for user_id in USERS])
        await link.wait_ready(10)
        first = await link.execute(deposit(USERS[0], 1), timeout_s=TIMEOUT_S)
        assert first.accepted, first
        before = link.statistics()
        os.kill(process.pid, signal.SIGSTOP)
        try:
            waiting = asyncio.ensure_future(link.execute(deposit(USERS[0], 1), timeout_s=TIMEOUT_S))
            await _until(lambda: link.statistics().sent_batches == before.sent_batches + 1)
            # One caller a loop turn, as unary calls arrive.
            callers = []
            for number in range(CALLERS):
                user_id = USERS[number % len(USERS)]
                command = deposit(NOT_RESIDENT if number == 0 else user_id, 1)
                callers.append(asyncio.ensure_future(link.execute(command, timeout_s=TIMEOUT_S)))
                await asyncio.sleep(0)
            if limit is not None:
                await _until(lambda: link.statistics().queued == CALLERS)
                assert link.statistics().held_batches == before.held_batches + 1
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert (await waiting).accepted
        # The caller of a user not resident waits for its hydration (parked): the others'
        # answers do not wait for it, and its own batch was answered by `parked`.
        async with asyncio.timeout(TIMEOUT_S):
            answers = await asyncio.gather(*callers[1:])
        assert all(answer.accepted for answer in answers)
        assert not callers[0].done()
        after = link.statistics()
        if limit is not None:
            assert after.sent_batches == before.sent_batches + 2, after
        assert after.sent_commands == before.sent_commands + CALLERS + 1
        # The next batch leaves at once: the parked answer answered the held one.
        assert (await link.execute(deposit(USERS[1], 1), timeout_s=TIMEOUT_S)).accepted
        async with aio_channel(process.address) as channel:
            await ShardClient(channel).run(hydrate(NOT_RESIDENT))
        async with asyncio.timeout(TIMEOUT_S):
            assert (await callers[0]).accepted
    finally:
        await link.close()


async def test_a_full_batch_leaves_without_waiting_for_the_answer(
    new_shard: Callable[..., ShardProcess],
) -> None:
    """Nagle sends a full segment at once: a held queue that fills a batch leaves while the
    batch before it is still unanswered (the shard is stopped), so the hold never caps
    what one link carries to a batch per answer."""
    process = new_shard()
    process.start_serving()
    link = ShardLink(process.address, max_unanswered_batches=1)
    try:
        await link.send([hydrate(user_id) for user_id in USERS])
        await link.wait_ready(10)
        assert (await link.execute(deposit(USERS[0], 1), timeout_s=TIMEOUT_S)).accepted
        before = link.statistics()
        os.kill(process.pid, signal.SIGSTOP)
        try:
            first = asyncio.ensure_future(link.execute(deposit(USERS[0], 1), timeout_s=TIMEOUT_S))
            await _until(lambda: link.statistics().sent_batches == before.sent_batches + 1)
            callers = [
                asyncio.ensure_future(
                    link.execute(deposit(USERS[n % len(USERS)], 1), timeout_s=TIMEOUT_S)
                )
                for n in range(MAX_COMMANDS_PER_BATCH)
            ]
            await _until(lambda: link.statistics().sent_batches == before.sent_batches + 2)
            assert link.statistics().queued == 0
        finally:
            os.kill(process.pid, signal.SIGCONT)
        async with asyncio.timeout(TIMEOUT_S):
            answers = await asyncio.gather(first, *callers)
        assert all(answer.accepted for answer in answers)
        assert link.statistics().sent_batches == before.sent_batches + 2
    finally:
        await link.close()
