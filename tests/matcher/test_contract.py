"""The contract the OMS relies on (matcher.proto header), checked on the state machine.

1. dedup by order id for the order's lifetime and a horizon after it ends;
2. a known id returns the existing order and creates nothing; orders are queryable;
3. events contiguous per OMS shard, resumable from any retained sequence;
4. open-orders snapshots stamped with the sequence they are as-of;
plus snapshot/restore equivalence, expiry after restore, exact money, and
determinism across processes with different string-hash seeds.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protos.oms.v1 import matcher_pb2
from services.matcher.core import MatcherMachine, SequenceTooOldError
from services.runtime.core.state_machine import ApplyContext
from tests.matcher import support
from tests.matcher.support import (
    BUY,
    CANCELLED,
    EXPIRED,
    FILLED,
    GTD,
    OPEN,
    REJECTED,
    SELL,
    Driver,
    Row,
    cancel,
    limit,
    market_buy,
)
from tests.matcher.test_differential import RandomChooser, StreamBuilder

ROOT = Path(__file__).resolve().parents[2]


Entries = list[tuple[int, list[matcher_pb2.MatcherCommand] | None]]


def random_commands(seed: int, batches: int, start_ms: int = 1_000) -> Entries:
    """A seeded stream: (consensus time, commands) per log entry, None for a timer tick."""
    rng = random.Random(seed)
    builder = StreamBuilder(RandomChooser(rng), lambda symbol: 100 if symbol == "AAA-USD" else 50)
    entries: Entries = []
    now = start_ms
    for _ in range(batches):
        now += rng.randint(0, 15)
        if rng.random() < 0.15:
            entries.append((now, None))
        else:
            entries.append((now, [builder.command(now) for _ in range(rng.randint(1, 6))]))
    return entries


def feed(driver: Driver, entries: Entries) -> list[Any]:
    """Apply each entry; a timer's output is its events, a batch's (results, events)."""
    outputs: list[Any] = []
    for now, commands in entries:
        outputs.append(driver.timer(now) if commands is None else driver.apply(commands, now))
    return outputs


# --- 1 and 2: dedup ----------------------------------------------------------------------


def test_duplicate_of_a_live_order_returns_it_and_creates_nothing() -> None:
    driver = Driver.create()
    first, events = driver.one(limit("s1:1:1", 1, BUY, 100, 5), 1_000)
    assert first[2][1] == OPEN and len(events) == 1
    hash_before = driver.machine.state_hash()
    book_before = driver.book()
    # Same id, different fields: still the existing order.
    again, events = driver.one(limit("s1:1:1", 1, SELL, 101, 9, stp=2), 1_001)
    assert again == (0, True, first[2], 0, False)
    assert events == []
    assert driver.machine.state_hash() == hash_before
    assert driver.book() == book_before
    assert driver.machine.events_from("s1", 2) == []  # sequence unchanged


@pytest.mark.parametrize("ending", ["filled", "cancelled", "rejected", "expired"])
def test_duplicate_within_the_horizon_and_new_only_past_it(ending: str) -> None:
    driver = Driver.create(dedup_horizon_ms=500)
    now = 1_000
    if ending == "filled":
        driver.one(limit("s1:2:1", 2, SELL, 100, 3), now)
        command = limit("s1:1:1", 1, BUY, 100, 3)
    elif ending == "cancelled":
        command = limit("s1:1:1", 1, BUY, 100, 3)
    elif ending == "rejected":
        command = limit("s1:1:1", 1, BUY, 100, 3, symbol="NOPE")
    else:
        command = limit("s1:1:1", 1, BUY, 100, 3, tif=GTD, expire_at_ms=now + 10)
    result, _ = driver.one(command, now)
    if ending == "cancelled":
        result, _ = driver.one(cancel("s1:1:1", 1), now)
    if ending == "expired":
        assert [event[5] for event in driver.timer(now + 10)] == ["expired"]
        now += 10
        result = (0, False, support.state_tuple(driver.machine.order_state("s1:1:1")), 0, False)  # type: ignore[arg-type]
    final_state = result[2]
    assert final_state[1] in (FILLED, CANCELLED, REJECTED, EXPIRED)
    ended_at = now

    # Within the horizon, and past it but before a timer sweeps: a duplicate.
    for at in (ended_at + 1, ended_at + 499, ended_at + 10_000):
        hash_before = driver.machine.state_hash()
        duplicate, events = driver.one(limit("s1:1:1", 1, BUY, 100, 3), at)
        assert duplicate[1] is True and duplicate[2] == final_state and events == []
        assert driver.machine.state_hash() == hash_before
    driver.timer(ended_at + 499)
    assert driver.one(limit("s1:1:1", 1, BUY, 100, 3), ended_at + 499)[0][1] is True
    # The first timer at end + horizon forgets it; the id is then new.
    driver.timer(ended_at + 500)
    assert driver.machine.order_state("s1:1:1") is None
    fresh, events = driver.one(limit("s1:1:1", 1, BUY, 100, 3), ended_at + 500)
    assert fresh[1] is False and fresh[2][1] == OPEN
    assert [event[5] for event in events] == ["accepted"]


def test_dedup_sweep_is_bounded_per_timer_and_walks_the_front() -> None:
    driver = Driver.create(dedup_horizon_ms=100, max_dedup_sweeps_per_timer=3)
    for index in range(1, 8):
        driver.one(limit(f"s1:1:{index}", 1, BUY, 100, 1, symbol="NOPE"), 1_000 + index)
    driver.timer(5_000)
    remaining = [index for index in range(1, 8) if driver.machine.order_state(f"s1:1:{index}")]
    assert remaining == [4, 5, 6, 7]  # oldest first, three per tick
    driver.timer(5_001)
    driver.timer(5_002)
    assert driver.machine.statistics().known_order_ids == 0


def test_query_by_id() -> None:
    driver = Driver.create()
    assert driver.machine.order_state("s1:1:1") is None
    driver.one(limit("s1:1:1", 1, BUY, 99, 4), 1_000)
    state = driver.machine.order_state("s1:1:1")
    assert state is not None and state.status == OPEN and state.remaining_lots == 4


# --- 3: events ---------------------------------------------------------------------------


def test_events_are_contiguous_per_oms_shard_and_resumable() -> None:
    driver = Driver.create()
    feed(driver, random_commands(seed=3, batches=400))
    by_shard: dict[str, list[Row]] = {}
    for event in driver.events:
        by_shard.setdefault(str(event[0]), []).append(event)
    assert set(by_shard) == {"s1", "s2"}
    for shard, events in by_shard.items():
        assert [event[1] for event in events] == list(range(1, len(events) + 1))
        # A subscriber resuming anywhere gets exactly the live events from there on.
        for start in (1, 2, len(events) // 2, len(events), len(events) + 1):
            resumed = [support.event_tuple(e) for e in driver.machine.events_from(shard, start)]
            assert resumed == events[start - 1 :]
        limited = driver.machine.events_from(shard, 3, limit=5)
        assert [support.event_tuple(event) for event in limited] == events[2:7]
    assert driver.machine.events_from("never-seen", 1) == []


def test_events_older_than_the_window_raise_sequence_too_old() -> None:
    driver = Driver.create(retained_events_per_shard=5)
    for index in range(1, 5):
        driver.one(limit(f"s1:1:{index}", 1, BUY, 100 - index, 1, symbol="BBB-USD"), 1_000)
    driver.one(limit("s2:1:1", 1, BUY, 90, 1, symbol="BBB-USD"), 1_000)
    for index in range(5, 9):  # s1 now has 8 events; the window holds 4..8
        driver.one(limit(f"s1:1:{index}", 1, BUY, 100 - index, 1, symbol="BBB-USD"), 1_000)
    assert [event.sequence for event in driver.machine.events_from("s1", 4)] == [4, 5, 6, 7, 8]
    with pytest.raises(SequenceTooOldError) as raised:
        driver.machine.events_from("s1", 3)
    assert raised.value.first_retained_sequence == 4
    assert [event.sequence for event in driver.machine.events_from("s2", 1)] == [1]


# --- 4: open orders ----------------------------------------------------------------------


def replay_open_orders(events: list[Row], user: int) -> dict[str, int]:
    """Open orders (id -> remaining lots) of one user, as an OMS shard rebuilds them."""
    open_orders: dict[str, int] = {}
    for event in events:
        order_id, kind = str(event[2]), event[5]
        if event[3] != user:
            continue
        if kind == "accepted":
            open_orders[order_id] = int(event[6][3])
        elif kind == "fill":
            open_orders[order_id] = int(event[14])
            if event[15]:
                open_orders.pop(order_id, None)
        elif kind in ("cancelled", "expired"):
            open_orders.pop(order_id, None)
    return open_orders


def test_open_orders_snapshot_agrees_with_replaying_the_events() -> None:
    driver = Driver.create()
    entries = random_commands(seed=11, batches=300)
    for cut in (50, 150, 300):
        feed(driver, entries[cut - 50 if cut > 50 else 0 : cut])
        for shard in ("s1", "s2"):
            shard_events = [event for event in driver.events if event[0] == shard]
            for user in support_users():
                snapshot = driver.machine.open_orders(shard, user)
                assert snapshot.as_of_sequence == len(shard_events)
                replayed = replay_open_orders(shard_events[: snapshot.as_of_sequence], user)
                assert {s.order.order_id: s.remaining_lots for s in snapshot.orders} == replayed
                assert all(s.order.user_id == user for s in snapshot.orders)


def support_users() -> tuple[int, ...]:
    return (1, 2, 3, 4)


# --- snapshots ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_snapshot_restore_gives_the_same_hash_and_the_same_future(seed: int) -> None:
    entries = random_commands(seed=seed, batches=500)
    original = Driver.create(dedup_horizon_ms=120, retained_events_per_shard=300)
    feed(original, entries[:250])
    data = original.machine.snapshot()
    restored = Driver.create(dedup_horizon_ms=120, retained_events_per_shard=300)
    restored.machine.restore(data)
    assert restored.machine.state_hash() == original.machine.state_hash()
    assert restored.machine.snapshot() == data  # canonical bytes
    for shard in ("s1", "s2"):
        first = original.machine.engine.streams[shard].first_retained_sequence
        assert restored.machine.events_from(shard, first) == original.machine.events_from(
            shard, first
        )
    # The same further entries give the same results, events and hashes on both.
    for now, commands in entries[250:]:
        if commands is None:
            assert restored.timer(now) == original.timer(now)
        else:
            assert restored.apply(commands, now) == original.apply(commands, now)
        assert restored.machine.state_hash() == original.machine.state_hash()
    assert restored.machine.snapshot() == original.machine.snapshot()


def test_the_state_machine_version_is_in_the_snapshot_and_the_hash() -> None:
    entries = random_commands(seed=4, batches=100)
    driver = Driver.create()
    feed(driver, entries)
    at_1, snapshot_at_1 = driver.machine.state_hash(), driver.machine.snapshot()
    # A version 1 snapshot (the layout before versions: no version field) still loads.
    header, rest = snapshot_at_1[:12], snapshot_at_1[12:]
    old_layout = header[:8] + (1).to_bytes(4, "little") + rest[:16] + rest[20:]
    restored = Driver(MatcherMachine(driver.machine.settings))
    restored.machine.restore(old_layout)
    assert restored.machine.version == 1 and restored.machine.state_hash() == at_1
    driver.machine.activate_version(2)
    assert driver.machine.state_hash() != at_1
    restored.machine.restore(driver.machine.snapshot())
    assert restored.machine.version == 2
    assert restored.machine.state_hash() == driver.machine.state_hash()


def test_gtd_expires_at_consensus_time_after_restore() -> None:
    driver = Driver.create()
    driver.one(limit("s1:1:1", 1, BUY, 100, 2, tif=GTD, expire_at_ms=2_000), 1_000)
    driver.one(limit("s1:1:2", 1, BUY, 99, 2, tif=GTD, expire_at_ms=2_500), 1_000)
    restored = Driver(MatcherMachine(driver.machine.settings))
    restored.machine.restore(driver.machine.snapshot())
    # A command past the expiry time does not expire anything: only timers do.
    restored.one(limit("s2:2:1", 2, SELL, 105, 1), 2_100)
    assert restored.machine.order_state("s1:1:1").status == OPEN  # type: ignore[union-attr]
    assert restored.timer(1_999) == []
    expired = restored.timer(2_000)
    assert [(event[2], event[5], event[6]) for event in expired] == [("s1:1:1", "expired", 2)]
    assert restored.timer(2_499) == []
    assert [event[2] for event in restored.timer(3_000)] == ["s1:1:2"]


def test_expiries_per_timer_are_bounded_in_expiry_then_arrival_order() -> None:
    driver = Driver.create(max_expiries_per_timer=2)
    for index, expire in enumerate((1_300, 1_200, 1_200, 1_100), start=1):
        driver.one(
            limit(f"s1:1:{index}", 1, BUY, 95 + index, 2, tif=GTD, expire_at_ms=expire), 1_000
        )
    driver.one(cancel("s1:1:2", 1), 1_000)  # a stale heap entry costs no budget
    assert [event[2] for event in driver.timer(5_000)] == ["s1:1:4", "s1:1:3"]
    assert [event[2] for event in driver.timer(5_000)] == ["s1:1:1"]


# --- money -------------------------------------------------------------------------------


def test_every_fill_has_exact_notional_and_fee_and_market_buys_stay_in_budget() -> None:
    driver = Driver.create()
    outputs = feed(driver, random_commands(seed=5, batches=800))
    configs = {symbol.symbol: symbol for symbol in support.SYMBOLS}
    spent: dict[str, int] = {}
    fills = 0
    for output in outputs:
        events = output if isinstance(output, list) else output[1]
        for event in events:
            if event[5] != "fill":
                continue
            fills += 1
            config = configs[str(event[7])]
            price, quantity, notional, fee, maker = (
                event[9],
                event[10],
                event[11],
                event[12],
                event[13],
            )
            assert notional == price * quantity * config.tick_size
            rate = config.maker_fee_ppm if maker else config.taker_fee_ppm
            assert fee == notional * rate // 1_000_000
            spent[str(event[2])] = spent.get(str(event[2]), 0) + notional + fee
    assert fills > 100
    market_buys = 0
    for order_id, total in spent.items():
        state = driver.machine.order_state(order_id)
        if state is None or state.order.order_type != support.MARKET or state.order.side != BUY:
            continue
        market_buys += 1
        assert state.quote_spent == total <= state.order.quote_amount
        assert state.quote_spent == state.filled_notional + state.fees_paid
    assert market_buys > 5


def test_market_buy_takes_the_most_lots_its_quote_affords_including_the_fee() -> None:
    driver = Driver.create()
    # AAA: tick 3, taker fee 2700 ppm. One lot at 100 costs 300 + 0 fee; 10 lots 3000 + 8.
    driver.one(limit("s2:9:1", 9, SELL, 100, 10), 1_000)
    result, events = driver.one(market_buy("s1:1:1", 1, 3_007), 1_000)
    fill = next(event for event in events if event[5] == "fill" and event[3] == 1)
    assert fill[10] == 9 and fill[11] == 2_700 and fill[12] == 7  # 10 lots would cost 3008
    assert result[2][1] == CANCELLED and result[2][6] == 2_707
    assert events[-1][5:] == ("cancelled", matcher_pb2.CANCEL_REASON_IOC_REMAINDER, 0)
    result, events = driver.one(market_buy("s1:1:2", 1, 300), 1_000)
    assert result[2][1] == FILLED and events[-1][15] is True  # spent exactly its quote


# --- bad input ---------------------------------------------------------------------------


def test_malformed_bytes_and_oversized_batches_are_refused_whole() -> None:
    machine = MatcherMachine(support.settings(max_commands_per_batch=3))
    hash_before = machine.state_hash()
    for data in (b"\xff\xff\xff", b"\x0a\x05\x08", support.batch_bytes([cancel("s1:1:1", 1)] * 4)):
        (egress,) = machine.apply(data, ApplyContext(1, 1_000))
        assert egress.refused and egress.results == () and egress.events == ()
    assert machine.state_hash() == hash_before
    assert machine.statistics().refused_entries == 3


# --- determinism across processes ---------------------------------------------------------

_CHILD = """
import sys
from tests.matcher.support import Driver
from tests.matcher.test_contract import feed, random_commands
driver = Driver.create(dedup_horizon_ms=200)
feed(driver, random_commands(seed=21, batches=300))
sys.stdout.write(driver.machine.state_hash().hex() + " " + driver.machine.snapshot().hex())
"""


def test_same_log_same_state_in_processes_with_different_hash_seeds() -> None:
    outputs = set()
    for seed in ("1", "2"):
        environment = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        completed = subprocess.run(
            [sys.executable, "-c", _CHILD],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env=environment,
            timeout=120,
        )
        outputs.add(completed.stdout)
    assert len(outputs) == 1
