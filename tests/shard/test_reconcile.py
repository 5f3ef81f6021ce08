"""Rule 13: the reconciler's report applies once its matcher sequence has, and heals."""

from __future__ import annotations

from services.shard.core.commands import ReconciledOrder
from services.shard.core.egress import OrderUpdate, RiskAlert
from services.shard.core.vocabulary import BUY, EventKind, OrderStatus
from tests.shard.support import ShardDriver, of_type, only, results, settings


def _open(order_id: str, remaining: int = 1) -> ReconciledOrder:
    return ReconciledOrder(order_id, "BTC-USDT", BUY, OrderStatus.OPEN, remaining)


def _counter(driver: ShardDriver, name: str) -> int:
    return driver.machine.statistics().counter(name)


def test_a_report_ahead_of_the_applied_sequence_waits_for_it() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100_000)
    order_id = driver.accepted_order(1, "a")  # g1 at sequence 1
    out = driver.run(driver.reconcile(1, "g1", 2, []))
    assert out == [] and _counter(driver, "reconciles_deferred") == 1
    assert driver.machine.statistics().deferred_reconciles == 1
    # The matcher had cancelled it at sequence 2; the event arrives, then the report applies.
    cancelled = driver.event("g1", EventKind.CANCELLED, order_id, 1, remaining_lots=1)
    out = driver.run(driver.events("g1", cancelled))
    assert only(out, OrderUpdate).status == OrderStatus.CANCELLED
    assert _counter(driver, "reconciles_applied") == 1
    assert _counter(driver, "reconcile_phantoms_closed") == 0  # nothing left to heal


def test_phantoms_are_closed_and_their_reservations_released() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100_000)
    kept = driver.accepted_order(1, "kept")
    lost = driver.accepted_order(1, "lost", price_ticks=50, quantity_lots=2)
    other_group = driver.accepted_order(1, "eth", symbol="ETH-USDT")
    # The matcher expired "lost" and the event never arrived (the stream moved on).
    driver.sequences["g1"] += 1
    out = driver.run(driver.reconcile(1, "g1", driver.sequences["g1"] - 1, [_open(kept)]))
    update = only(out, OrderUpdate)
    assert (update.order_id, update.status) == (lost, OrderStatus.CANCELLED)
    actor = driver.machine.actor(1)
    assert actor is not None and set(actor.orders) == {kept, other_group}
    assert _counter(driver, "reconcile_phantoms_closed") == 1
    assert _counter(driver, "reconcile_reservations_released") == 1


def test_pending_orders_are_not_phantoms_but_a_listed_one_heals_its_lost_accept() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100_000)
    pending = results(driver.run(driver.place(1, "p")))[0].order_id
    in_flight = results(driver.run(driver.place(1, "q")))[0].order_id
    out = driver.run(driver.reconcile(1, "g1", 0, [_open(pending)]))
    assert only(out, OrderUpdate).status == OrderStatus.OPEN
    actor = driver.machine.actor(1)
    assert actor is not None and actor.orders[in_flight].status == OrderStatus.PENDING
    assert _counter(driver, "reconcile_acceptances_healed") == 1
    assert driver.machine.statistics().in_flight_submits == 1


def test_impossible_states_are_flagged_not_guessed() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100_000)
    known = driver.accepted_order(1, "k", quantity_lots=3)
    report = [_open("s1:1:99"), _open(known, remaining=1)]
    out = driver.run(driver.reconcile(1, "g1", 1, report))
    alerts = of_type(out, RiskAlert)
    assert [alert.kind for alert in alerts] == ["reconcile_impossible"] * 2
    assert _counter(driver, "reconcile_impossible_states") == 2
    actor = driver.machine.actor(1)
    assert actor is not None and actor.orders[known].remaining_lots == 3  # untouched


def test_a_report_for_a_non_resident_user_flags_what_the_matcher_still_holds() -> None:
    driver = ShardDriver()
    out = driver.run(driver.reconcile(9, "g1", 0, [_open("s1:9:1")]))
    assert only(out, RiskAlert).kind == "reconcile_impossible"
    assert driver.machine.statistics().hydrating_users == 0


def test_deferred_reports_are_bounded() -> None:
    driver = ShardDriver(settings(max_deferred_reconciles=2))
    for user_id in range(3):
        driver.run(driver.reconcile(user_id, "g1", 10, []))
    stats = driver.machine.statistics()
    assert stats.deferred_reconciles == 2 and stats.counter("reconciles_dropped") == 1


def test_a_report_older_than_the_users_last_event_is_stale_and_changes_nothing() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100_000)
    first = driver.accepted_order(1, "first")
    as_of = driver.sequences["g1"]  # the matcher's snapshot is taken here, listing `first`
    second = driver.accepted_order(1, "second")  # accepted after the snapshot
    before = driver.machine.state_hash()
    # Judged against today's index, the report would close `second` as a phantom.
    out = driver.run(driver.reconcile(1, "g1", as_of, [_open(first)]))
    assert not of_type(out, OrderUpdate) and not of_type(out, RiskAlert)
    actor = driver.machine.actor(1)
    assert actor is not None and set(actor.orders) == {first, second}
    assert _counter(driver, "reconciles_stale") == 1
    assert _counter(driver, "reconcile_phantoms_closed") == 0
    assert driver.machine.state_hash() == before
    fresh = driver.run(
        driver.reconcile(1, "g1", driver.sequences["g1"], [_open(first), _open(second)])
    )
    assert not of_type(fresh, OrderUpdate) and _counter(driver, "reconciles_applied") == 2


def _left_flat_after_a_snapshot(version: int) -> tuple[ShardDriver, str, int]:
    """User 1's order is listed open by a matcher snapshot; the matcher's cancel (after
    it) arrives, the user goes flat and is let go (evicted here; moved to another group
    by a scale-in in `oms sim` seeds 195 and 508). Returns the order and the snapshot's
    sequence."""
    driver = ShardDriver()
    driver.machine.activate_version(version)
    driver.resident(1, USDT=100_000)
    order_id = driver.accepted_order(1, "a")
    as_of = driver.sequences["g1"]  # the matcher's snapshot lists the order open
    cancelled = driver.event("g1", EventKind.CANCELLED, order_id, 1, remaining_lots=1)
    driver.run(driver.events("g1", cancelled))
    driver.evict(1)
    assert driver.machine.actor(1) is None
    return driver, order_id, as_of


def test_a_late_report_for_a_user_who_left_flat_is_stale_not_impossible() -> None:
    """From version 2 the user's tombstone keeps where its orders stood when it left, so
    a report from before then judges a past, as for a resident user whose orders moved
    after it."""
    driver, order_id, as_of = _left_flat_after_a_snapshot(2)
    before = driver.machine.state_hash()
    out = driver.run(driver.reconcile(1, "g1", as_of, [_open(order_id)]))
    assert not of_type(out, RiskAlert), out
    assert _counter(driver, "reconcile_impossible_states") == 0
    assert _counter(driver, "reconciles_stale") == 1
    assert driver.machine.state_hash() == before
    # A replica restored from a snapshot decides the same (the tombstone's sequences are
    # in it).
    replica = driver.replica()
    assert replica.state_hash() == before
    again = driver.reconcile(1, "g1", as_of, [_open(order_id)])
    assert replica.apply_commands([again], driver.now) == []
    assert replica.statistics().counter("reconciles_stale") == 2


def test_at_version_1_the_late_report_is_still_flagged_as_before() -> None:
    """New code keeps version 1's decision until the group's log switches (README,
    "Upgrades"): the false alert, as the release before raised it."""
    driver, order_id, as_of = _left_flat_after_a_snapshot(1)
    out = driver.run(driver.reconcile(1, "g1", as_of, [_open(order_id)]))
    assert only(out, RiskAlert).kind == "reconcile_impossible"
    assert _counter(driver, "reconciles_stale") == 0


def test_a_report_as_recent_as_the_users_last_event_still_flags_what_it_lists() -> None:
    """The matcher listing an order open at or after the user's last event, for a user
    this shard let go flat, is a real impossible state at version 2 as well."""
    driver, order_id, _ = _left_flat_after_a_snapshot(2)
    out = driver.run(driver.reconcile(1, "g1", driver.sequences["g1"], [_open(order_id)]))
    assert only(out, RiskAlert).kind == "reconcile_impossible"
    # A group the user never traded on has no sequence kept: anything listed there is
    # impossible too.
    out = driver.run(driver.reconcile(1, "g2", 0, [_open("s1:1:77")]))
    assert only(out, RiskAlert).kind == "reconcile_impossible"
    assert _counter(driver, "reconciles_stale") == 0


def test_a_user_hydrated_again_resumes_where_its_orders_stood() -> None:
    """The late report reaches the user once it is back (hydrated for a new order): at
    version 2 the actor resumes its event sequences from the tombstone, so the report
    is stale, not an order "unknown to the shard"."""
    driver, order_id, as_of = _left_flat_after_a_snapshot(2)
    last = driver.sequences["g1"]
    flushed = driver.machine.state.tombstones[1]
    driver.run(driver.hydrate(1, balances={"USDT": 100_000}, db_version=flushed))
    actor = driver.machine.actor(1)
    assert actor is not None and actor.event_sequences == {"g1": last}
    assert 1 not in driver.machine.state.tombstone_events
    out = driver.run(driver.reconcile(1, "g1", as_of, [_open(order_id)]))
    assert not of_type(out, RiskAlert), out
    assert _counter(driver, "reconciles_stale") == 1
