"""`CancelAllOrders`: every live order of a user, or of one symbol, cancelled in one command;
`CancelAllAfter`: the same, done by the shard's timer unless armed again in time.

From state-machine version 3: each live order without a cancel in flight gets its
cancel sent to its matcher group exactly as a single cancel sends it, in the order the
orders were placed; the answer lists them and counts those already being cancelled.
Before version 3 the command is refused MALFORMED and changes nothing, exactly as a
build that does not know it decides.
"""

from __future__ import annotations

from services.shard.core import snapshot as snapshot_module
from services.shard.core.codec import decode_command_batch, encode_command_batch
from services.shard.core.commands import CancelAllAfter, CancelAllOrders, UserControl
from services.shard.core.egress import BeginDehydrate, CancelToMatcher, OrderUpdate, ShardResult
from services.shard.core.vocabulary import (
    SELL,
    EventKind,
    OrderStatus,
    RejectReason,
    UserControlAction,
)
from tests.shard.support import SHARD, TTL_MS, ShardDriver, of_type, only, results


def driver_at(version: int) -> ShardDriver:
    driver = ShardDriver()
    driver.machine.activate_version(version)
    return driver


def cancel_all(driver: ShardDriver, user_id: int, symbol: str = "") -> CancelAllOrders:
    return CancelAllOrders(driver.next_correlation(), user_id, symbol, 0)


def test_every_live_order_gets_its_cancel_in_the_order_placed_and_the_answer_lists_them() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000, BTC=50_000_000)
    btc = driver.accepted_order(7, "a")
    eth = driver.accepted_order(7, "b", symbol="ETH-USDT")
    pending = results(driver.run(driver.place(7, "c", side=SELL, price_ticks=300)))[0].order_id
    driver.resident(8, USDT=100_000)
    others = driver.accepted_order(8, "x")
    out = driver.run(cancel_all(driver, 7))
    assert of_type(out, CancelToMatcher) == [
        CancelToMatcher("g1", btc, 7),
        CancelToMatcher("g2", eth, 7),
        CancelToMatcher("g1", pending, 7),  # not yet accepted by its matcher: cancelled too
    ]
    result = only(out, ShardResult)
    assert result.accepted and not result.reject_reason
    assert result.cancelled_order_ids == (btc, eth, pending)
    assert result.already_cancelling == 0
    assert driver.machine.statistics().in_flight_cancels == 3
    # Another user's order is untouched; nothing is released before Cancelled arrives.
    assert not driver.machine.state.actors[8].orders[others].cancel_in_flight
    assert driver.balance(7, "USDT")[1] > 0
    for order_id, group in ((btc, "g1"), (eth, "g2"), (pending, "g1")):
        driver.run(
            driver.events(
                group,
                driver.event(group, EventKind.CANCELLED, order_id, 7, remaining_lots=1, reason=1),
            )
        )
    assert driver.balance(7, "USDT") == (100_000, 0)
    assert driver.balance(7, "BTC") == (50_000_000, 0)
    assert not driver.machine.state.actors[7].orders
    assert driver.machine.statistics().in_flight_cancels == 0


def test_a_symbol_limits_it_and_a_retry_finds_the_cancels_in_flight() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    first = driver.accepted_order(7, "a")
    eth = driver.accepted_order(7, "b", symbol="ETH-USDT")
    second = driver.accepted_order(7, "c", price_ticks=90)
    single = driver.run(driver.cancel(7, order_id=second))
    assert only(single, CancelToMatcher).order_id == second
    out = driver.run(cancel_all(driver, 7, "BTC-USDT"))
    assert of_type(out, CancelToMatcher) == [CancelToMatcher("g1", first, 7)]
    result = only(out, ShardResult)
    assert result.cancelled_order_ids == (first,) and result.already_cancelling == 1
    assert not driver.machine.state.actors[7].orders[eth].cancel_in_flight
    # Sent again (a retry after a lost answer): nothing sent twice.
    again = driver.run(cancel_all(driver, 7, "BTC-USDT"))
    assert of_type(again, CancelToMatcher) == []
    assert only(again, ShardResult) == ShardResult(
        only(again, ShardResult).correlation_id, True, already_cancelling=2
    )


def test_a_user_with_no_open_order_is_answered_with_none_and_nothing_changes() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    before = driver.machine.state_hash()
    out = driver.run(cancel_all(driver, 7))
    assert only(out, ShardResult) == ShardResult(only(out, ShardResult).correlation_id, True)
    assert of_type(out, CancelToMatcher) == [] and of_type(out, OrderUpdate) == []
    assert driver.machine.state_hash() == before


def test_an_unknown_symbol_is_refused_and_a_halted_user_may_still_cancel_all() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    driver.accepted_order(7, "a")
    before = driver.machine.state_hash()
    out = driver.run(cancel_all(driver, 7, "DOGE-USDT"))
    assert [r.reject_reason for r in results(out)] == [RejectReason.UNKNOWN_SYMBOL]
    assert of_type(out, CancelToMatcher) == []
    assert driver.machine.state_hash() == before
    # An operator's halt stops new orders, never the way out: cancel-all still passes.
    driver.run(
        UserControl(
            driver.next_correlation(), 7, int(UserControlAction.HALT_TRADING), "ops", "test"
        )
    )
    out = driver.run(cancel_all(driver, 7))
    assert only(out, ShardResult).accepted
    assert len(of_type(out, CancelToMatcher)) == 1


def test_before_version_3_it_is_refused_malformed_as_an_older_build_refuses_it() -> None:
    for version in (1, 2):
        driver = driver_at(version)
        driver.resident(7, USDT=100_000)
        order_id = driver.accepted_order(7, "a")
        before = driver.machine.state_hash()
        command = cancel_all(driver, 7)
        out = driver.run(command)
        assert results(out) == [ShardResult(command.correlation_id, False, RejectReason.MALFORMED)]
        assert driver.machine.state_hash() == before
        assert not driver.machine.state.actors[7].orders[order_id].cancel_in_flight
        # What a build without the command decodes it as: a batch item with no command.
        assert decode_command_batch(encode_command_batch([command])) == [command]


def test_a_cancel_all_for_a_user_not_resident_waits_for_the_hydration() -> None:
    driver = driver_at(3)
    command = cancel_all(driver, 9)
    out = driver.run(command)
    assert only(out, ShardResult).parked
    out = driver.run(driver.hydrate(9, balances={"USDT": 10}))
    final = [r for r in results(out) if r.correlation_id == command.correlation_id]
    assert final == [ShardResult(command.correlation_id, True)]


def test_the_orders_are_cancelled_by_their_user_sequence_after_a_snapshot_restore() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    placed = [
        driver.accepted_order(7, f"o{number}", price_ticks=80 + number) for number in range(5)
    ]
    restored = ShardDriver()
    restored.machine.restore(driver.machine.snapshot())
    restored.now, restored.correlation = driver.now, driver.correlation
    out = restored.run(cancel_all(restored, 7))
    assert [cancel.order_id for cancel in of_type(out, CancelToMatcher)] == placed
    assert placed == [f"{SHARD}:7:{seq}" for seq in range(1, 6)]
    assert only(out, ShardResult).cancelled_order_ids == tuple(placed)


def test_an_order_that_fills_while_its_cancel_is_in_flight_settles_as_filled() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    order_id = driver.accepted_order(7, "a", quantity_lots=2)
    driver.run(cancel_all(driver, 7))
    fill = driver.fill(order_id, 7, price_ticks=100, quantity_lots=2, done=True)
    out = driver.run(driver.events("g1", fill))
    assert [u.status for u in of_type(out, OrderUpdate)] == [OrderStatus.FILLED]
    assert not driver.machine.state.actors[7].orders
    assert driver.machine.statistics().in_flight_cancels == 0


# --- the dead man's switch -----------------------------------------------------------


def switch(driver: ShardDriver, user_id: int, timeout_ms: int) -> CancelAllAfter:
    return CancelAllAfter(driver.next_correlation(), user_id, timeout_ms, 0)


def test_an_armed_switch_fires_on_consensus_time_unless_armed_again_and_then_disarms() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    first = driver.accepted_order(7, "a")
    out = driver.run(switch(driver, 7, 5_000))
    result = only(out, ShardResult)
    assert result.accepted and result.cancel_all_at_ms == driver.now + 5_000
    armed_hash = driver.machine.state_hash()
    assert not driver.machine.state.actors[7].is_flat()
    assert driver.machine.statistics().armed_switches == 1
    # Re-armed before it fires: it moves on.
    driver.tick(advance_ms=4_000)
    again = only(driver.run(switch(driver, 7, 5_000)), ShardResult)
    assert again.cancel_all_at_ms == driver.now + 5_000
    assert of_type(driver.tick(advance_ms=4_999), CancelToMatcher) == []
    second = driver.accepted_order(7, "b", symbol="ETH-USDT")
    fired = driver.tick(advance_ms=1)
    assert of_type(fired, CancelToMatcher) == [
        CancelToMatcher("g1", first, 7),
        CancelToMatcher("g2", second, 7),
    ]
    assert of_type(fired, ShardResult) == []  # nobody asked: order updates tell
    actor = driver.machine.state.actors[7]
    assert actor.cancel_all_at_ms == 0 and not driver.machine.state.switches
    assert driver.machine.statistics().armed_switches == 0
    assert driver.machine.state_hash() != armed_hash
    assert of_type(driver.tick(advance_ms=10_000), CancelToMatcher) == []  # once only


def test_zero_disarms_and_the_timeout_is_bounded() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    driver.accepted_order(7, "a")
    driver.run(switch(driver, 7, 2_000))
    off = only(driver.run(switch(driver, 7, 0)), ShardResult)
    assert off.accepted and off.cancel_all_at_ms == 0
    assert of_type(driver.tick(advance_ms=3_000), CancelToMatcher) == []
    assert driver.machine.state.actors[7].cancel_all_at_ms == 0
    assert not driver.machine.state.switches
    for timeout_ms in (1, 999, 86_400_001):
        before = driver.machine.state_hash()
        out = driver.run(switch(driver, 7, timeout_ms))
        assert [r.reject_reason for r in results(out)] == [RejectReason.INVALID_TIMEOUT]
        assert driver.machine.state_hash() == before


def test_an_armed_user_is_never_evicted_and_the_switch_survives_a_snapshot() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    driver.run(switch(driver, 7, 600_000))
    # Far past the idle time: swept, an armed user is not flat, so not evicted.
    out = driver.tick(advance_ms=5 * TTL_MS)
    assert of_type(out, BeginDehydrate) == []
    assert 7 in driver.machine.state.actors
    restored = ShardDriver()
    restored.machine.restore(driver.machine.snapshot())
    assert restored.machine.state_hash() == driver.machine.state_hash()
    assert restored.machine.state.switches == driver.machine.state.switches
    restored.now = driver.now
    order = restored.accepted_order(7, "late")
    fired = restored.tick(advance_ms=600_000 - 5 * TTL_MS)
    assert [c.order_id for c in of_type(fired, CancelToMatcher)] == [order]
    # Fired and its order cancelled, the user is flat: evicted as any other.
    restored.run(
        restored.events(
            "g1", restored.event("g1", EventKind.CANCELLED, order, 7, remaining_lots=1, reason=1)
        )
    )
    assert restored.machine.state.actors[7].is_flat()


def test_an_unarmed_actor_keeps_its_plain_data_so_older_hashes_hold() -> None:
    driver = driver_at(3)
    driver.resident(7, USDT=100_000)
    plain_before = snapshot_module.actor_plain(driver.machine.state.actors[7])
    driver.run(switch(driver, 7, 5_000))
    armed = snapshot_module.actor_plain(driver.machine.state.actors[7])
    assert len(armed) == len(plain_before) + 1
    driver.run(switch(driver, 7, 0))
    assert len(snapshot_module.actor_plain(driver.machine.state.actors[7])) == len(plain_before)


def test_before_version_3_cancel_all_after_is_refused_malformed() -> None:
    driver = driver_at(2)
    driver.resident(7, USDT=100_000)
    before = driver.machine.state_hash()
    command = switch(driver, 7, 5_000)
    assert results(driver.run(command)) == [
        ShardResult(command.correlation_id, False, RejectReason.MALFORMED)
    ]
    assert driver.machine.state_hash() == before
    assert decode_command_batch(encode_command_batch([command])) == [command]
