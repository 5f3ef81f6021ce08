"""A runtime node: recovery, then the sequencer with background snapshots.

Recovery is the newest valid snapshot plus a replay of the log after it, with
no database read. Snapshots are taken every `snapshot_interval_entries`
between two batches (where the applied position is also the durable one), in
a forked child; once published, the log before the oldest retained snapshot
is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import structlog

from services.runtime.background_snapshot import ForkedSnapshotWriter
from services.runtime.core.replica import Replica, ReplicaInvariantError
from services.runtime.core.snapshot_policy import (
    EMPTY_STATE,
    log_needed_after,
    replay_again_from,
)
from services.runtime.core.state_machine import StateMachine
from services.runtime.errors import LogCorruptedError, SnapshotUnavailableError
from services.runtime.file_log import FileLogStore
from services.runtime.log_store import LogStore, LogTail
from services.runtime.sequencer import (
    DurableHandler,
    Sequencer,
    SequencerSettings,
    wall_clock_ms,
)
from services.runtime.snapshot_files import FileSnapshotStore, Snapshot

log = structlog.get_logger(__name__)
EgressT = TypeVar("EgressT")


@dataclass(frozen=True, slots=True)
class NodeSettings:
    data_dir: Path
    checkpoint_interval_entries: int = 10_000
    snapshot_interval_entries: int = 1_000_000  # 0: never snapshot automatically
    snapshots_retained: int = 2
    sequencer: SequencerSettings = field(default_factory=SequencerSettings)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    snapshot_position: int  # 0 when recovery started from an empty state
    replayed_entries: int
    applied_position: int
    torn_bytes_dropped: int
    duration_ms: float


class RuntimeNode(Generic[EgressT]):
    """One replica that is also the leader (the embedded, single-node mode)."""

    def __init__(
        self,
        machine: StateMachine[EgressT],
        settings: NodeSettings,
        *,
        log_store: LogStore | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        on_durable: DurableHandler[EgressT] | None = None,
        egress_floor: Callable[[], int | None] | None = None,
    ) -> None:
        self.settings = settings
        # The machine's egress floor (`core/snapshot_policy.py`): which older snapshot is
        # kept, and replayed from at a restart, so a consumer finds its next position.
        self.egress_floor = egress_floor
        self.replica: Replica[EgressT] = Replica(machine, settings.checkpoint_interval_entries)
        # The state before the log's first entry, as a snapshot: a restart whose egress
        # floor is before every snapshot kept replays the whole log from it.
        self._empty_state = machine.snapshot() if egress_floor is not None else b""
        self._empty_state_hash = machine.state_hash() if egress_floor is not None else b""
        self.log_store: LogStore = log_store or FileLogStore(settings.data_dir / "log")
        self.snapshots = FileSnapshotStore(
            settings.data_dir / "snapshots", settings.snapshots_retained
        )
        self.snapshot_writer = ForkedSnapshotWriter(
            self.snapshots,
            getattr(self.log_store, "release_in_forked_child", None),
            egress_floor=egress_floor,
        )
        self._clock_ms = clock_ms
        self.on_durable = on_durable  # may be set until recover() builds the sequencer
        self._sequencer: Sequencer[EgressT] | None = None
        self._last_snapshot_position = 0
        self._snapshot_tasks: set[asyncio.Task[int]] = set()
        self._snapshot_requests: list[asyncio.Future[int]] = []
        self.snapshot_failures = 0
        self.last_snapshot_error: BaseException | None = None
        # Given the oldest snapshot kept, after each one is published. Unset: the log
        # is truncated to it (one replica: its own snapshots are all that matter).
        # A replicated host sets it: the log is the group's, and so is the decision.
        self.after_snapshot: Callable[[int], Awaitable[None]] | None = None

    @property
    def sequencer(self) -> Sequencer[EgressT]:
        if self._sequencer is None:
            raise RuntimeError("recover() the node before using its sequencer")
        return self._sequencer

    async def recover(
        self,
        on_replayed: DurableHandler[EgressT] | None = None,
        *,
        writer: bool = True,
        on_rewound: Callable[[], None] | None = None,
    ) -> RecoveryReport:
        """Newest valid snapshot + replay of the log after it; no database read.

        `on_replayed` receives the egress of every replayed record, so a durable
        egress feed covers the tail again after a restart. If the machine's egress floor
        is then still before that snapshot, the replay is done again from the newest
        snapshot at or before the floor (`core/snapshot_policy.py`), `on_rewound` called
        first (the feed forgets the first pass's records). With `writer` false (a
        follower) no sequencer is built: `become_writer` builds one when it leads.
        """
        started = time.perf_counter()
        tail = await self.log_store.open()
        snapshot = self.snapshots.load_newest_valid()
        replayed = await self._restore_and_replay(snapshot, tail, on_replayed)
        floor = self.egress_floor() if self.egress_floor is not None else None
        if floor is not None and snapshot is not None:
            has_entries = tail.last_position >= tail.first_position
            again = replay_again_from(
                snapshot.position,
                floor,
                self.snapshots.positions(),
                tail.first_position if has_entries else snapshot.position + 1,
            )
            older = None if again is None else self._snapshot_at_or_before(again)
            if older is not None and older.position < snapshot.position:
                log.warning(
                    "runtime.replaying_for_egress",
                    newest_snapshot=snapshot.position,
                    egress_floor=floor,
                    from_snapshot=older.position,
                )
                if on_rewound is not None:
                    on_rewound()
                snapshot = older
                replayed = await self._restore_and_replay(snapshot, tail, on_replayed)
            elif floor < snapshot.position:
                log.warning(
                    "runtime.egress_floor_behind_snapshots",
                    newest_snapshot=snapshot.position,
                    egress_floor=floor,
                    kept=self.snapshots.positions(),
                )
        if writer:
            self._build_sequencer()
        replica = self.replica
        report = RecoveryReport(
            snapshot_position=snapshot.position if snapshot else 0,
            replayed_entries=replayed,
            applied_position=replica.applied_position,
            torn_bytes_dropped=tail.torn_bytes_dropped,
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        log.info("runtime.recovered", **_as_fields(report))
        return report

    def _snapshot_at_or_before(self, position: int) -> Snapshot | None:
        """The newest valid snapshot at or before `position`; at EMPTY_STATE, the state
        before the log's first entry."""
        if position == EMPTY_STATE:
            return Snapshot(EMPTY_STATE, 0, self._empty_state_hash, self._empty_state)
        return self.snapshots.load_newest_valid(at_or_before=position)

    async def _restore_and_replay(
        self,
        snapshot: Snapshot | None,
        tail: LogTail,
        on_replayed: DurableHandler[EgressT] | None,
    ) -> int:
        """Load `snapshot` (if any), apply the log after it to its end: entries replayed."""
        replica = self.replica
        if snapshot is not None:
            if snapshot.position > tail.last_position and tail.last_position >= tail.first_position:
                raise LogCorruptedError(
                    f"snapshot at {snapshot.position} is ahead of the log's end at "
                    f"{tail.last_position}: acknowledged entries are missing"
                )
            replica.restore(snapshot.body, snapshot.position, snapshot.consensus_time_ms)
            restored_hash = replica.machine.state_hash()
            if restored_hash != snapshot.state_hash:
                raise ReplicaInvariantError(
                    f"snapshot at {snapshot.position} restored to hash {restored_hash.hex()}, "
                    f"written with {snapshot.state_hash.hex()}"
                )
            self._last_snapshot_position = snapshot.position
        start = replica.applied_position + 1
        has_entries = tail.last_position >= tail.first_position
        if has_entries and tail.first_position > start:
            raise SnapshotUnavailableError(
                f"the log starts at {tail.first_position} but the newest valid snapshot "
                f"needs it from {start}"
            )
        replayed = 0
        if has_entries and tail.last_position >= start:
            async for batch in self.log_store.read_from(start):
                outputs = replica.apply_batch(batch)
                if on_replayed is not None:
                    on_replayed(batch, outputs)
                replayed += len(batch.entries)
        if replica.applied_position < tail.last_position:
            raise LogCorruptedError(
                f"replay stopped at {replica.applied_position}, log ends at {tail.last_position}"
            )
        return replayed

    def _build_sequencer(self) -> None:
        self._sequencer = Sequencer(
            self.replica,
            self.log_store,
            settings=self.settings.sequencer,
            clock_ms=self._clock_ms,
            on_durable=self.on_durable,
            between_batches=self._maybe_snapshot,
        )

    @property
    def writing(self) -> bool:
        return self._sequencer is not None

    async def become_writer(self, store: LogStore) -> None:
        """A follower that won the lead: append to `store` from its applied position on.

        The replica must already have applied the whole log (the caller caught up
        after winning, when no one else can append any more).
        """
        if self._sequencer is not None:
            raise RuntimeError("this node already writes")
        tail = await store.open()
        if tail.last_position != self.replica.applied_position:
            raise LogCorruptedError(
                f"the log ends at {tail.last_position} but this replica applied "
                f"{self.replica.applied_position}: catch up before writing"
            )
        self.log_store = store
        self._build_sequencer()

    def snapshot_between_records(self) -> None:
        """A follower's snapshot policy: every applied record is durable already."""
        self._maybe_snapshot()

    async def run(self) -> None:
        try:
            await self.sequencer.run()
        finally:
            await self._settle_snapshots()

    def stop(self) -> None:
        if self._sequencer is not None:
            self._sequencer.stop()

    async def close(self) -> None:
        await self._settle_snapshots()
        await self.log_store.close()

    async def snapshot_now(self) -> int:
        """Snapshot at a durable position and wait until it is published.

        While the sequencer runs, the snapshot is taken between two batches (the
        only place where everything applied is also durable); otherwise at once.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._snapshot_requests.append(future)
        if self._sequencer is not None and self._sequencer.running:
            self._sequencer.request_turn()
        else:
            self._maybe_snapshot()
        return await future

    async def _settle_snapshots(self) -> None:
        while self._snapshot_tasks:
            await asyncio.gather(*self._snapshot_tasks, return_exceptions=True)
        if self._snapshot_requests:  # asked for while stopping: everything applied is durable
            self._maybe_snapshot()
            while self._snapshot_tasks:
                await asyncio.gather(*self._snapshot_tasks, return_exceptions=True)

    def _maybe_snapshot(self) -> None:
        if self.snapshot_writer.in_progress_position is not None:
            return
        interval = self.settings.snapshot_interval_entries
        due = bool(interval) and (
            self.replica.applied_position - self._last_snapshot_position >= interval
        )
        if not due and not self._snapshot_requests:
            return
        sequencer = self._sequencer
        if sequencer is not None and sequencer.durable_position != self.replica.applied_position:
            if sequencer.running:
                return  # a record is still being written: the next turn will do
            # The loop stopped mid-record: this state may never become durable.
            error = SnapshotUnavailableError(
                f"applied position {self.replica.applied_position} is past the durable "
                f"position {sequencer.durable_position}; recover from the log instead"
            )
            for waiter in self._snapshot_requests:
                if not waiter.done():
                    waiter.set_exception(error)
            self._snapshot_requests = []
            return
        waiters, self._snapshot_requests = self._snapshot_requests, []
        started = time.perf_counter_ns()
        try:
            pid, position, pause = self.snapshot_writer.start(self.replica)  # type: ignore[arg-type]
        except BaseException as error:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            raise
        task = asyncio.get_running_loop().create_task(
            self._finish_snapshot(pid, position, pause, started, waiters)
        )
        self._snapshot_tasks.add(task)
        task.add_done_callback(self._snapshot_tasks.discard)

    async def _finish_snapshot(
        self,
        pid: int,
        position: int,
        pause_ns: int,
        started_ns: int,
        waiters: list[asyncio.Future[int]],
    ) -> int:
        try:
            await self.snapshot_writer.wait(pid, position, pause_ns, started_ns)
            await self._after_snapshot(position)
        except Exception as error:
            self.snapshot_failures += 1
            self.last_snapshot_error = error
            log.error("snapshot.failed", error=str(error))
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            return position
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(position)
        if self._snapshot_requests and self._sequencer is not None and self._sequencer.running:
            self._sequencer.request_turn()
        return position

    def log_needed_after(self) -> int:
        """The position the log must be kept after: the oldest snapshot kept, or the
        log's start when the egress floor is before every snapshot (`snapshot_policy`)."""
        floor = self.egress_floor() if self.egress_floor is not None else None
        return log_needed_after(self.snapshots.positions(), floor)

    async def _after_snapshot(self, position: int) -> int:
        self._last_snapshot_position = position
        needed_after = self.log_needed_after()
        if self.after_snapshot is not None:
            await self.after_snapshot(needed_after)
        elif needed_after:
            await self.log_store.truncate_before(needed_after + 1)
        log.info("snapshot.published", position=position, log_kept_after=needed_after)
        return position


def _as_fields(report: RecoveryReport) -> dict[str, object]:
    return {
        "snapshot_position": report.snapshot_position,
        "replayed_entries": report.replayed_entries,
        "applied_position": report.applied_position,
        "torn_bytes_dropped": report.torn_bytes_dropped,
        "duration_ms": round(report.duration_ms, 3),
    }
