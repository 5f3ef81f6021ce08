"""Bad input gets its specific reason and changes nothing.

"Nothing" is exact: `state_hash()` before and after a refused command is equal.
A refused command takes no rate-limit token, is not activity (no recency move,
no last-active time, no eviction cancelled) and leaves no dedup entry; only
statistics counters move, and they are outside the state hash by design.

The one documented exception is an unknown user: finding out costs one
hydration round trip, which spends one fencing epoch (`epoch_counter`).
"""

from __future__ import annotations

from typing import Any

import pytest

from services.shard.core.commands import MalformedCommand
from services.shard.core.egress import BeginDehydrate, HydrateRequest
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.vocabulary import BUY, LIMIT, MARKET, SELL, RejectReason
from tests.shard.support import SHARD, ShardDriver, only, results

LONG_ID = "x" * 65


def _refusal_cases(driver: ShardDriver) -> list[tuple[object, RejectReason]]:
    place = driver.place
    return [
        (place(1, "a", symbol="DOGE-USDT"), RejectReason.UNKNOWN_SYMBOL),
        (place(1, "a", quantity_lots=0), RejectReason.INVALID_QUANTITY),
        (place(1, "a", quantity_lots=-3), RejectReason.INVALID_QUANTITY),
        (place(1, "a", price_ticks=0), RejectReason.INVALID_PRICE),  # off tick: not a whole tick
        (place(1, "a", price_ticks=-100), RejectReason.INVALID_PRICE),
        (place(1, "a", quantity_lots=10**18), RejectReason.INVALID_QUANTITY),  # beyond int64
        (place(1, "a", side=0), RejectReason.INVALID_ORDER),
        (place(1, "a", order_type=7), RejectReason.INVALID_ORDER),
        (place(1, "a", time_in_force=9), RejectReason.INVALID_ORDER),
        (place(1, "a", time_in_force=4, expire_at_ms=driver.now), RejectReason.INVALID_ORDER),
        (place(1, "a", expire_at_ms=driver.now + 5), RejectReason.INVALID_ORDER),  # not GTD
        (place(1, "a", quote_amount=5), RejectReason.INVALID_ORDER),
        (
            place(1, "a", order_type=MARKET, quantity_lots=1, quote_amount=5),
            RejectReason.INVALID_ORDER,
        ),
        (place(1, "a", order_type=MARKET, quantity_lots=0), RejectReason.INVALID_AMOUNT),
        (
            place(1, "a", order_type=MARKET, side=SELL, quantity_lots=0),
            RejectReason.INVALID_QUANTITY,
        ),
        (place(1, "a", order_type=MARKET, side=SELL, quote_amount=9), RejectReason.INVALID_ORDER),
        (place(1, ""), RejectReason.MALFORMED),
        (place(1, LONG_ID), RejectReason.MALFORMED),
        (place(1, "\x1ftransfer:t1"), RejectReason.MALFORMED),
        (place(1, "a", price_ticks=10**9, quantity_lots=10**6), RejectReason.INSUFFICIENT_FUNDS),
        (place(1, "a", side=SELL, quantity_lots=10**6), RejectReason.INSUFFICIENT_FUNDS),
        (driver.cancel(1, order_id=f"{SHARD}:2:1"), RejectReason.ORDER_NOT_FOUND),  # user mismatch
        (driver.cancel(1, order_id="garbage"), RejectReason.ORDER_NOT_FOUND),
        (driver.cancel(1, client_order_id="nope"), RejectReason.ORDER_NOT_FOUND),
        (driver.deposit(1, "USDT", 0), RejectReason.INVALID_AMOUNT),
        (driver.deposit(1, "XRP", 10), RejectReason.UNKNOWN_ASSET),
        (driver.withdraw(1, "USDT", 10**12), RejectReason.INSUFFICIENT_FUNDS),
        (MalformedCommand(driver.next_correlation(), "no command"), RejectReason.MALFORMED),
    ]


def test_every_refusal_names_its_reason_and_leaves_the_state_hash_unchanged() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=50_000, BTC=3_000)
    driver.resident(2, USDT=50_000)
    driver.accepted_order(2, "theirs")
    driver.accepted_order(1, "mine", quantity_lots=2)
    for command, reason in _refusal_cases(driver):
        before = driver.machine.state_hash()
        out = driver.run(command)  # type: ignore[arg-type]
        result = only(out, type(results(out)[0]))
        assert (result.accepted, result.reject_reason) == (False, reason), command
        assert len(out) == 1, out
        assert driver.machine.state_hash() == before, command


def test_refusals_through_the_bytes_path_match() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=50_000, BTC=3_000)
    before = driver.machine.state_hash()
    cases = [(c, r) for c, r in _refusal_cases(driver) if not isinstance(c, MalformedCommand)]
    out = driver.run_bytes([command for command, _ in cases])  # type: ignore[misc]
    assert [r.reject_reason for r in results(out)] == [reason for _, reason in cases]
    assert driver.machine.state_hash() == before


def test_undecodable_bytes_get_one_malformed_result_and_change_nothing() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=50_000)
    before = driver.machine.state_hash()
    for data in (b"\xff\xff\xff", b"\x0a\x05garbage-that-is-not-a-command", b"\x08"):
        out = driver.run_raw(data)
        assert len(out) == 1
        assert out[0].reject_reason == RejectReason.MALFORMED  # type: ignore[union-attr]
    assert driver.machine.state_hash() == before


def test_an_empty_command_in_a_batch_is_malformed_and_the_rest_apply() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=50_000)
    out = driver.run_bytes(
        [driver.deposit(1, "USDT", 5), MalformedCommand(77, ""), driver.deposit(1, "USDT", 6)]
    )
    assert [(r.correlation_id, r.accepted) for r in results(out)][1] == (77, False)
    assert results(out)[1].reject_reason == RejectReason.MALFORMED
    assert driver.balance(1, "USDT") == (50_011, 0)


def test_unknown_user_costs_one_epoch_and_nothing_else() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=50_000)
    twin = ShardMachine(driver.settings)
    twin.restore(driver.machine.snapshot())
    out = driver.run(driver.place(404, "a"))
    request = only(out, HydrateRequest)
    assert results(out)[0].parked
    out = driver.run(driver.hydrate(404, known=False, epoch=request.epoch))
    assert [r.reject_reason for r in results(out)] == [RejectReason.UNKNOWN_USER]
    twin.state.epoch_counter += 1
    assert driver.machine.state_hash() == twin.state_hash()


def test_a_refusal_during_the_flush_window_does_not_cancel_the_eviction() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=50_000)
    out = driver.tick(60_000)
    epoch = next(item for item in out if isinstance(item, BeginDehydrate)).epoch
    refused = results(driver.run(driver.place(1, "a", quantity_lots=0)))[0]
    assert refused.reject_reason == RejectReason.INVALID_QUANTITY
    driver.run(driver.flush_complete(1, epoch))
    assert driver.machine.actor(1) is None


@pytest.mark.parametrize("order_type", [LIMIT, MARKET])
def test_refused_orders_leave_no_dedup_entry(order_type: int) -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=100)
    kwargs: dict[str, Any] = {
        "order_type": order_type,
        "quantity_lots": 1 if order_type == LIMIT else 0,
    }
    if order_type == MARKET:
        kwargs["quote_amount"] = 10_000
    refused = results(driver.run(driver.place(1, "same", side=BUY, **kwargs)))[0]
    assert refused.reject_reason == RejectReason.INSUFFICIENT_FUNDS
    driver.run(driver.deposit(1, "USDT", 100_000))
    retried = results(driver.run(driver.place(1, "same", side=BUY, **kwargs)))[0]
    assert retried.accepted and not retried.duplicate
