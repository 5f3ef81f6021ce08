"""The leader's sequencer: natural batching, group commit, apply, release.

Whatever arrived while the previous record was being made durable forms the
next record (capped by entry count and bytes), so batches grow with load and
one `fdatasync` covers them all. Each record is stamped with the consensus
time: the leader's clock, never allowed to go back. Timer entries are appended
at a cadence so sweeps and expiries land at deterministic log positions: every
`timer_interval_ms` while commands come or timers produce egress, and, while
neither happens, at a spacing that doubles up to `idle_timer_interval_ms` (an
idle group otherwise logs, syncs and publishes a record per interval for
nothing; the first command brings the cadence back). When a timer entry is
logged is the leader's choice, like a batch's size: replicas only apply the log.
A record is handed to the writer thread before it is applied, so
the two can overlap (how much depends on the scheduler: see writer_thread.py);
its results (the futures of the submitters and the egress handler) are released
only once it is durable.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from services.observability.metrics import QUEUE_DWELL
from services.runtime.core.log_batch import (
    LogBatch,
    encode_batch,
    encode_checkpoint,
    encode_version,
)
from services.runtime.core.replica import Replica
from services.runtime.core.state_machine import EntryKind
from services.runtime.errors import IngressFullError
from services.runtime.log_store import LogStore

log = structlog.get_logger(__name__)
EgressT = TypeVar("EgressT")


observe_dwell = QUEUE_DWELL.observe


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SequencerSettings:
    max_batch_entries: int = 8192
    max_batch_bytes: int = 4 * 1024 * 1024
    max_pending_entries: int = 200_000
    timer_interval_ms: int = 100  # 0 turns timer entries off (tests drive time by hand)
    idle_timer_interval_ms: int = 1_000  # the widest spacing while nothing happens

    @property
    def widest_timer_spacing_ms(self) -> int:
        """The widest gap between timer entries: idle timers widen up to it, and a clock
        further behind than it is taken for a step back."""
        return max(self.idle_timer_interval_ms, self.timer_interval_ms)


@dataclass(frozen=True, slots=True)
class Receipt(Generic[EgressT]):
    """Where a submission landed and what each of its commands produced."""

    first_position: int
    outputs: Sequence[Sequence[EgressT]]
    consensus_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class SequencerStatistics:
    batches: int
    entries: int
    pending_entries: int
    last_batch_entries: int
    max_queue_dwell_ms: float
    applied_position: int
    consensus_time_ms: int
    clock_steps_back: int = 0


class _Submission:
    __slots__ = ("enqueued_ns", "future", "kind", "payloads", "size_bytes")

    def __init__(
        self,
        payloads: Sequence[bytes],
        future: asyncio.Future[Receipt[Any]],
        kind: int = int(EntryKind.COMMAND),
    ) -> None:
        self.kind = kind
        self.payloads = payloads
        self.future = future
        self.size_bytes = sum(len(payload) for payload in payloads) + 5 * len(payloads)
        self.enqueued_ns = time.perf_counter_ns()


DurableHandler = Callable[[LogBatch, list[Sequence[EgressT]]], None]


class Sequencer(Generic[EgressT]):
    def __init__(
        self,
        replica: Replica[EgressT],
        store: LogStore,
        *,
        settings: SequencerSettings | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        on_durable: DurableHandler[EgressT] | None = None,
        between_batches: Callable[[], None] | None = None,
    ) -> None:
        self.replica = replica
        self.store = store
        self.settings = settings or SequencerSettings()
        self._clock_ms = clock_ms
        self._on_durable = on_durable
        self._between_batches = between_batches
        self._pending: deque[_Submission] = deque()
        self._pending_entries = 0
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._stopping = False
        self._ended = False
        self._turn_requested = False
        self.running = False
        # Applying overlaps the write, so the replica can be one record ahead of this.
        self.durable_position = replica.applied_position
        self._consensus_time_ms = replica.consensus_time_ms
        self._next_timer_ms = 0
        self._timer_spacing_ms = self.settings.timer_interval_ms  # widens while idle
        self._clock_steps_back = 0  # times the wall clock was found stepped back
        # After recovery, the newest hash may never have been logged: send it again.
        self._last_checkpoint_sent = 0
        self._batches = 0
        self._entries = 0
        self._last_batch_entries = 0
        self._max_dwell_ns = 0
        self._window_max_dwell_ns = 0

    # --- ingress ------------------------------------------------------------------

    def submit_many(
        self, payloads: Sequence[bytes], kind: int = int(EntryKind.COMMAND)
    ) -> asyncio.Future[Receipt[EgressT]]:
        """Queue commands that must land together; raises `IngressFullError` when full.
        (`kind`: another entry kind, as `propose_version` logs a VERSION entry.)"""
        if not payloads:
            raise ValueError("nothing to submit")
        if len(payloads) > self.settings.max_batch_entries:
            raise ValueError(
                f"{len(payloads)} commands exceed the batch cap of "
                f"{self.settings.max_batch_entries}"
            )
        if self._stopping:
            raise IngressFullError("sequencer is stopping")
        if self._pending_entries + len(payloads) > self.settings.max_pending_entries:
            self._capacity.clear()
            raise IngressFullError(
                f"{self._pending_entries} commands pending (cap "
                f"{self.settings.max_pending_entries})"
            )
        future: asyncio.Future[Receipt[EgressT]] = asyncio.get_running_loop().create_future()
        submission = _Submission(payloads, future, kind)
        if submission.size_bytes > self.settings.max_batch_bytes:
            raise ValueError(f"{submission.size_bytes} bytes exceed the batch byte cap")
        self._pending.append(submission)
        self._pending_entries += len(payloads)
        self._wake.set()
        return future

    async def submit(self, payload: bytes) -> tuple[int, Sequence[EgressT]]:
        receipt = await self.submit_many((payload,))
        return receipt.first_position, receipt.outputs[0]

    async def propose_version(self, version: int) -> int:
        """Log a VERSION entry: the machine decides under `version` from its position on
        (every replica alike). The caller checks the group can run it; returns the
        entry's position once durable."""
        implemented = self.replica.machine.implemented_versions
        if version not in implemented:
            raise ValueError(f"this build does not implement state-machine version {version}")
        receipt = await self.submit_many((encode_version(version),), int(EntryKind.VERSION))
        return receipt.first_position

    @property
    def pending_entries(self) -> int:
        """Commands queued and not yet taken into a record."""
        return self._pending_entries

    @property
    def closed(self) -> bool:
        """Stopping or ended: no room will come again (a sequencer not yet started
        is not closed: its queue drains once it runs)."""
        return self._stopping or self._ended

    async def wait_capacity(self) -> None:
        """Return once the ingress has room again (the backpressure signal), or once
        the sequencer closes (callers then find `closed` and give up)."""
        await self._capacity.wait()

    def request_turn(self) -> None:
        """Run one loop turn soon, even if idle, so `between_batches` gets called."""
        self._turn_requested = True
        self._wake.set()

    def stop(self) -> None:
        """Finish what is queued, then leave `run`."""
        self._stopping = True
        self._wake.set()
        self._capacity.set()  # waiters for room see `closed` and give up

    def take_window_max_dwell_ms(self) -> float:
        """Longest queue dwell since the previous call (for saturation alerts)."""
        dwell, self._window_max_dwell_ns = self._window_max_dwell_ns, 0
        return dwell / 1e6

    def statistics(self) -> SequencerStatistics:
        return SequencerStatistics(
            batches=self._batches,
            entries=self._entries,
            pending_entries=self._pending_entries,
            last_batch_entries=self._last_batch_entries,
            max_queue_dwell_ms=self._max_dwell_ns / 1e6,
            applied_position=self.replica.applied_position,
            consensus_time_ms=self._consensus_time_ms,
            clock_steps_back=self._clock_steps_back,
        )

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        """Form, append and apply batches until stopped; on failure, fail every waiter."""
        self.running = True
        try:
            await self._run_batches()
        except BaseException as error:
            self._stopping = True
            failure = error if isinstance(error, Exception) else IngressFullError("stopped")
            while self._pending:
                submission = self._pending.popleft()
                if not submission.future.done():
                    submission.future.set_exception(failure)
            self._pending_entries = 0
            raise
        finally:
            self.running = False
            self._ended = True
            self._capacity.set()  # waiters for room see `closed` and give up

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        timer_interval = self.settings.timer_interval_ms
        self._find_clock_behind_log(self._clock_ms())
        if timer_interval:
            self._next_timer_ms = self._clock_ms()
        while True:
            if not self._pending and not self._turn_requested:
                if self._stopping:
                    return
                now_ms = self._clock_ms()
                if timer_interval:
                    self._follow_clock_steps(now_ms)
                if not timer_interval or now_ms < self._next_timer_ms:
                    self._wake.clear()
                    handle = None
                    if timer_interval:
                        delay = (self._next_timer_ms - now_ms) / 1000
                        handle = loop.call_later(delay, self._wake.set)
                    await self._wake.wait()
                    if handle is not None:
                        handle.cancel()
            self._turn_requested = False
            await self._run_one_batch()
            if self._between_batches is not None:
                self._between_batches()

    async def _run_one_batch(self) -> None:
        settings = self.settings
        now_ms = self._clock_ms()
        consensus_time_ms = max(self._consensus_time_ms, now_ms)
        entries: list[tuple[int, bytes]] = []
        taken: list[_Submission] = []
        taken_bytes = 0
        now_ns = time.perf_counter_ns()
        while self._pending:
            submission = self._pending[0]
            if taken and (
                len(entries) + len(submission.payloads) > settings.max_batch_entries
                or taken_bytes + submission.size_bytes > settings.max_batch_bytes
            ):
                break
            self._pending.popleft()
            taken.append(submission)
            taken_bytes += submission.size_bytes
            kind = submission.kind
            entries.extend([(kind, payload) for payload in submission.payloads])
            dwell = now_ns - submission.enqueued_ns
            observe_dwell(dwell / 1e9)
            if dwell > self._window_max_dwell_ns:
                self._window_max_dwell_ns = dwell
                self._max_dwell_ns = max(self._max_dwell_ns, dwell)
        self._pending_entries -= len(entries)
        timer_index = -1
        if settings.timer_interval_ms:
            self._follow_clock_steps(now_ms)
            if taken:
                self._busy_timer_cadence(now_ms)
            if now_ms >= self._next_timer_ms:
                timer_index = len(entries)
                entries.append((int(EntryKind.TIMER), b""))
                self._next_timer_ms = now_ms + self._timer_spacing_ms
        latest = self.replica.latest_hash
        if latest is not None and latest[0] > self._last_checkpoint_sent:
            entries.append((int(EntryKind.CHECKPOINT), encode_checkpoint(*latest)))
            self._last_checkpoint_sent = latest[0]
        if not entries:
            return
        if not self._capacity.is_set() and self._pending_entries < settings.max_pending_entries:
            self._capacity.set()
        batch = LogBatch(self.replica.applied_position + 1, consensus_time_ms, entries)
        record = encode_batch(batch)
        # Handed to the writer before the apply; whether the two overlap is up to the
        # scheduler (module docstring).
        durable = self.store.append(batch, record)
        try:
            outputs = self.replica.apply_batch(batch)
        except BaseException:
            # The state moved past a record that may not be durable: crash-only.
            await asyncio.gather(durable, return_exceptions=True)
            raise
        try:
            await durable
        except BaseException as error:
            for submission in taken:
                if not submission.future.done():
                    submission.future.set_exception(error)
            raise
        self.durable_position = batch.last_position
        self._consensus_time_ms = consensus_time_ms
        self._batches += 1
        self._entries += len(entries)
        self._last_batch_entries = len(entries)
        cursor = 0
        first = batch.first_position
        for submission in taken:
            count = len(submission.payloads)
            if not submission.future.done():
                receipt: Receipt[EgressT] = Receipt(
                    first + cursor, outputs[cursor : cursor + count], consensus_time_ms
                )
                submission.future.set_result(receipt)
            cursor += count
        if timer_index >= 0 and not taken and not outputs[timer_index]:
            self._idle_timer_cadence()
        elif timer_index >= 0 and outputs[timer_index]:
            self._busy_timer_cadence(now_ms)
        if self._on_durable is not None:
            self._on_durable(batch, outputs)

    def _find_clock_behind_log(self, now_ms: int) -> None:
        """A writer whose clock is behind the log's consensus time (the previous
        leader's clock ran fast or was stepped ahead, or this host's was stepped back
        while it was down) holds that time until its clock passes it: to everything
        waiting on consensus time this is a step back, and is counted and logged as
        one (a step seen while writing is found by `_follow_clock_steps`)."""
        widest = self.settings.widest_timer_spacing_ms
        if self._consensus_time_ms > now_ms + widest:
            log.warning(
                "sequencer.clock_behind_log",
                by_ms=self._consensus_time_ms - now_ms,
                consensus_time_ms=self._consensus_time_ms,
            )
            self._clock_steps_back += 1

    def _follow_clock_steps(self, now_ms: int) -> None:
        """A wall clock stepped back (an NTP step, an operator) leaves the next timer as
        far in the future as the step: timers would stop for its whole length. A next
        timer further away than the widest spacing is brought back to one spacing from
        now. (Consensus time itself never goes back: it holds until the clock passes it.)"""
        widest = self.settings.widest_timer_spacing_ms
        if self._next_timer_ms > now_ms + widest:
            log.warning(
                "sequencer.clock_stepped_back",
                by_ms=self._next_timer_ms - self._timer_spacing_ms - now_ms,
                consensus_time_ms=self._consensus_time_ms,
            )
            self._next_timer_ms = now_ms + self._timer_spacing_ms
            self._clock_steps_back += 1

    def _busy_timer_cadence(self, now_ms: int) -> None:
        interval = self.settings.timer_interval_ms
        if self._timer_spacing_ms != interval:
            self._timer_spacing_ms = interval
            self._next_timer_ms = min(self._next_timer_ms, now_ms + interval)

    def _idle_timer_cadence(self) -> None:
        """A timer entry with no command beside it produced nothing: space the next
        ones wider (the next timer is already scheduled at the current spacing)."""
        widest = self.settings.widest_timer_spacing_ms
        self._timer_spacing_ms = min(2 * self._timer_spacing_ms, widest)
