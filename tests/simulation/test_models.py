"""The simulated etcd, PostgreSQL and disk keep the rules the real ones keep."""

from __future__ import annotations

import random

from simulation.core.etcd_model import (
    WATCH_BUFFER_RESPONSES,
    EtcdUnavailable,
    LogCompacted,
    SimEtcd,
    WatchBroken,
    WatchCompacted,
)
from simulation.core.faults import NO_FAULTS, STORE_UNKNOWN, FaultLog, FaultPlan
from simulation.core.replica_disk import ReplicaDisk
from simulation.core.scheduler import Scheduler
from simulation.core.store_model import COMMITTED, UNKNOWN, SimPostgres, Transaction


def test_an_append_is_fenced_by_the_leader_key_and_the_log_end() -> None:
    scheduler = Scheduler()
    etcd = SimEtcd(scheduler)
    old_lease = etcd.grant(1_000)
    old_fence = etcd.campaign("s1", "a", old_lease)
    assert old_fence is not None
    assert etcd.campaign("s1", "b", etcd.grant(1_000)) is None  # one leader at a time
    assert etcd.append("s1", old_fence, 1, 2, b"r1")
    assert not etcd.append("s1", old_fence, 2, 2, b"gap")  # must start at the log's end
    scheduler.at(1_500, "later", lambda: None)
    scheduler.step()  # the old leader's lease expired: its key went with it
    new_lease = etcd.grant(1_000)
    new_fence = etcd.campaign("s1", "b", new_lease)
    assert new_fence is not None and new_fence > old_fence
    assert not etcd.append("s1", old_fence, 3, 3, b"zombie")  # the old term is fenced
    assert etcd.append("s1", new_fence, 3, 3, b"r2")
    assert [r.data for r in etcd.read("s1", 1, 10)] == [b"r1", b"r2"]
    assert etcd.truncate_before("s1", 3) == 1
    try:
        etcd.read("s1", 1, 10)
    except LogCompacted:
        pass
    else:
        raise AssertionError("a truncated record was read")


def test_an_unknown_commit_is_written_or_not_and_the_cursor_tells() -> None:
    scheduler = Scheduler()
    plan = FaultPlan(store_unknown_ppm=1_000_000).only(frozenset({STORE_UNKNOWN}))
    outcomes = set()
    for seed in range(20):
        store = SimPostgres(scheduler, random.Random(seed), plan, FaultLog())
        outcome, answers = store.commit(Transaction("s1", 7))
        assert (outcome, answers) == (UNKNOWN, [])
        outcomes.add(store.cursor("s1"))
    assert outcomes == {0, 7}  # both happen; only reading the cursor back tells which
    store = SimPostgres(scheduler, random.Random(1), NO_FAULTS, FaultLog())
    assert store.commit(Transaction("s1", 9))[0] == COMMITTED
    assert store.cursor("s1") == 9


def test_a_crash_loses_or_tears_unsynced_snapshots_and_checksums_catch_damage() -> None:
    rng = random.Random(3)
    disk = ReplicaDisk()
    synced = disk.write(10, 100, b"state at 10" * 20)
    disk.sync(synced, None)
    disk.write(20, 200, b"state at 20" * 20)  # not synced yet
    disk.crash(rng)
    newest = disk.newest_valid()
    assert newest is not None and newest.position == 10  # lost or torn, never half-read
    only = ReplicaDisk()
    only.sync(only.write(30, 300, b"state at 30" * 20), None)
    assert only.corrupt(rng) is not None  # one bit of it flipped
    assert only.newest_valid() is None  # the checksum refuses it
    assert only.newest_valid(check=False) is not None  # what a planted defect would read


def test_a_disk_keeps_the_snapshot_at_or_before_the_egress_floor_and_the_log_after_it() -> None:
    """As `snapshot_files.py`: the newest two, and the newest at or before the floor."""
    disk = ReplicaDisk()
    for position in (100, 200, 300, 400):
        disk.sync(disk.write(position, position, b"state"), 250)
    assert disk.positions() == [200, 300, 400]
    assert disk.log_needed_after(250) == 200
    assert disk.log_needed_after(None) == 200  # what is kept still needs its log
    assert disk.log_needed_after(50) == 0  # before every snapshot: the whole log
    disk.sync(disk.write(500, 500, b"state"), None)  # nobody needs the floor: newest two
    assert disk.positions() == [400, 500]


def test_an_etcd_outage_refuses_every_call_and_stops_the_lease_clock() -> None:
    """Quorum lost: every call refused, no lease expires meanwhile, and the first call
    after it finds every lease extended to a TTL past the outage (etcd's promotion)."""
    scheduler = Scheduler()
    etcd = SimEtcd(scheduler, random.Random(1))
    lease = etcd.grant(1_000)
    fence = etcd.campaign("s1", "a", lease)
    assert fence is not None and etcd.append("s1", fence, 1, 1, b"r1")
    etcd.go_down(3_000)
    scheduler.at(2_500, "in the outage", lambda: None)
    scheduler.step()
    for call in (
        lambda: etcd.keep_alive(lease),
        lambda: etcd.read("s1", 1, 10),
        lambda: etcd.campaign("s1", "b", lease),
        lambda: etcd.append("s1", fence, 2, 2, b"r2"),
    ):
        try:
            call()
        except EtcdUnavailable:
            continue
        raise AssertionError("a call was answered without a quorum")
    assert etcd.holder("s1") is not None  # past its TTL, but nothing expires in an outage
    scheduler.at(3_900, "after it", lambda: None)
    scheduler.step()
    assert etcd.holder("s1") is not None  # promoted: a TTL from the outage's end
    scheduler.at(4_001, "a TTL after it", lambda: None)
    scheduler.step()
    assert etcd.holder("s1") is None


def test_an_append_in_an_outages_first_moments_may_commit_unanswered() -> None:
    """The caller hears nothing either way; its retry of the same record then finds
    its own record (the real append's key-absent guard, read back) and takes it."""
    committed = 0
    for seed in range(20):
        scheduler = Scheduler()
        etcd = SimEtcd(scheduler, random.Random(seed))
        fence = etcd.campaign("s1", "a", etcd.grant(1_000))
        assert fence is not None
        etcd.go_down(500)
        try:
            etcd.append("s1", fence, 1, 1, b"r1")
        except EtcdUnavailable:
            pass
        else:
            raise AssertionError("answered without a quorum")
        committed += etcd.log_end("s1")
        scheduler.at(600, "back", lambda: None)
        scheduler.step()
        assert etcd.append("s1", fence, 1, 1, b"r1")  # the retry: appended either way
        assert [r.data for r in etcd.read("s1", 1, 10)] == [b"r1"]  # once
    assert 0 < committed < 20  # both happen


def _leading(etcd: SimEtcd) -> int:
    fence = etcd.campaign("s1", "a", etcd.grant(1_000))
    assert fence is not None
    return fence


def test_a_watch_delivers_appends_and_truncations_in_revision_order() -> None:
    """From a past revision too: what the history holds, then what commits."""
    etcd = SimEtcd(Scheduler())
    fence = _leading(etcd)
    assert etcd.append("s1", fence, 1, 2, b"r1")
    since = etcd.revision + 1
    assert etcd.append("s1", fence, 3, 3, b"r2")
    watch = etcd.watch("s1", since)
    assert etcd.append("s1", fence, 4, 5, b"r3")
    assert etcd.truncate_before("s1", 4) == 2  # one revision, a delete per record
    changes = etcd.changes(watch)
    assert [(c.kind, c.first_position, c.data) for c in changes] == [
        ("put", 3, b"r2"),
        ("put", 4, b"r3"),
        ("delete", 1, b""),
        ("delete", 3, b""),
    ]
    assert changes[2].revision == changes[3].revision == etcd.revision
    assert etcd.changes(watch) == []
    etcd.break_watch(watch)
    try:
        etcd.changes(watch)
    except WatchBroken:
        pass
    else:
        raise AssertionError("a broken watch went on")


def test_a_compaction_ends_the_watches_behind_it_and_spares_those_that_keep_up() -> None:
    etcd = SimEtcd(Scheduler())
    fence = _leading(etcd)
    reader = etcd.watch("s1", etcd.revision + 1)
    sleeper = etcd.watch("s1", etcd.revision + 1)
    first = etcd.revision + 1
    for position in range(1, WATCH_BUFFER_RESPONSES + 3):  # more than a buffer holds
        assert etcd.append("s1", fence, position, position, b"r%d" % position)
        assert [c.first_position for c in etcd.changes(reader)] == [position]
    etcd.compact(etcd.revision)
    # The reader kept up (every change was sent as it committed): it goes on.
    assert etcd.append("s1", fence, WATCH_BUFFER_RESPONSES + 3, WATCH_BUFFER_RESPONSES + 3, b"x")
    assert len(etcd.changes(reader)) == 1
    # The sleeper let its buffer fill, fell behind, and the compaction passed it.
    for watch_from in (sleeper, None):
        try:
            if watch_from is None:
                etcd.watch("s1", first)  # and a watch asked from before it is refused
            else:
                etcd.changes(watch_from)
        except WatchCompacted as error:
            assert error.compacted_revision == etcd.compacted_revision
        else:
            raise AssertionError("history before the compaction was delivered")
    try:
        etcd.compact(etcd.compacted_revision)
    except WatchCompacted:
        pass
    else:
        raise AssertionError("compacted twice at one revision")


def test_a_watch_behind_but_not_compacted_is_caught_up_from_the_history() -> None:
    etcd = SimEtcd(Scheduler())
    fence = _leading(etcd)
    watch = etcd.watch("s1", etcd.revision + 1)
    last = 3 * WATCH_BUFFER_RESPONSES
    for position in range(1, last + 1):
        assert etcd.append("s1", fence, position, position, b"r")
    delivered: list[int] = []
    while len(delivered) < last:
        batch = etcd.changes(watch)
        assert 0 < len(batch) <= WATCH_BUFFER_RESPONSES
        delivered += [c.first_position for c in batch]
    assert delivered == list(range(1, last + 1))
    assert etcd.watches_fell_behind == 1
