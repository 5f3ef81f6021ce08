"""etcd as the mesh uses it: leases, a leader key per group, the fenced log, watches,
the compaction of its history.

- A lease lives `ttl_ms` of simulated time after its last keep-alive; an expired
  lease deletes the keys attached to it (the leader key).
- Campaigning creates the group's leader key if absent; its create revision is the
  writer's fence for the whole term.
- An append is a transaction: it succeeds only while the leader key still has the
  writer's create revision and the record starts right after the log's end (the
  real `EtcdLogStore` compares both). A fenced append changes nothing.
- Truncation deletes records before a position; reading from before the oldest kept
  record raises `LogCompacted` (the reader then installs a peer's snapshot).
- An outage (quorum lost, `go_down`): every call raises `EtcdUnavailable`, and nothing
  expires meanwhile (no etcd leader runs the lease clock); the first call after it
  finds every lease extended to a TTL past the outage's end (etcd's new leader
  promotes the leases). An append sent in the outage's first moments may commit
  though its caller hears nothing; the caller's retry then finds its own record there
  (the real append's key-absent guard, read back) and takes it as appended.
- Every change has a revision, and a group's changes to its records (a put per
  append, a delete per record truncated) stay in the history until a compaction at a
  revision drops those before it (the whole store's, as etcd compacts: one group's
  leader compacts every group's history). A watch from a revision delivers the
  changes from there in revision order. While its reader keeps up (synced) a change
  is sent as it commits; a reader that lets `WATCH_BUFFER_RESPONSES` revisions' changes
  wait (a paused process) falls behind (unsynced) and is caught up from the history when it
  reads again, unless a compaction went past it: then it is cancelled with
  `WatchCompacted` (etcd's `compact_revision`), and one asked from before the
  compacted revision is refused so at once. A broken watch (`break_watch`) raises
  `WatchBroken` at its next read. An outage does not end a watch: no change commits.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from simulation.core.scheduler import Scheduler

# An append sent within this long of an outage's start may have reached etcd's leader
# before it lost its quorum: committed, unanswered.
UNKNOWN_APPEND_WINDOW_MS = 20
# Revisions' changes (watch responses) a watch holds for a reader that does not read
# before it falls behind. etcd's is 128 (`chanBufLen`), plus what gRPC's flow control
# lets through, against thousands of appends a second; a group here appends a few
# dozen a second (time is compressed, as `SimConfig.snapshot_entries` is), so a
# pause of a few hundred ms does here what a GC pause of a second does there.
WATCH_BUFFER_RESPONSES = 16


class LogCompacted(LookupError):
    """The records asked for were truncated; take a snapshot from a peer."""


class EtcdUnavailable(ConnectionError):
    """etcd has no quorum: the call is not answered (`CoordinationUnavailable`)."""


class WatchCompacted(LookupError):
    """The history a watch needs is compacted away (`RevisionCompacted`)."""

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"etcd history compacted below revision {compacted_revision}")
        self.compacted_revision = compacted_revision


class WatchBroken(ConnectionError):
    """The watch's stream ended (`CoordinationUnavailable`: etcd ended the watch stream)."""


@dataclass(frozen=True, slots=True)
class RecordChange:
    """One change to a group's record keys, as a watch delivers it."""

    revision: int
    kind: str  # "put" (an append) or "delete" (a truncation)
    first_position: int
    data: bytes  # the record, for a put


@dataclass(slots=True)
class SimWatch:
    group: str
    next_revision: int  # the first revision not yet handed to the watch's buffer
    buffered: deque[RecordChange] = field(default_factory=deque)
    responses: int = 0  # the revisions buffered
    synced: bool = True
    broken: bool = False
    closed: bool = False

    def buffer(self, change: RecordChange) -> bool:
        """Hold `change` for the reader; False when the buffer is full."""
        buffered = self.buffered
        if not buffered or buffered[-1].revision != change.revision:
            if self.responses >= WATCH_BUFFER_RESPONSES:
                return False
            self.responses += 1
        buffered.append(change)
        self.next_revision = change.revision + 1
        return True


@dataclass(slots=True)
class Lease:
    lease_id: int
    ttl_ms: int
    expires_ms: int


@dataclass(frozen=True, slots=True)
class LeaderKey:
    holder: str
    lease_id: int
    create_revision: int


@dataclass(frozen=True, slots=True)
class StoredRecord:
    first_position: int
    last_position: int
    fence: int
    data: bytes


class SimEtcd:
    def __init__(self, scheduler: Scheduler, rng: random.Random | None = None) -> None:
        self.scheduler = scheduler
        self.rng = rng or random.Random(0)
        self.revision = 1
        self._next_lease = 1
        self.leases: dict[int, Lease] = {}
        self.leaders: dict[str, LeaderKey] = {}
        self.logs: dict[str, list[StoredRecord]] = {}
        self.fences_seen: dict[str, list[int]] = {}  # group -> fences of its terms, in order
        self.truncated_through: dict[str, int] = {}
        self.appends = 0
        self.fenced_appends = 0
        self.down_since_ms = 0
        self.down_until_ms = 0
        self._leases_promoted = True
        self._committed_in_outage: set[str] = set()  # groups with an unanswered commit
        self.refusals = 0
        self.unanswered_commits = 0
        self.own_appends_found = 0
        self.history: dict[str, list[RecordChange]] = {}  # group -> its changes, in order
        self.compacted_revision = 0
        self.watches: dict[str, list[SimWatch]] = {}
        self.compactions = 0
        self.watches_created = 0
        self.watches_compacted = 0
        self.watches_fell_behind = 0

    # --- availability ------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self.scheduler.now_ms >= self.down_until_ms

    def go_down(self, until_ms: int) -> None:
        """Quorum lost until `until_ms`."""
        now = self.scheduler.now_ms
        if self.available:
            self.down_since_ms = now
            self._committed_in_outage = set()
        self.down_until_ms = max(self.down_until_ms, until_ms)
        self._leases_promoted = False

    def come_back(self) -> None:
        """Quorum again now (the end of the faulty phase)."""
        self.down_until_ms = min(self.down_until_ms, self.scheduler.now_ms)

    def _answer(self) -> None:
        """Every call: refused while etcd has no quorum."""
        if not self.available:
            self.refusals += 1
            raise EtcdUnavailable("etcd: no quorum")

    # --- leases ------------------------------------------------------------------------

    def grant(self, ttl_ms: int) -> int:
        self._answer()
        self._expire()
        lease_id = self._next_lease
        self._next_lease += 1
        self.leases[lease_id] = Lease(lease_id, ttl_ms, self.scheduler.now_ms + ttl_ms)
        return lease_id

    def keep_alive(self, lease_id: int) -> bool:
        self._answer()
        self._expire()
        lease = self.leases.get(lease_id)
        if lease is None:
            return False
        lease.expires_ms = self.scheduler.now_ms + lease.ttl_ms
        return True

    def revoke(self, lease_id: int) -> None:
        self.leases.pop(lease_id, None)
        self._drop_keys_of({lease_id})

    def _expire(self) -> None:
        now = self.scheduler.now_ms
        if not self.available:
            return  # no etcd leader: the lease clock stands still
        if not self._leases_promoted:
            self._leases_promoted = True
            for lease in self.leases.values():
                lease.expires_ms = max(lease.expires_ms, self.down_until_ms + lease.ttl_ms)
        expired = {lease_id for lease_id, lease in self.leases.items() if lease.expires_ms <= now}
        for lease_id in sorted(expired):
            del self.leases[lease_id]
        if expired:
            self._drop_keys_of(expired)

    def _drop_keys_of(self, lease_ids: set[int]) -> None:
        for group in sorted(self.leaders):
            if self.leaders[group].lease_id in lease_ids:
                del self.leaders[group]
                self.revision += 1

    # --- leadership --------------------------------------------------------------------

    def leader(self, group: str) -> LeaderKey | None:
        self._answer()
        return self.holder(group)

    def holder(self, group: str) -> LeaderKey | None:
        """The leader key as it stands, read without a call: what the world's checks see,
        and what processes that found the leader earlier still reach."""
        self._expire()
        return self.leaders.get(group)

    def campaign(self, group: str, holder: str, lease_id: int) -> int | None:
        """The fence of a new term if `holder` now leads `group`; None if another does."""
        self._answer()
        self._expire()
        if group in self.leaders or lease_id not in self.leases:
            return None
        self.revision += 1
        self.leaders[group] = LeaderKey(holder, lease_id, self.revision)
        self.fences_seen.setdefault(group, []).append(self.revision)
        return self.revision

    # --- the log -----------------------------------------------------------------------

    def log_end(self, group: str) -> int:
        records = self.logs.get(group)
        return records[-1].last_position if records else self.truncated_through.get(group, 0)

    def append(self, group: str, fence: int, first: int, last: int, data: bytes) -> bool:
        if not self.available:
            self._maybe_commit_unanswered(group, fence, first, last, data)
        self._answer()
        self._expire()
        records = self.logs.get(group, [])
        if records and records[-1].first_position == first and records[-1].data == data:
            self.own_appends_found += 1  # an earlier attempt of this append committed
            return True
        key = self.leaders.get(group)
        if key is None or key.create_revision != fence or first != self.log_end(group) + 1:
            self.fenced_appends += 1
            return False
        self._append_record(group, StoredRecord(first, last, fence, data))
        return True

    def _maybe_commit_unanswered(
        self, group: str, fence: int, first: int, last: int, data: bytes
    ) -> None:
        now = self.scheduler.now_ms
        if now - self.down_since_ms >= UNKNOWN_APPEND_WINDOW_MS:
            return
        if group in self._committed_in_outage or self.rng.randrange(2):
            return
        key = self.leaders.get(group)
        if key is None or key.create_revision != fence or first != self.log_end(group) + 1:
            return
        self._committed_in_outage.add(group)
        self.unanswered_commits += 1
        self._append_record(group, StoredRecord(first, last, fence, data))

    def _append_record(self, group: str, record: StoredRecord) -> None:
        self.revision += 1
        self.appends += 1
        self.logs.setdefault(group, []).append(record)
        self._changed(group, RecordChange(self.revision, "put", record.first_position, record.data))

    def read(self, group: str, from_position: int, limit: int) -> list[StoredRecord]:
        self._answer()
        records = self.logs.get(group, [])
        if from_position <= self.truncated_through.get(group, 0):
            raise LogCompacted(f"{group}: records before {from_position + 1} are gone")
        # Records are contiguous: find the one holding from_position by bisection.
        low, high = 0, len(records)
        while low < high:
            middle = (low + high) // 2
            if records[middle].last_position < from_position:
                low = middle + 1
            else:
                high = middle
        return records[low : low + limit]

    def truncate_before(self, group: str, position: int) -> int:
        """Delete every record wholly before `position`; how many went."""
        self._answer()
        records = self.logs.get(group, [])
        keep = 0
        while keep < len(records) and records[keep].last_position < position:
            keep += 1
        if keep:
            self.truncated_through[group] = records[keep - 1].last_position
            self.revision += 1
            for record in records[:keep]:
                self._changed(
                    group, RecordChange(self.revision, "delete", record.first_position, b"")
                )
            del records[:keep]
        return keep

    # --- watches and compaction ----------------------------------------------------------

    def _changed(self, group: str, change: RecordChange) -> None:
        self.history.setdefault(group, []).append(change)
        for watch in self.watches.get(group, ()):
            if not watch.synced:
                continue
            if not watch.buffer(change):
                watch.synced = False  # its reader is behind: caught up from the history
                self.watches_fell_behind += 1

    def watch(self, group: str, from_revision: int) -> SimWatch:
        """The changes to `group`'s records from `from_revision` on."""
        self._answer()
        if from_revision < self.compacted_revision:
            self.watches_compacted += 1
            raise WatchCompacted(self.compacted_revision)
        watch = SimWatch(group, from_revision, synced=False)
        self._catch_up(watch)
        self.watches.setdefault(group, []).append(watch)
        self.watches_created += 1
        return watch

    def changes(self, watch: SimWatch) -> list[RecordChange]:
        """What the watch delivered since its last read (its reader's next turn)."""
        if watch.broken:
            self.close(watch)
            raise WatchBroken(f"{watch.group}: etcd ended the watch stream")
        if not watch.synced:
            if watch.next_revision < self.compacted_revision:
                self.close(watch)
                self.watches_compacted += 1
                raise WatchCompacted(self.compacted_revision)
            self._catch_up(watch)
        delivered = list(watch.buffered)
        watch.buffered.clear()
        watch.responses = 0
        return delivered

    def _catch_up(self, watch: SimWatch) -> None:
        history = self.history.get(watch.group, [])
        low, high = 0, len(history)
        while low < high:  # the first change at or after the watch's next revision
            middle = (low + high) // 2
            if history[middle].revision < watch.next_revision:
                low = middle + 1
            else:
                high = middle
        for change in history[low:]:
            if not watch.buffer(change):
                return  # still behind: the rest at its next read
        watch.synced = True

    def break_watch(self, watch: SimWatch) -> None:
        watch.broken = True

    def close(self, watch: SimWatch) -> None:
        """The watch cancelled (its reader stopped, or it ended)."""
        if not watch.closed:
            watch.closed = True
            self.watches[watch.group].remove(watch)

    def compact(self, revision: int) -> None:
        """Drop the history before `revision` (every group's); raises `WatchCompacted`
        when it is already compacted that far (the host ignores it)."""
        self._answer()
        if revision <= self.compacted_revision:
            raise WatchCompacted(self.compacted_revision)
        self.compacted_revision = revision
        self.compactions += 1
        for _group, history in self.history.items():
            keep = 0
            while keep < len(history) and history[keep].revision < revision:
                keep += 1
            del history[:keep]
