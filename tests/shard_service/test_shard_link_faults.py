"""The shared `ShardLink` through shard faults, under a load of many concurrent callers.

What the gateway relies on: every command gets an answer within its deadline
(a result, or a retryable error), the link finds the shard again by itself after
any number of SIGKILLs, a stopped (SIGSTOP) shard is found wedged and left, the
queue stays bounded, the log says one thing per incident, and retries with the
same ids apply every command exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from protos.oms.v1 import shard_pb2
from services.clients.shard_link import LinkState, ShardLink
from tests.shard_service.deposit_load import (
    TIMEOUT_S,
    DepositLoad,
    start_deposit_load,
    stop_deposit_load,
)
from tests.shard_service.shard_client import USDT, ShardClient, balance
from tests.shard_service.shard_process import ShardProcess, aio_channel

pytestmark = pytest.mark.slow
USERS = 16
ANSWER_MARGIN_S = 0.5  # the expiry sweep's tick and a loaded machine's scheduling
KILLS = 4
SERVE_AGAIN_S = 5.0


async def _started_load(process: ShardProcess) -> tuple[ShardLink, DepositLoad, asyncio.Task[None]]:
    # As the gateway holds its link: one unanswered batch of client commands at most.
    link = ShardLink(process.address, max_unanswered_batches=1)
    load, running = await start_deposit_load(link, range(1, USERS + 1))
    return link, load, running


async def _finish(link: ShardLink, load: DepositLoad, running: asyncio.Task[None]) -> None:
    await stop_deposit_load(load, running)


async def _check_exactly_once(process: ShardProcess, load: DepositLoad) -> None:
    async with aio_channel(process.address) as channel:
        shard = ShardClient(channel)
        for user_id in load.users:
            view = await shard.actor(user_id)
            assert balance(view, USDT).total == load.accepted[user_id], user_id


async def test_the_link_serves_again_after_four_shard_kills_under_load(
    new_shard: Callable[..., ShardProcess],
) -> None:
    process = new_shard()
    process.start_serving()
    with capture_logs() as lines:
        link, load, running = await _started_load(process)
        try:
            for _ in range(KILLS):
                await load.wait_successes(300)
                process.kill()
                # Away: callers are refused at once, not queued.
                await load.wait_answers("ShardUnavailableError", 50)
                await asyncio.to_thread(process.start_serving)
                served = time.monotonic()
                await load.wait_successes(1, timeout_s=SERVE_AGAIN_S)
                assert load.last_success - served < SERVE_AGAIN_S
            await load.wait_successes(300)
            statistics = link.statistics()
        finally:
            await _finish(link, load, running)
    print(
        f"answers {dict(load.answers)}, slowest {load.slowest_answer_s:.3f} s, {link.statistics()}"
    )
    assert load.slowest_answer_s < TIMEOUT_S + ANSWER_MARGIN_S
    assert load.max_queued <= link.max_queued
    assert statistics.breaks == KILLS, statistics
    # One line when the shard goes away and one when it is back, per kill (never per command).
    events = Counter(line["event"] for line in lines if line["event"].startswith("shard_link."))
    assert events["shard_link.down"] <= KILLS and events["shard_link.ready"] == KILLS, events
    await _check_exactly_once(process, load)


async def test_a_stopped_shard_is_found_wedged_and_left_then_found_again(
    new_shard: Callable[..., ShardProcess],
) -> None:
    process = new_shard()
    process.start_serving()
    link, load, running = await _started_load(process)
    try:
        await load.wait_successes(200)
        # A stall before the stop is not the one this test is about: a full suite once
        # saw the shard silent for 5 s while it ran (cause not found; the machine was
        # busy), found wedged and reconnected at once.
        stalls = link.statistics().stalls
        os.kill(process.pid, signal.SIGSTOP)
        try:
            # The TCP connection lives on, nothing answers: deadlines, then the wedge.
            await _wait_for(lambda: link.statistics().stalls > stalls, timeout_s=30)
            assert link.state is not LinkState.READY
            await load.wait_answers("ShardUnavailableError", 20)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        await load.wait_successes(200)
    finally:
        await _finish(link, load, running)
    assert load.slowest_answer_s < TIMEOUT_S + ANSWER_MARGIN_S
    await _check_exactly_once(process, load)


async def _wait_for(condition: Callable[[], bool], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_link_of_mesh_commands_only_is_not_found_wedged_by_their_silence(
    shared_shard: ShardProcess,
) -> None:
    """The shard answers no mesh command (matcher events, flush answers): a bridge's link
    sending only those once found a healthy shard wedged `stall_s` after its first send,
    at any load, and broke the bridge's session every few seconds."""
    stall_s = 1.0
    link = ShardLink(shared_shard.address, stall_s=stall_s)
    try:
        await link.wait_ready(10)
        deadline = time.monotonic() + 3 * stall_s
        sent = 0
        while time.monotonic() < deadline:
            # A well-formed event for another shard: counted as foreign, changes nothing,
            # and answered with nothing (a malformed one would get a MALFORMED answer).
            command = shard_pb2.ShardCommand()
            command.matcher_events.matcher_group = "g1"
            event = command.matcher_events.events.add(sequence=1, oms_shard="elsewhere")
            event.accepted.SetInParent()
            await link.send([command])
            sent += 1
            await asyncio.sleep(0.05)
        await _wait_for(lambda: link.statistics().queued == 0, timeout_s=10)
        statistics = link.statistics()
    finally:
        await link.close()
    assert sent > 40
    assert (statistics.stalls, statistics.breaks, statistics.state) == (0, 0, "ready"), statistics
