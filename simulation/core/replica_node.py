"""One replica of a shard or matcher group: the real `Replica` over the simulated etcd log.

It does what `services/runtime/replicated_host.py` does, step by step:
- a replica boots from its newest valid snapshot, then follows the log in etcd as
  `LogFollower` does: it reads the records to the log's end, watches their keys from
  the revision that read saw, and applies each change that follows on (checksummed
  `LogBatch` bytes, through the real `Replica`, which checks the leader's state hashes
  at CHECKPOINT entries); a change that does not follow on reads the range again at
  once, a broken or compacted watch (or a read etcd does not answer) after
  `REREAD_MS`;
- when the group has no leader it campaigns; the winner reads the log to its end and
  only then leads: it batches the commands it was sent, adds TIMER entries on its
  clock and CHECKPOINT entries for the hashes it recorded (and a VERSION entry
  switching the group to the newest state-machine version the build implements,
  while it is not there yet: what `oms upgrade activate` logs once every replica
  runs the build, as here they all do; so the campaign checks today's rules, and
  the switch itself under faults), appends the record
  fenced by its term, and only then applies it and releases its egress;
- a leader whose append is fenced or whose lease is gone stops at once and starts
  again as a follower (crash-only), losing what it had not appended;
- while etcd has no quorum a leader retries its append (the same record) and ends
  once it has failed for `APPEND_TIMEOUT_MS` (`EtcdLogStore`'s deadline); a
  follower reads again on its next tick; a process that cannot read the log at its
  start ends and is started again by its supervisor;
- a matcher replica checks its market-data feed after every record it applies
  (`feed_check.py`), starting again from its machine's feed at every restore;
- every few records it writes a snapshot, and the leader truncates the log behind
  the oldest snapshot any live replica still keeps, then compacts etcd's history at
  most every `COMPACT_INTERVAL_MS`; a replica whose position was truncated installs a
  peer's snapshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from protos.oms.v1 import matcher_pb2, shard_pb2
from services.matcher.core.machine import MatcherEgress, MatcherMachine
from services.matcher.core.market_feed import BookUpdate
from services.runtime.core.log_batch import (
    LogBatch,
    decode_batch_at,
    encode_batch,
    encode_checkpoint,
    encode_version,
)
from services.runtime.core.replica import Replica, ReplicaInvariantError
from services.runtime.core.snapshot_policy import EMPTY_STATE, replay_again_from
from services.runtime.core.state_machine import EntryKind
from services.shard.core.egress import Egress, ShardResult
from services.shard.core.errors import ShardInvariantError
from services.shard.core.shard_machine import ShardMachine
from simulation.core.defects import (
    ACK_BEFORE_APPEND,
    FEED_OMITS_REMOVED_LEVELS,
    FOLLOWER_RESUMES_WATCH,
    IGNORES_EGRESS_FLOOR,
    TRUSTS_UNANSWERED_APPEND,
    UNCHECKED_SNAPSHOTS,
)
from simulation.core.etcd_model import (
    EtcdUnavailable,
    LogCompacted,
    RecordChange,
    SimWatch,
    WatchBroken,
    WatchCompacted,
)
from simulation.core.feed_check import MarketFeedCheck
from simulation.core.replica_disk import ReplicaDisk, SnapshotFile

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

TICK_MS = 2  # a leader batches what arrived within this
FOLLOWER_TICK_MS = 5  # a follower reads what its watch delivered this often
REREAD_MS = 200  # `log_follower.RETRY_S`: after a broken or compacted watch
# As `ReplicationSettings.compact_interval_s` (30 s there, against snapshots every
# 200,000 entries; the simulation snapshots every few hundred).
COMPACT_INTERVAL_MS = 1_000
LEASE_TTL_MS = 1_000
TIMER_INTERVAL_MS = 100
CHECKPOINT_INTERVAL_ENTRIES = 16
SNAPSHOT_SYNC_DELAY_MS = 20
COMMANDS_PER_ENTRY = 64
ENTRIES_PER_RECORD = 8
RECORDS_PER_READ = 32
RETAINED_EGRESS_RECORDS = 5_000
# As `EtcdLogStore.append_timeout_s` against the lease TTL (5 s against 2 s there).
APPEND_TIMEOUT_MS = 2_500
RESTART_BACKOFF_MS = 200  # the supervisor's wait before starting a process again

_COMMAND = int(EntryKind.COMMAND)
_TIMER = int(EntryKind.TIMER)
_CHECKPOINT = int(EntryKind.CHECKPOINT)
_VERSION = int(EntryKind.VERSION)


class GroupReplica:
    kind = ""

    def __init__(self, world: SimWorld, group: str, index: int) -> None:
        self.world = world
        self.group = group
        self.name = f"{group}/{index}"
        self.disk = ReplicaDisk()
        self.clock_offset_ms = 0
        self.alive = True
        self.paused_until_ms = 0
        self.stopped: str | None = None  # a runtime invariant broke: stays down, a violation
        self.incarnation = 0
        self.boots = 0
        self.snapshot_installs = 0
        self.machine: Any = None
        self.replica: Replica[Any] = Replica(self.new_machine(), CHECKPOINT_INTERVAL_ENTRIES)
        self.fence: int | None = None
        self.lease: int | None = None
        self.pending: list[Any] = []
        self.watch: SimWatch | None = None  # the follower's watch of the log's keys
        self.boot()

    # --- what a kind of machine adds -----------------------------------------------

    def new_machine(self) -> Any:
        raise NotImplementedError

    def encode_entry(self, commands: Sequence[Any]) -> bytes:
        raise NotImplementedError

    def before_apply(self, batch: LogBatch) -> None:
        """Just before a record is applied."""

    def after_apply(self, batch: LogBatch, outputs: list[Sequence[Any]], leading: bool) -> None:
        """Egress of an applied record (released by the leader only)."""

    def reset_memory(self) -> None:
        """What the process kept beside the machine, gone at a restart."""

    # --- process life ----------------------------------------------------------------

    def boot(self) -> None:
        """A process start: memory from the newest valid snapshot, then the log."""
        self.incarnation += 1
        self.boots += 1
        self.fence = None
        self.lease = None
        self.pending = []
        self.checkpoint_due: tuple[int, bytes] | None = None
        self.last_timer_ms = 0
        self.in_flight: tuple[LogBatch, bytes] | None = None  # an append being retried
        self.unanswered_since_ms: int | None = None
        self._stop_watching()
        self.reread_at_ms = 0
        self.resume_revision = 0  # after the last change seen (the planted defect's)
        self.compacted_at_ms: int | None = None
        try:
            self._recover()
        except EtcdUnavailable:
            # The log cannot be read: the process ends, its supervisor starts it again.
            self.world.figures["starts_failed_etcd_unavailable"] += 1
            self.alive = False
            self.incarnation += 1
            self.world.scheduler.after(RESTART_BACKOFF_MS, f"restart {self.name}", self._supervise)

    def _supervise(self) -> None:
        """The supervisor starting a process that ended by itself (unless it is up)."""
        if not self.alive:
            self.restart()

    def _recover(self) -> None:
        check = self.world.config.defect != UNCHECKED_SNAPSHOTS
        file = self.disk.newest_valid(check=check)
        if not self._restore(file):
            return
        # As `RuntimeNode.recover`: the log replayed to its end, then, if the egress
        # floor is still before the snapshot, again from the newest one at or before it.
        self._read_to_end()
        floor = self.egress_floor()
        if self.stopped is None and file is not None and floor is not None:
            first = self.world.etcd.truncated_through.get(self.group, 0) + 1
            again = replay_again_from(file.position, floor, self.disk.positions(), first)
            if again is not None:
                older = None if again == EMPTY_STATE else self.disk.newest_valid(check, again)
                if again == EMPTY_STATE or older is not None:
                    self.world.figures["replays_for_egress"] += 1
                    if not self._restore(older):
                        return
                    self._read_to_end()
        self._schedule_tick(1)

    def _restore(self, file: SnapshotFile | None) -> bool:
        """A fresh machine, from `file` if any (False: it would not load, stopped)."""
        self.machine = self.new_machine()
        self.replica = Replica(self.machine, CHECKPOINT_INTERVAL_ENTRIES)
        self.since_snapshot = 0
        self.reset_memory()
        if file is not None:
            try:
                self.replica.restore(file.payload, file.position, file.consensus_time_ms)
            except Exception as error:
                self.stopped = f"snapshot {file.position} unreadable: {error!r}"
                self.world.violation("replica-stopped", f"{self.name}: {self.stopped}")
                return False
        self.restored()
        return True

    def restored(self) -> None:
        """After a snapshot (or nothing) was loaded, before the log is applied."""

    def snapshot_for_peer(self, truncated_through: int) -> SnapshotFile | None:
        """The file kept for the egress floor, if the log still follows it."""
        floor = self.egress_floor()
        if floor is None:
            return None
        file = self.disk.newest_valid(at_or_before=floor)
        if file is None or not file.synced or file.position < truncated_through:
            return None
        return file

    def egress_floor(self) -> int | None:
        """The machine's egress floor, if a consumer must never skip its egress."""
        return None

    def crash(self) -> None:
        """SIGKILL: memory gone, unsynced snapshot writes lost or torn; back after a while."""
        world = self.world
        for note in self.disk.crash(world.rng):
            world.faults.trace.append(f"{world.scheduler.now_ms} disk {self.name} {note}")
        self.alive = False
        self.incarnation += 1
        if self.fence is not None:
            self.fence = None  # its lease expires by itself: nobody resigns for a dead process
        self.pending = []
        self._stop_watching()  # its connections reset: etcd cancels its watch

    def restart(self) -> None:
        if self.stopped is None:
            self.alive = True
            self.boot()

    def _restart_as_follower(self, why: str) -> None:
        unavailable = "unavailable" in why
        self.world.figures[
            "leaders_ended_etcd_unavailable" if unavailable else "fenced_leader_restarts"
        ] += 1
        self.world.faults.trace.append(f"{self.world.scheduler.now_ms} {self.name} stops: {why}")
        self.boot()

    @property
    def leading(self) -> bool:
        return self.alive and self.stopped is None and self.fence is not None

    def clock_ms(self) -> int:
        return max(0, self.world.scheduler.now_ms + self.clock_offset_ms)

    def _schedule_tick(self, delay_ms: int) -> None:
        incarnation = self.incarnation
        self.world.scheduler.after(delay_ms, f"tick {self.name}", lambda: self._tick(incarnation))

    def _tick(self, incarnation: int) -> None:
        if incarnation != self.incarnation or not self.alive or self.stopped is not None:
            return
        scheduler = self.world.scheduler
        if scheduler.now_ms < self.paused_until_ms:
            self._schedule_tick(self.paused_until_ms - scheduler.now_ms)
            return
        self._schedule_tick(TICK_MS if self.fence is not None else FOLLOWER_TICK_MS)
        etcd = self.world.etcd
        if self.fence is not None:
            self._lead()
            return
        self._follow()
        if self.stopped is not None or incarnation != self.incarnation:
            return
        try:
            if self.lease is None or not etcd.keep_alive(self.lease):
                self.lease = etcd.grant(LEASE_TTL_MS)
            self._campaign()
        except EtcdUnavailable:
            pass  # asked again on the next tick

    # --- follower --------------------------------------------------------------------

    def _follow(self) -> None:
        """One turn of `LogFollower.run`: the range read to the end and a watch from the
        revision it saw, or the changes the watch delivered since the last turn."""
        world = self.world
        etcd = world.etcd
        now = world.scheduler.now_ms
        if now < self.reread_at_ms:
            return
        try:
            while self.stopped is None:
                if self.watch is None:
                    if world.config.defect == FOLLOWER_RESUMES_WATCH and self.resume_revision:
                        self.watch = etcd.watch(self.group, self.resume_revision)
                        continue
                    world.figures["follower_range_reads"] += 1
                    self._read_to_end()
                    if self.stopped is not None:
                        return
                    self.watch = etcd.watch(self.group, etcd.revision + 1)
                changes = etcd.changes(self.watch)
                if changes and world.network.breaks(f"watch {self.name}"):
                    etcd.break_watch(self.watch)  # what it delivered is lost with it
                    continue
                if not self._apply_changes(changes):
                    return
                # A change that does not follow on: read the range again.
                world.figures["follower_watch_gaps"] += 1
                self._stop_watching()
        except (EtcdUnavailable, WatchCompacted, WatchBroken) as error:
            world.figures[f"follower_rereads_{type(error).__name__}"] += 1
            self._stop_watching()
            self.reread_at_ms = now + REREAD_MS

    def _apply_changes(self, changes: list[RecordChange]) -> bool:
        """Apply the puts that follow on; True at one that does not (a gap)."""
        for change in changes:
            self.resume_revision = change.revision + 1
            if change.kind != "put":
                continue  # the leader truncating what every replica has snapshotted
            expected = self.replica.applied_position + 1
            if change.first_position < expected:
                continue  # already applied (a range read overlapped the watch)
            if change.first_position > expected:
                return True
            self._apply_record(change.data, leading=False)
            if self.stopped is not None:
                return False
        return False

    def _stop_watching(self) -> None:
        if self.watch is not None:
            self.world.etcd.close(self.watch)
        self.watch = None

    def _read_to_end(self) -> None:
        """Range reads from the applied position to the log's end (`read_records`)."""
        etcd = self.world.etcd
        while True:
            try:
                records = etcd.read(self.group, self.replica.applied_position + 1, RECORDS_PER_READ)
            except LogCompacted:
                if not self._install_from_peer():
                    return
                continue
            for record in records:
                self._apply_record(record.data, leading=False)
                if self.stopped is not None:
                    return
            if len(records) < RECORDS_PER_READ:
                return

    def _install_from_peer(self) -> bool:
        """The records after this replica's position are gone: a peer's state instead."""
        floor = self.world.etcd.truncated_through.get(self.group, 0)
        for peer in self.world.replicas_of(self.group):
            if peer is self or not peer.alive or peer.stopped is not None:
                continue
            if peer.replica.applied_position < floor:
                continue
            self.machine = self.new_machine()
            self.replica = Replica(self.machine, CHECKPOINT_INTERVAL_ENTRIES)
            # As `snapshot_transfer.py`: the peer's snapshot kept for its egress floor
            # when the log still follows it, else its state now.
            held = peer.snapshot_for_peer(floor)
            if held is not None:
                self.replica.restore(held.payload, held.position, held.consensus_time_ms)
            else:
                self.replica.restore(
                    peer.machine.snapshot(),
                    peer.replica.applied_position,
                    peer.replica.consensus_time_ms,
                )
            self.reset_memory()
            self.restored()
            self.snapshot_installs += 1
            self.world.figures["snapshot_installs"] += 1
            return True
        return False

    def _campaign(self) -> None:
        etcd = self.world.etcd
        if self.lease is None or etcd.leader(self.group) is not None:
            return
        fence = etcd.campaign(self.group, self.name, self.lease)
        if fence is None:
            return
        # Nobody else can append now: the follower stopped, read to the end, then lead.
        self._stop_watching()
        try:
            self._read_to_end()
        except EtcdUnavailable:
            self._restart_as_follower("log unavailable after winning")
            return
        if self.stopped is not None:
            return
        self.fence = fence
        self.last_timer_ms = self.replica.consensus_time_ms
        self.world.leader_elected(self)

    # --- leader ----------------------------------------------------------------------

    def _lead(self) -> None:
        try:
            self._lead_once()
        except EtcdUnavailable:
            if self.in_flight is not None and self.world.config.defect == TRUSTS_UNANSWERED_APPEND:
                data = self.in_flight[1]
                self.in_flight = None
                self._apply_record(data, leading=True)
            now = self.world.scheduler.now_ms
            if self.unanswered_since_ms is None:
                self.unanswered_since_ms = now
            elif now - self.unanswered_since_ms >= APPEND_TIMEOUT_MS:
                self._restart_as_follower("log unavailable")
            return
        self.unanswered_since_ms = None

    def _lead_once(self) -> None:
        etcd = self.world.etcd
        assert self.fence is not None and self.lease is not None
        if self.in_flight is not None:
            # The append etcd did not answer, sent again (it may have committed).
            batch, data = self.in_flight
            self._append_then_apply(batch, data)
            return
        # A process that resumes may append before its keep-alive runs, or after.
        keep_alive_first = self.world.rng.randrange(2) == 0
        if keep_alive_first and not etcd.keep_alive(self.lease):
            self._restart_as_follower("lease lost")
            return
        entries: list[tuple[int, bytes]] = []
        due = self.checkpoint_due
        if due is not None:
            entries.append((_CHECKPOINT, encode_checkpoint(*due)))
            self.checkpoint_due = None
        machine = self.replica.machine
        newest = max(machine.implemented_versions)
        if machine.version < newest:
            entries.append((_VERSION, encode_version(newest)))
        consensus_ms = max(self.replica.consensus_time_ms, self.clock_ms())
        if consensus_ms - self.last_timer_ms >= TIMER_INTERVAL_MS:
            entries.append((_TIMER, b""))
            self.last_timer_ms = consensus_ms
        taken = self.pending[: COMMANDS_PER_ENTRY * ENTRIES_PER_RECORD]
        del self.pending[: len(taken)]
        for start in range(0, len(taken), COMMANDS_PER_ENTRY):
            entries.append((_COMMAND, self.encode_entry(taken[start : start + COMMANDS_PER_ENTRY])))
        if entries:
            batch = LogBatch(self.replica.applied_position + 1, consensus_ms, entries)
            data = encode_batch(batch)
            if self.world.config.defect == ACK_BEFORE_APPEND:
                self._apply_record(data, leading=True)
                if not etcd.append(
                    self.group, self.fence, batch.first_position, batch.last_position, data
                ):
                    self._restart_as_follower("append fenced")
                return
            self._append_then_apply(batch, data)
            if self.fence is None or not self.alive:
                return
        if not keep_alive_first and self.fence is not None and not etcd.keep_alive(self.lease):
            self._restart_as_follower("lease lost")

    def _append_then_apply(self, batch: LogBatch, data: bytes) -> None:
        assert self.fence is not None
        self.in_flight = (batch, data)
        appended = self.world.etcd.append(
            self.group, self.fence, batch.first_position, batch.last_position, data
        )
        self.in_flight = None
        if not appended:
            self._restart_as_follower("append fenced")
            return
        self.world.record_appended(self.group, batch.first_position, self.fence)
        if any(kind == _VERSION for kind, _ in batch.entries):
            self.world.figures["version_switches_logged"] += 1
        if self.world.crash_between_append_and_apply(self):
            return
        self._apply_record(data, leading=True)

    # --- applying --------------------------------------------------------------------

    def _apply_record(self, data: bytes, leading: bool) -> None:
        batch, _ = decode_batch_at(data)
        before = self.replica.latest_hash
        self.before_apply(batch)
        try:
            outputs = self.replica.apply_batch(batch)
            self.check_machine()
        except (ReplicaInvariantError, ShardInvariantError) as error:
            self.stopped = f"{type(error).__name__}: {error}"
            self.fence = None
            self.world.violation("replica-stopped", f"{self.name}: {self.stopped}")
            return
        latest = self.replica.latest_hash
        if latest is not None and latest != before:
            self.world.hash_recorded(self, latest[0], latest[1])
            if leading:
                self.checkpoint_due = latest
        self.after_apply(batch, outputs, leading)
        self.since_snapshot += len(batch.entries)
        if self.since_snapshot >= self.world.config.snapshot_entries:
            self._snapshot()

    def check_machine(self) -> None:
        """The machine's own invariants after every record."""

    def _snapshot(self) -> None:
        self.since_snapshot = 0
        replica = self.replica
        file = self.disk.write(
            replica.applied_position, replica.consensus_time_ms, self.machine.snapshot()
        )
        incarnation = self.incarnation

        def synced() -> None:
            if incarnation == self.incarnation:
                self.disk.sync(file, self.egress_floor())
                if self.leading:
                    self._truncate_and_compact()

        self.world.scheduler.after(SNAPSHOT_SYNC_DELAY_MS, f"sync {self.name}", synced)

    def _truncate_and_compact(self) -> None:
        """As `ReplicatedHost._snapshot_published`: the records every live replica is
        past deleted, then now and then etcd's history compacted at the revision seen."""
        if not self.world.truncate_log(self.group):
            return
        now = self.world.scheduler.now_ms
        if self.compacted_at_ms is not None and now - self.compacted_at_ms < COMPACT_INTERVAL_MS:
            return
        self.compacted_at_ms = now
        etcd = self.world.etcd
        with contextlib.suppress(EtcdUnavailable, WatchCompacted):
            etcd.compact(etcd.revision)


class ShardReplica(GroupReplica):
    kind = "shard"

    def new_machine(self) -> ShardMachine:
        return ShardMachine(self.world.shard_settings[self.group])

    def encode_entry(self, commands: Sequence[Any]) -> bytes:
        return shard_pb2.ShardCommandBatch(commands=commands).SerializeToString()

    def reset_memory(self) -> None:
        # The durable egress window (`DurableEgressFeed`): rebuilt from the replay.
        self.window: deque[tuple[int, int, Sequence[Egress]]] = deque()
        self.window_start = self.replica.applied_position + 1

    def check_machine(self) -> None:
        self.machine.check_invariants()

    def after_apply(self, batch: LogBatch, outputs: list[Sequence[Any]], leading: bool) -> None:
        window = self.window
        position = batch.first_position
        for items in outputs:
            if items:
                window.append((position, batch.consensus_time_ms, items))
                if leading:
                    for item in items:
                        if type(item) is ShardResult:
                            self.world.shard_result(self.group, item)
            position += 1
        while len(window) > RETAINED_EGRESS_RECORDS:
            self.window_start = window.popleft()[0] + 1

    def window_from(self, position: int) -> list[tuple[int, int, Sequence[Egress]]] | None:
        """Egress at `position` and after; None when part of it is not retained here
        (`EgressWindowExceededError`: before this process's restore point, or trimmed)."""
        if position > self.replica.applied_position:
            return []
        if position < self.window_start:
            return None
        found = []
        for entry in reversed(self.window):  # consumers read near the end
            if entry[0] < position:
                break
            found.append(entry)
        found.reverse()
        return found

    def restored(self) -> None:
        self.window_start = self.replica.applied_position + 1

    def egress_floor(self) -> int | None:
        if self.world.config.defect == IGNORES_EGRESS_FLOOR:
            return None
        floor: int | None = self.machine.egress_floor
        return floor


class MatcherReplica(GroupReplica):
    kind = "matcher"

    def __init__(self, world: SimWorld, group: str, index: int) -> None:
        self.feed_check = MarketFeedCheck()
        super().__init__(world, group, index)

    def new_machine(self) -> MatcherMachine:
        return MatcherMachine(self.world.engine_settings[self.group])

    def encode_entry(self, commands: Sequence[Any]) -> bytes:
        return matcher_pb2.MatcherCommandBatch(commands=commands).SerializeToString()

    def restored(self) -> None:
        # What this replica's feed said before is gone with its memory: its consumers
        # start again from a snapshot of the book (`StreamMarketData` without a position).
        self.feed_check.start(self.machine)

    def before_apply(self, batch: LogBatch) -> None:
        self.feed_check.before_record(self.machine, batch)

    def after_apply(self, batch: LogBatch, outputs: list[Sequence[Any]], leading: bool) -> None:
        """The market-data feed checked on every applying replica (`feed_check.py`)."""
        if self.world.config.defect == FEED_OMITS_REMOVED_LEVELS:
            outputs = [tuple(map(_without_removed_levels, items)) for items in outputs]
        problem = self.feed_check.after_record(self.machine, batch, outputs)
        if problem is not None:
            self.world.violation("market-feed", f"{self.name} {problem}")
            self.feed_check.start(self.machine)  # one finding, not one per record after it


def _without_removed_levels(egress: MatcherEgress) -> MatcherEgress:
    """The planted defect: book updates that leave out the levels that went away."""
    market = tuple(
        record._replace(levels=tuple(level for level in record.levels if level.total_lots))
        if type(record) is BookUpdate
        else record
        for record in egress.market
    )
    return dataclasses.replace(egress, market=market)
