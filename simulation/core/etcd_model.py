"""etcd as the mesh uses it: leases, a leader key per group, the fenced log, compaction.

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
Reads are polls of the current state: a watch delivers the same records in order
(watch restarts and history compaction are not modelled).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from simulation.core.scheduler import Scheduler

# An append sent within this long of an outage's start may have reached etcd's leader
# before it lost its quorum: committed, unanswered.
UNKNOWN_APPEND_WINDOW_MS = 20


class LogCompacted(LookupError):
    """The records asked for were truncated; take a snapshot from a peer."""


class EtcdUnavailable(ConnectionError):
    """etcd has no quorum: the call is not answered (`CoordinationUnavailable`)."""


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
        self.revision += 1
        self.appends += 1
        self.logs.setdefault(group, []).append(StoredRecord(first, last, fence, data))
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
        self.revision += 1
        self.appends += 1
        self.unanswered_commits += 1
        self.logs.setdefault(group, []).append(StoredRecord(first, last, fence, data))

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
            del records[:keep]
            self.revision += 1
        return keep
