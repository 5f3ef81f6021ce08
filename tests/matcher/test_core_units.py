"""Small pieces of the core: money arithmetic, order ids, settings, snapshot format checks."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.matcher.core import EngineSettings, MatcherMachine, SettingsError, SnapshotFormatError
from services.matcher.core.money import affordable_lots, fee, market_reach
from services.matcher.core.order_ids import parse_order_id
from services.matcher.core.orders import ORDER_TRANSITIONS, OrderTransitionError
from services.matcher.core.snapshot_codec import MAGIC
from tests.matcher import support
from tests.matcher.support import BUY, SELL, Driver, limit
from tests.matcher.test_contract import feed, random_commands


@given(
    budget=st.integers(0, 50_000),
    lot_cost=st.integers(1, 2_000),
    fee_ppm=st.integers(0, 1_000_000),
)
def test_affordable_lots_is_the_largest_fill_within_budget(
    budget: int, lot_cost: int, fee_ppm: int
) -> None:
    lots = affordable_lots(budget, lot_cost, fee_ppm)

    def cost(count: int) -> int:
        return count * lot_cost + fee(count * lot_cost, fee_ppm)

    assert lots >= 0
    assert cost(lots) <= budget
    assert cost(lots + 1) > budget


@given(
    reference=st.integers(1, 10**6), band=st.integers(1, 50_000), price=st.integers(1, 2 * 10**6)
)
def test_market_reach_matches_the_band_inequality(reference: int, band: int, price: int) -> None:
    assert (price <= market_reach(reference, band, True)) == (
        (price - reference) * 10_000 <= reference * band
    )
    assert (price >= market_reach(reference, band, False)) == (
        (reference - price) * 10_000 <= reference * band
    )


def test_order_ids_have_one_spelling() -> None:
    assert parse_order_id("s1:42:17", 42) == ("s1", 17)
    assert parse_order_id("shard-a.b:7:18446744073709551615", 7) == ("shard-a.b", 2**64 - 1)
    for bad in (
        "s1:042:17",
        "s1:42:017",
        "s1:42:+17",
        "s1:42: 17",
        "s1:43:17",
        " :42:1",
        "s/1:42:1",
    ):
        assert parse_order_id(bad, 42) is None, bad


def test_transition_table_refuses_unlisted_edges() -> None:
    driver = Driver.create()
    driver.one(limit("s1:1:1", 1, BUY, 99, 2), 1_000)
    record = driver.machine.engine.dedup.orders["s1:1:1"]
    with pytest.raises(OrderTransitionError):
        record.move_to(support.REJECTED)
    assert all(not ORDER_TRANSITIONS[status] for status in (4, 5, 6, 7))


def test_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="tick_size"):
        EngineSettings(symbols=(dataclasses.replace(support.AAA, tick_size=0),))
    with pytest.raises(SettingsError, match="twice"):
        EngineSettings(symbols=(support.AAA, support.AAA))
    with pytest.raises(SettingsError, match="taker_fee_ppm"):
        EngineSettings(symbols=(dataclasses.replace(support.AAA, taker_fee_ppm=2_000_000),))
    with pytest.raises(SettingsError, match="retained_events_per_shard"):
        EngineSettings(symbols=(support.AAA,), retained_events_per_shard=0)
    assert EngineSettings(symbols=(support.AAA,)).symbols == (support.AAA,)


def test_damaged_snapshots_are_refused_and_leave_the_state_alone() -> None:
    source = Driver.create()
    feed(source, random_commands(seed=9, batches=80))
    data = source.machine.snapshot()
    target = Driver.create()
    target.one(limit("s1:1:1", 1, SELL, 101, 3), 1_000)
    hash_before = target.machine.state_hash()
    damaged = [
        b"",
        data[:-1],
        data + b"\x00",
        b"XXXXXXXX" + data[len(MAGIC) :],
        data[:8] + b"\x09" + data[9:],  # another format version
        data[: len(data) // 2],
    ]
    for blob in damaged:
        with pytest.raises(SnapshotFormatError):
            target.machine.restore(blob)
        assert target.machine.state_hash() == hash_before
    target.machine.restore(data)
    assert target.machine.state_hash() == source.machine.state_hash()


def test_state_hash_tells_states_apart_and_ignores_how_they_were_reached() -> None:
    first, second = Driver.create(), Driver.create()
    first.apply([limit("s1:1:1", 1, SELL, 101, 3), limit("s1:2:1", 2, SELL, 101, 3)], 1_000)
    second.apply([limit("s1:1:1", 1, SELL, 101, 3)], 1_000)
    second.apply([limit("s1:2:1", 2, SELL, 101, 3)], 1_000)
    assert first.machine.state_hash() == second.machine.state_hash()
    swapped = Driver.create()
    swapped.apply([limit("s1:2:1", 2, SELL, 101, 3), limit("s1:1:1", 1, SELL, 101, 3)], 1_000)
    assert swapped.machine.state_hash() != first.machine.state_hash()  # FIFO order differs
    first.one(limit("s1:3:1", 3, BUY, 101, 1), 1_000)
    assert first.machine.state_hash() != second.machine.state_hash()


def test_restore_takes_the_symbol_table_from_the_snapshot() -> None:
    source = Driver.create()
    source.one(limit("s1:1:1", 1, SELL, 51, 3, symbol="BBB-USD"), 1_000)
    machine = MatcherMachine(dataclasses.replace(support.settings(), symbols=(support.AAA,)))
    machine.restore(source.machine.snapshot())
    assert sorted(machine.engine.books) == ["AAA-USD", "BBB-USD"]
    assert machine.state_hash() == source.machine.state_hash()
    assert machine.open_orders("s1", 1).orders[0].order.symbol == "BBB-USD"
