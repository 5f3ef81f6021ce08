"""Rule 14: the snapshot holds everything; restore reproduces the state hash exactly."""

from __future__ import annotations

import pickle

import pytest

from services.runtime.core.state_machine import ApplyContext
from services.shard.core.codec import decode_command_batch, encode_command_batch
from services.shard.core.commands import Command, Persisted
from services.shard.core.digest import actor_digest
from services.shard.core.errors import SnapshotFormatError
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.vocabulary import EventKind
from tests.shard.support import TTL_MS, ShardDriver, settings


def _busy_driver() -> ShardDriver:
    """A shard with something in every structure a snapshot must carry."""
    driver = ShardDriver(settings(dedup_filter_bits=1 << 12))
    driver.resident(1, USDT=10**6, BTC=10**5)
    driver.resident(2, USDT=10**6)
    driver.resident(3, USDT=5)
    resting = driver.accepted_order(1, "rest", quantity_lots=3)
    driver.run(driver.events("g1", driver.fill(resting, 1, price_ticks=100, quantity_lots=1)))
    driver.run(driver.place(1, "pending"))
    driver.run(driver.cancel(1, order_id=resting))
    driver.run(driver.deposit(2, "USDT", 5, "t1"), driver.marks(BTC_USDT=101))
    driver.run(driver.place(9, "parked"))  # hydration pending
    driver.run(driver.reconcile(1, "g2", 50, []))  # deferred
    driver.tick(TTL_MS)  # users 2 and 3 start dehydrating
    driver.run(driver.place(2, "cancel-the-eviction"))
    # A DB dedup wait: fill user 1's view of the filters so its next id is "possibly seen".
    for bits in driver.machine.state.dedup.filters:
        bits[:] = b"\xff" * len(bits)
    driver.run(driver.place(1, "needs-db"))
    return driver


def test_restore_reproduces_the_state_hash_and_the_snapshot_bytes() -> None:
    driver = _busy_driver()
    stats = driver.machine.statistics()
    assert stats.hydrating_users == 1 and stats.dedup_waiting_users == 1
    assert stats.dehydrating_users == 1 and stats.deferred_reconciles == 1
    data = driver.machine.snapshot()
    replica = ShardMachine(driver.settings)
    replica.restore(data)
    assert replica.state_hash() == driver.machine.state_hash()
    assert replica.snapshot() == data
    assert replica.statistics() == driver.machine.statistics()
    assert replica.in_flight_egress() == driver.machine.in_flight_egress()


def test_restored_replica_decides_exactly_like_the_original() -> None:
    driver = _busy_driver()
    replica = ShardMachine(driver.settings)
    replica.restore(driver.machine.snapshot())
    script: list[Command] = [
        driver.dedup_answer(1, "needs-db", None),
        driver.hydrate(9, balances={"USDT": 10**6}),
        driver.events("g1", driver.event("g1", EventKind.ACCEPTED, "s1:1:2", 1)),
        driver.place(2, "x"),
    ]
    now = driver.now + 5
    assert driver.machine.apply_commands(script, now) == replica.apply_commands(script, now)
    driver.machine.check_invariants()
    replica.check_invariants()
    assert driver.machine.state_hash() == replica.state_hash()
    context = ApplyContext(99, now + TTL_MS)
    assert driver.machine.on_timer(context) == replica.on_timer(context)
    driver.machine.check_invariants()
    replica.check_invariants()
    assert driver.machine.state_hash() == replica.state_hash()


def test_the_incremental_hash_equals_a_hash_from_scratch() -> None:
    driver = _busy_driver()
    incremental = driver.machine.state_hash()
    fresh = ShardMachine(driver.settings)
    fresh.restore(driver.machine.snapshot())  # every actor re-digested
    assert fresh.state_hash() == incremental
    total = sum(actor_digest(actor) for actor in driver.machine.state.actors.values())
    assert driver.machine.state.digest_sum == total % (1 << 64)


def test_the_hash_moves_with_the_recency_order() -> None:
    first, second = ShardDriver(), ShardDriver()
    for driver, order in ((first, (1, 2)), (second, (2, 1))):
        for user_id in order:
            driver.resident(user_id, USDT=1)
    assert first.machine.state_hash() != second.machine.state_hash()


def test_snapshots_refuse_other_settings_and_garbage() -> None:
    driver = _busy_driver()
    data = driver.machine.snapshot()
    with pytest.raises(SnapshotFormatError):
        ShardMachine(settings(idle_ttl_ms=1)).restore(data)
    with pytest.raises(SnapshotFormatError):
        ShardMachine(driver.settings).restore(b"not a snapshot")
    with pytest.raises(SnapshotFormatError):
        ShardMachine(driver.settings).restore(pickle.dumps(ShardMachine))  # a global: refused


def test_the_persisters_cursor_only_moves_on_and_travels_in_the_snapshot_and_hash() -> None:
    """`Persisted`: the egress floor every replica keeps a snapshot for (snapshot_policy)."""
    driver = ShardDriver(settings())
    assert driver.machine.egress_floor is None  # no report yet: nothing is held back
    before = driver.machine.state_hash()
    assert driver.run(Persisted(0, 120)) == []  # no answer: a mesh command
    assert driver.machine.egress_floor == 120
    assert driver.machine.statistics().persisted_through == 120
    assert driver.machine.state_hash() != before
    at_120 = driver.machine.state_hash()
    driver.run(Persisted(0, 90))  # a report re-sent late
    assert driver.machine.egress_floor == 120 and driver.machine.state_hash() == at_120
    decoded = decode_command_batch(encode_command_batch([Persisted(7, 130)]))
    assert decoded == [Persisted(7, 130)]
    replica = ShardMachine(driver.settings)
    replica.restore(driver.machine.snapshot())
    assert replica.egress_floor == 120 and replica.state_hash() == at_120


def test_a_version_4_snapshot_restores_with_no_cursor() -> None:
    """Snapshots written before the cursor was logged still load (its floor: 0)."""
    driver = _busy_driver()
    current = pickle.loads(driver.machine.snapshot())
    assert current[0] == 7
    version_4 = pickle.dumps((4, *current[1:21]), protocol=5)
    replica = ShardMachine(driver.settings)
    replica.restore(version_4)
    assert replica.egress_floor is None  # as before the persister's first report
    assert replica.statistics() == driver.machine.statistics()


def test_a_version_5_snapshot_restores_its_actors_at_control_version_0() -> None:
    """Actors written before controls had versions load with none decided yet."""
    driver = _busy_driver()
    current = pickle.loads(driver.machine.snapshot())
    actors = current[6]
    assert actors and all(len(actor) == 26 for actor in actors)
    version_5 = pickle.dumps(
        (5, *current[1:6], [a[:24] for a in actors], *current[7:22]), protocol=5
    )
    replica = ShardMachine(driver.settings)
    replica.restore(version_5)
    for actor in replica.state.actors.values():
        assert (actor.control_version, actor.last_control_id) == (0, "")
    assert replica.statistics() == driver.machine.statistics()


def test_a_version_6_snapshot_restores_at_state_machine_version_1() -> None:
    driver = _busy_driver()
    current = pickle.loads(driver.machine.snapshot())
    assert current[22] == 1
    replica = ShardMachine(driver.settings)
    replica.restore(pickle.dumps((6, *current[1:22]), protocol=5))
    assert replica.version == 1 and replica.state_hash() == driver.machine.state_hash()


def test_the_state_machine_version_is_in_the_snapshot_and_the_hash() -> None:
    driver = _busy_driver()
    at_1 = driver.machine.state_hash()
    driver.machine.activate_version(2)
    assert driver.machine.state_hash() != at_1
    replica = ShardMachine(driver.settings)
    replica.restore(driver.machine.snapshot())
    assert replica.version == 2 and replica.state_hash() == driver.machine.state_hash()


def _left_flat(version: int) -> ShardDriver:
    """User 1 placed an order, the matcher cancelled it, the user was evicted flat."""
    driver = ShardDriver()
    driver.machine.activate_version(version)
    driver.resident(1, USDT=100)
    order_id = driver.accepted_order(1, "a", price_ticks=10)
    cancelled = driver.event("g1", EventKind.CANCELLED, order_id, 1, remaining_lots=1)
    driver.run(driver.events("g1", cancelled))
    driver.evict(1)
    return driver


def test_tombstone_sequences_travel_in_a_layout_8_snapshot_from_version_2_only() -> None:
    """At version 1 a snapshot keeps layout 7, which the release before reads (a group at
    version 1 can be rolled replica by replica); from version 2 the tombstones' event
    sequences are in layout 8 and in the state hash."""
    at_1 = _left_flat(1)
    assert 1 in at_1.machine.state.tombstones and at_1.machine.state.tombstone_events == {}
    payload = pickle.loads(at_1.machine.snapshot())
    assert payload[0] == 7 and len(payload) == 23

    at_2 = _left_flat(2)
    kept = (("g1", at_2.sequences["g1"]),)
    assert at_2.machine.state.tombstone_events == {1: kept}
    payload = pickle.loads(at_2.machine.snapshot())
    assert payload[0] == 8 and payload[23] == ((1, kept),)
    replica = at_2.replica()
    assert replica.state.tombstone_events == at_2.machine.state.tombstone_events
    assert replica.state_hash() == at_2.machine.state_hash()
    assert replica.snapshot() == at_2.machine.snapshot()
    # The hash covers them: the same state with another sequence kept hashes apart.
    replica.state.remember_tombstone(
        1, at_2.machine.state.tombstones[1], (("g1", at_2.sequences["g1"] + 1),)
    )
    assert replica.state_hash() != at_2.machine.state_hash()
