"""Rules 6 and 7: LRU + TTL eviction on consensus time, and the dehydration handshake."""

from __future__ import annotations

from collections.abc import Sequence

from services.runtime.core.state_machine import ApplyContext
from services.shard.core.egress import (
    BeginDehydrate,
    Egress,
    HydrateRequest,
    RiskAlert,
    ShardResult,
)
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.user_state import UserState
from services.shard.core.vocabulary import EventKind, OrderStatus
from tests.shard.support import (
    TTL_MS,
    ShardDriver,
    of_type,
    only,
    results,
    settings,
    updates,
)


def _begin(out: Sequence[Egress], user_id: int) -> BeginDehydrate:
    found = [item for item in out if isinstance(item, BeginDehydrate) and item.user_id == user_id]
    assert len(found) == 1, out
    return found[0]


def test_sweep_walks_the_cold_end_only_and_stops_at_the_first_warm_actor() -> None:
    driver = ShardDriver()
    for user_id in range(1, 11):
        driver.resident(user_id, USDT=user_id)
    driver.now += TTL_MS // 2
    for user_id in range(11, 31):
        driver.resident(user_id, USDT=user_id)
    out = driver.tick(TTL_MS // 2)
    assert sorted(b.user_id for b in of_type(out, BeginDehydrate)) == list(range(1, 11))
    sweep = driver.machine.last_sweep
    assert (sweep.visited, sweep.expired, sweep.evicted) == (11, 10, 10)


def test_activity_keeps_a_user_warm() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100)
    driver.resident(2, USDT=100)
    driver.run(driver.deposit(1, "USDT", 1), advance_ms=TTL_MS - 1)
    out = driver.tick(1)
    assert [b.user_id for b in of_type(out, BeginDehydrate)] == [2]
    assert driver.machine.last_sweep.visited == 2


def test_non_flat_expired_users_are_skipped_and_requeued() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10_000)
    driver.resident(2, USDT=10_000)
    order_id = driver.accepted_order(1, "resting")
    out = driver.tick(TTL_MS)
    assert [b.user_id for b in of_type(out, BeginDehydrate)] == [2]
    sweep = driver.machine.last_sweep
    assert (sweep.visited, sweep.expired, sweep.requeued) == (2, 2, 1)
    # User 1 went to the hot end: the next sweep starts with user 2 (dehydrating, skipped).
    driver.run(driver.events("g1", driver.event("g1", EventKind.CANCELLED, order_id, 1)))
    out = driver.tick(TTL_MS)
    assert [b.user_id for b in of_type(out, BeginDehydrate)] == [1]


def test_sweep_is_capped() -> None:
    driver = ShardDriver(settings(max_evictions_per_sweep=3))
    for user_id in range(1, 8):
        driver.resident(user_id)
    out = driver.tick(TTL_MS)
    assert len(of_type(out, BeginDehydrate)) == 3
    assert driver.machine.last_sweep.visited == 3
    out = driver.tick(1)
    assert len(of_type(out, BeginDehydrate)) == 3


def test_valve_evicts_lru_flat_users_before_their_ttl() -> None:
    driver = ShardDriver(settings(max_resident=3))
    driver.resident(1, USDT=1)
    driver.resident(2, USDT=10_000)
    driver.accepted_order(2, "o")
    driver.resident(3, USDT=1)
    out = driver.run(driver.hydrate(4, balances={"USDT": 1}))
    assert [b.user_id for b in of_type(out, BeginDehydrate)] == [1]
    assert driver.machine.statistics().counter("valve_evictions") == 1


def test_flush_complete_removes_the_user_and_accounts_the_value_out() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=700, BTC=3)
    begin = _begin(driver.tick(TTL_MS), 1)
    assert begin.state.balances == (("USDT", 700), ("BTC", 3))
    assert driver.machine.statistics().dehydrating_users == 1
    driver.run(driver.flush_complete(1, begin.epoch, db_version=5))
    assert driver.machine.actor(1) is None
    accounts = driver.machine.state.accounts
    assert accounts.dehydrated_out["USDT"] == 700 and accounts.resident["USDT"] == 0
    assert driver.machine.state.tombstones[1] == 5


def test_order_during_the_flush_window_cancels_the_eviction_and_the_stale_flush_is_dropped() -> (
    None
):
    driver = ShardDriver()
    driver.resident(1, USDT=10_000)
    begin = _begin(driver.tick(TTL_MS), 1)
    out = driver.run(driver.place(1, "late"))
    assert only(out, ShardResult).accepted  # served by the live actor: no parking, no DB
    actor = driver.machine.actor(1)
    assert actor is not None and actor.epoch > begin.epoch
    assert driver.machine.statistics().counter("evictions_cancelled") == 1
    driver.run(driver.flush_complete(1, begin.epoch, db_version=2))
    assert driver.machine.actor(1) is not None
    stats = driver.machine.statistics()
    assert stats.counter("flushes_stale") == 1
    assert actor.db_version == 2  # the stale flush did land: the next CAS expects it


def test_flush_refused_keeps_the_user_with_an_alert() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=5)
    begin = _begin(driver.tick(TTL_MS), 1)
    out = driver.run(driver.flush_refused(1, begin.epoch))
    assert only(out, RiskAlert).kind == "flush_refused"
    actor = driver.machine.actor(1)
    assert actor is not None and actor.lifecycle == 1 and actor.epoch != begin.epoch
    driver.run(driver.flush_complete(1, begin.epoch))
    assert driver.machine.actor(1) is not None  # that epoch is over


def test_fill_for_a_dehydrating_user_cancels_the_eviction_and_settles() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10_000, BTC=5_000)
    begin = _begin(driver.tick(TTL_MS), 1)
    # Orders cannot be open (the user is flat), so this is an orphan fill: it still settles.
    fill = driver.fill("s1:1:77", 1, price_ticks=100, quantity_lots=1)
    out = driver.run(driver.events("g1", fill))
    assert any(isinstance(item, RiskAlert) and item.kind == "orphan_event" for item in out)
    assert driver.balance(1, "USDT") == (10_000 - 1_002, 0)
    driver.run(driver.flush_complete(1, begin.epoch))
    assert driver.machine.actor(1) is not None


def test_fill_for_an_evicted_user_hydrates_on_miss_and_settles_after_hydration() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10_000)
    begin = _begin(driver.tick(TTL_MS), 1)
    driver.run(driver.flush_complete(1, begin.epoch, db_version=3))
    fill = driver.fill("s1:1:77", 1, price_ticks=100, quantity_lots=1)
    out = driver.run(driver.events("g1", fill))
    request = only(out, HydrateRequest)
    assert driver.machine.statistics().counter("matcher_events_parked") == 1
    hydrated = driver.run(
        driver.hydrate(1, balances={"USDT": 10_000}, db_version=3, epoch=request.epoch)
    )
    assert driver.balance(1, "USDT") == (10_000 - 1_002, 0)
    assert driver.balance(1, "BTC") == (1_000, 0)
    assert any(isinstance(item, RiskAlert) for item in hydrated)


def test_crash_mid_flush_restores_the_dehydrating_user_and_the_flush_still_completes() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10)
    driver.resident(2, USDT=20)
    begin = _begin(driver.tick(TTL_MS), 1)
    recovered = ShardMachine(driver.settings)
    recovered.restore(driver.machine.snapshot())
    assert recovered.state_hash() == driver.machine.state_hash()
    driver.machine = recovered  # the process died; this replica continues from the snapshot
    assert recovered.statistics().dehydrating_users == 2
    driver.run(driver.flush_complete(1, begin.epoch))
    assert driver.machine.actor(1) is None and driver.machine.actor(2) is not None


def test_crash_mid_flush_without_the_answer_re_evicts_later() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10)
    begin = _begin(driver.tick(TTL_MS), 1)
    recovered = ShardMachine(driver.settings)
    recovered.restore(driver.machine.snapshot())
    driver.machine = recovered
    driver.run(driver.flush_refused(1, begin.epoch))  # the persister lost the write
    again = _begin(driver.tick(TTL_MS), 1)
    assert again.epoch != begin.epoch
    driver.run(driver.flush_complete(1, again.epoch))
    assert driver.machine.actor(1) is None


def test_sweep_visits_expired_plus_one_whatever_the_resident_count() -> None:
    for resident in (50, 500, 5_000):
        machine = ShardMachine(settings())
        machine.bulk_hydrate((UserState(u) for u in range(1, 21)), 1_000)
        machine.bulk_hydrate((UserState(u) for u in range(21, resident + 1)), 1_000 + TTL_MS // 2)
        machine.on_timer(ApplyContext(1, 1_000 + TTL_MS))
        assert machine.last_sweep.visited == 21
        assert machine.last_sweep.evicted == 20
        machine.check_invariants()


def test_user_never_leaves_while_an_order_rests() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10_000)
    order_id = driver.accepted_order(1, "gtc")
    for _ in range(5):
        assert of_type(driver.tick(TTL_MS), BeginDehydrate) == []
    driver.run(
        driver.events("g1", driver.fill(order_id, 1, price_ticks=100, quantity_lots=1, done=True))
    )
    assert updates(driver.history)[-1].status == OrderStatus.FILLED
    assert [b.user_id for b in of_type(driver.tick(TTL_MS), BeginDehydrate)] == [1]
    assert results(driver.history)
