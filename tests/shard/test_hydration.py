"""Rule 8: commands for non-resident users park, one request goes out, state lands in order."""

from __future__ import annotations

from services.shard.core.egress import BeginDehydrate, HydrateRequest, ShardResult
from services.shard.core.user_state import RecentResult
from services.shard.core.vocabulary import RejectReason
from tests.shard.support import (
    TTL_MS,
    ShardDriver,
    hydrate_requests,
    of_type,
    only,
    results,
    settings,
)


def test_commands_park_in_log_order_behind_one_request_then_apply() -> None:
    driver = ShardDriver()
    out = driver.run(driver.deposit(5, "USDT", 10_000, "t1"))
    request = only(out, HydrateRequest)
    assert only(out, ShardResult).parked
    out = driver.run(driver.place(5, "a"), driver.withdraw(5, "USDT", 5_000))
    assert hydrate_requests(out) == []  # single flight
    assert [r.parked for r in results(out)] == [True, True]
    stats = driver.machine.statistics()
    assert (stats.hydrating_users, stats.parked_commands) == (1, 3)
    out = driver.run(driver.hydrate(5, balances={"USDT": 1_000}, epoch=request.epoch))
    final = results(out)
    assert [r.accepted for r in final] == [True, True, True]
    # In log order: the deposit funded the order, the withdrawal took what was left.
    assert driver.balance(5, "USDT") == (11_000 - 5_000, 1_002)
    assert driver.machine.state.accounts.hydrated_in["USDT"] == 1_000
    assert driver.machine.statistics().parked_commands == 0


def test_parking_is_bounded_per_user_and_per_shard_with_retryable_backpressure() -> None:
    driver = ShardDriver(settings(max_parked_per_user=2, max_parked_total=3))
    driver.run(driver.deposit(5, "USDT", 1), driver.deposit(5, "USDT", 2))
    refused = results(driver.run(driver.deposit(5, "USDT", 3)))[0]
    assert refused.reject_reason == RejectReason.BACKPRESSURE and refused.retryable
    driver.run(driver.deposit(6, "USDT", 1))
    refused = results(driver.run(driver.deposit(7, "USDT", 1)))[0]
    assert refused.reject_reason == RejectReason.BACKPRESSURE
    assert driver.machine.statistics().hydrating_users == 2  # user 7 asked for nothing


def test_matcher_events_always_park_even_beyond_the_bound() -> None:
    driver = ShardDriver(settings(max_parked_per_user=1, max_parked_total=1))
    driver.run(driver.deposit(5, "USDT", 1))
    events = [driver.fill(f"s1:5:{n}", 5, price_ticks=1, quantity_lots=1) for n in range(3)]
    driver.run(driver.events("g1", *events))
    assert driver.machine.statistics().counter("matcher_events_parked") == 3


def test_unknown_user_refuses_parked_commands_and_alerts_on_parked_events() -> None:
    driver = ShardDriver()
    out = driver.run(driver.place(5, "a"))
    epoch = only(out, HydrateRequest).epoch
    driver.run(driver.events("g1", driver.fill("s1:5:1", 5, price_ticks=1, quantity_lots=1)))
    out = driver.run(driver.hydrate(5, known=False, epoch=epoch))
    assert [type(item).__name__ for item in out] == ["ShardResult", "RiskAlert"]
    assert [r.reject_reason for r in results(out)] == [RejectReason.UNKNOWN_USER]
    assert out[1].kind == "unknown_user_event"  # type: ignore[union-attr]
    assert driver.machine.statistics().hydrating_users == 0


def test_stale_or_redundant_hydrations_never_overwrite_a_live_actor() -> None:
    driver = ShardDriver()
    out = driver.run(driver.deposit(5, "USDT", 10))
    epoch = only(out, HydrateRequest).epoch
    driver.run(driver.hydrate(5, balances={"USDT": 1}, epoch=epoch + 100))  # not ours
    assert driver.machine.actor(5) is None
    assert driver.machine.statistics().counter("hydrations_stale") == 1
    driver.run(driver.hydrate(5, balances={"USDT": 1}, epoch=epoch))
    driver.run(driver.hydrate(5, balances={"USDT": 999_999}))  # hydrate-ahead, too late
    assert driver.balance(5, "USDT") == (11, 0)
    assert driver.machine.statistics().counter("hydrations_redundant") == 1


def test_a_hydration_older_than_the_last_flush_is_requested_again() -> None:
    driver = ShardDriver()
    driver.resident(5, USDT=10)
    begin = next(b for b in driver.tick(TTL_MS) if isinstance(b, BeginDehydrate))
    driver.run(driver.flush_complete(5, begin.epoch, db_version=4))
    out = driver.run(driver.deposit(5, "USDT", 1))
    first = only(out, HydrateRequest)
    out = driver.run(driver.hydrate(5, balances={"USDT": 3}, db_version=3, epoch=first.epoch))
    again = only(out, HydrateRequest)
    assert again.epoch != first.epoch and driver.machine.actor(5) is None
    driver.run(driver.hydrate(5, balances={"USDT": 10}, db_version=4, epoch=again.epoch))
    assert driver.balance(5, "USDT") == (11, 0)


def test_unanswered_hydrations_are_requested_again_on_the_timer() -> None:
    driver = ShardDriver()
    first = only(driver.run(driver.deposit(5, "USDT", 1)), HydrateRequest)
    assert hydrate_requests(driver.tick(1_000)) == []
    again = hydrate_requests(driver.tick(driver.settings.redrive_after_ms))
    assert again == [first]


def test_hydration_loads_recent_client_ids_into_the_dedup_index() -> None:
    driver = ShardDriver()
    recent = (RecentResult("old-order", "s1:5:9", 0, driver.now - 10),)
    driver.run(driver.hydrate(5, balances={"USDT": 10_000}, user_seq=9, recent=recent))
    out = driver.run(driver.place(5, "old-order"))
    result = only(out, ShardResult)
    assert result.duplicate and result.order_id == "s1:5:9"
    new = results(driver.run(driver.place(5, "new-order")))[0]
    assert new.order_id == "s1:5:10"  # user_seq continues where the stored state left it


def test_matcher_events_of_a_user_keep_their_order_across_hydration() -> None:
    driver = ShardDriver()
    driver.resident(5, USDT=10_000)
    begin = next(b for b in driver.tick(TTL_MS) if isinstance(b, BeginDehydrate))
    driver.run(driver.flush_complete(5, begin.epoch))
    first = driver.fill("s1:5:40", 5, price_ticks=100, quantity_lots=1)
    second = driver.fill("s1:5:40", 5, price_ticks=100, quantity_lots=2)
    out = driver.run(driver.events("g1", first), driver.events("g1", second))
    epoch = only(out, HydrateRequest).epoch
    driver.run(driver.hydrate(5, balances={"USDT": 10_000}, epoch=epoch, db_version=1))
    assert driver.balance(5, "BTC") == (3_000, 0)
    assert of_type(driver.history, HydrateRequest)
    assert driver.machine.state.sequences["g1"] == second.sequence
