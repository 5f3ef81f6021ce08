"""Timer entries: every `timer_interval_ms` while work goes on, spaced wider while idle.

An idle group once logged (and synced, and published) a timer record every interval
for nothing; the spacing now doubles up to `idle_timer_interval_ms` while timer entries
produce nothing and no command comes, and the first command or productive timer brings
the cadence back.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from pathlib import Path

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.state_machine import ApplyContext
from services.runtime.file_log import FileLogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from tests.runtime.node_support import settle

DEADLINE_S = 30.0
HOUR_MS = 3_600_000


class TimerRecordingMachine(CounterMachine):
    """The counter machine, remembering each timer's consensus time; while `busy`, a
    timer produces an item (as a sweep with work to do would)."""

    def __init__(self) -> None:
        super().__init__()
        self.timer_times_ms: list[int] = []
        self.busy = False

    def on_timer(self, context: ApplyContext) -> Sequence[tuple[int, int | None]]:
        super().on_timer(context)
        self.timer_times_ms.append(context.consensus_time_ms)
        return ((0, len(self.timer_times_ms)),) if self.busy else ()


class SteppedClock:
    """The wall clock plus an offset a test steps, as NTP or an operator would."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


def node_for(
    data_dir: Path,
    machine: TimerRecordingMachine,
    interval_ms: int,
    widest_ms: int,
    clock: SteppedClock | None = None,
) -> RuntimeNode[tuple[int, int | None]]:
    settings = NodeSettings(
        data_dir=data_dir,
        checkpoint_interval_entries=1_000,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(
            timer_interval_ms=interval_ms, idle_timer_interval_ms=widest_ms
        ),
    )
    return RuntimeNode(
        machine,
        settings,
        log_store=FileLogStore(data_dir / "log"),
        clock_ms=clock or SteppedClock(),
    )


async def timers_logged(machine: TimerRecordingMachine, count: int) -> list[int]:
    deadline = time.monotonic() + DEADLINE_S
    while len(machine.timer_times_ms) < count:
        assert time.monotonic() < deadline, f"{len(machine.timer_times_ms)} timers logged"
        await asyncio.sleep(0.005)
    return list(machine.timer_times_ms)


def gaps(times_ms: list[int]) -> list[int]:
    return [later - earlier for earlier, later in itertools.pairwise(times_ms)]


async def test_idle_timers_widen_to_the_widest_spacing_and_a_command_restores_it(
    tmp_path: Path,
) -> None:
    machine = TimerRecordingMachine()
    node = node_for(tmp_path, machine, interval_ms=10, widest_ms=160)
    await node.recover()
    task = asyncio.create_task(node.run())
    try:
        # 10, 20, 40, 80, 160, 160 ms apart (each gap at least its nominal spacing).
        idle = gaps(await timers_logged(machine, 7))
        assert idle[-1] >= 150 and idle[-2] >= 150, idle
        assert idle[-1] < 1_000, idle  # capped at the widest spacing, not doubling on
        seen = len(machine.timer_times_ms)
        receipt = await settle(node.sequencer.submit_many([encode_increment(1, 1)]), task)
        # The command's record may carry a timer (one was due); the next one, at the
        # busy cadence, comes about 10 ms after the command instead of 160.
        after = await timers_logged(machine, seen + 2)
        next_timer_ms = min(t for t in after[seen:] if t > receipt.consensus_time_ms)
        assert next_timer_ms - receipt.consensus_time_ms < 120, after[seen:]
    finally:
        node.stop()
        await asyncio.wait({task}, timeout=10)
        await node.close()


async def test_timers_that_produce_egress_keep_the_busy_cadence(tmp_path: Path) -> None:
    machine = TimerRecordingMachine()
    machine.busy = True
    node = node_for(tmp_path, machine, interval_ms=10, widest_ms=1_000)
    await node.recover()
    task = asyncio.create_task(node.run())
    try:
        busy = gaps(await timers_logged(machine, 12))
        # Never widened: a doubling cadence would reach 640 ms by the eighth gap.
        assert max(busy) < 320, busy
    finally:
        node.stop()
        await asyncio.wait({task}, timeout=10)
        await node.close()


async def test_a_clock_stepped_back_holds_consensus_time_and_keeps_the_timers(
    tmp_path: Path,
) -> None:
    """An hour back: timers go on at their cadence (they once waited the hour out),
    stamped with the consensus time reached, which never goes back; an hour forward
    again and consensus time follows the clock at once."""
    machine = TimerRecordingMachine()
    machine.busy = True  # the busy cadence: 10 ms
    clock = SteppedClock()
    node = node_for(tmp_path, machine, interval_ms=10, widest_ms=160, clock=clock)
    await node.recover()
    task = asyncio.create_task(node.run())
    try:
        before = await timers_logged(machine, 5)
        clock.offset_ms = -HOUR_MS
        during = (await timers_logged(machine, len(before) + 20))[len(before) :]
        # Held at what it had reached, never behind it.
        assert min(during) >= before[-1], (before[-1], during[:3])
        assert max(during) - before[-1] < 5_000, during[-3:]
        assert node.sequencer.statistics().clock_steps_back == 1
        receipt = await settle(node.sequencer.submit_many([encode_increment(1, 1)]), task)
        assert receipt.consensus_time_ms >= before[-1]
        clock.offset_ms = 0
        seen = len(machine.timer_times_ms)
        after = (await timers_logged(machine, seen + 3))[seen:]
        assert after[-1] >= time.time_ns() // 1_000_000 - 5_000, after
        assert node.sequencer.statistics().clock_steps_back == 1
    finally:
        node.stop()
        await asyncio.wait({task}, timeout=10)
        await node.close()


async def test_a_writer_whose_clock_is_behind_the_log_holds_its_time_and_counts_a_step(
    tmp_path: Path,
) -> None:
    """The log was written under a clock an hour ahead (the previous leader's ran fast);
    the next writer's clock is right: consensus time holds where the log left it, the
    timers go on, and the step back is counted as one seen while writing would be."""
    ahead = SteppedClock()
    ahead.offset_ms = HOUR_MS
    first = node_for(tmp_path, TimerRecordingMachine(), interval_ms=10, widest_ms=160, clock=ahead)
    await first.recover()
    task = asyncio.create_task(first.run())
    try:
        receipt = await settle(first.sequencer.submit_many([encode_increment(1, 1)]), task)
        assert first.sequencer.statistics().clock_steps_back == 0
    finally:
        first.stop()
        await asyncio.wait({task}, timeout=10)
        await first.close()

    machine = TimerRecordingMachine()
    machine.busy = True
    node = node_for(tmp_path, machine, interval_ms=10, widest_ms=160)
    await node.recover()
    replayed = len(machine.timer_times_ms)
    task = asyncio.create_task(node.run())
    try:
        timers = (await timers_logged(machine, replayed + 10))[replayed:]
        assert min(timers) >= receipt.consensus_time_ms, (receipt, timers[:3])
        assert node.sequencer.statistics().clock_steps_back == 1
        later = await settle(node.sequencer.submit_many([encode_increment(1, 1)]), task)
        assert later.consensus_time_ms >= receipt.consensus_time_ms
    finally:
        node.stop()
        await asyncio.wait({task}, timeout=10)
        await node.close()
