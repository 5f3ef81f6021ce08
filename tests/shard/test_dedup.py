"""Rule 9: idempotency without DB reads on the hot path (Bloom, exact map, DB lookup)."""

from __future__ import annotations

from services.shard.core.dedup import RotatingDedupIndex
from services.shard.core.egress import DedupLookup, ShardResult, SubmitToMatcher
from services.shard.core.user_state import RecentResult
from services.shard.core.vocabulary import OrderStatus
from tests.shard.support import HORIZON_MS, ShardDriver, of_type, only, results, settings


def _counter(driver: ShardDriver, name: str) -> int:
    return driver.machine.statistics().counter(name)


def test_never_seen_ids_are_answered_from_memory() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10**9)
    for index in range(20):
        assert results(driver.run(driver.place(1, f"id-{index}")))[0].accepted
    assert _counter(driver, "dedup_never_seen") == 20
    assert _counter(driver, "dedup_lookups_sent") == 0


def test_a_retry_returns_the_original_result_and_changes_nothing() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10**9)
    original = results(driver.run(driver.place(1, "a")))[0]
    before = driver.machine.state_hash()
    out = driver.run(driver.place(1, "a", price_ticks=999))  # same client id, other content
    retry = only(out, ShardResult)
    assert retry.duplicate and retry.accepted
    assert (retry.order_id, retry.status) == (original.order_id, OrderStatus.PENDING)
    assert of_type(out, SubmitToMatcher) == []
    assert driver.machine.state_hash() == before
    assert _counter(driver, "dedup_exact_hits") == 1


def test_a_finished_order_is_still_a_duplicate_inside_the_horizon_and_new_after_it() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10**9)
    order_id = driver.accepted_order(1, "a")
    driver.run(
        driver.events("g1", driver.fill(order_id, 1, price_ticks=100, quantity_lots=1, done=True))
    )
    inside = results(driver.run(driver.place(1, "a"), advance_ms=HORIZON_MS))[0]
    assert inside.duplicate and inside.order_id == order_id
    past = results(driver.run(driver.place(1, "a"), advance_ms=1))[0]
    assert past.accepted and not past.duplicate and past.order_id != order_id


def _saturated_driver() -> ShardDriver:
    """A tiny Bloom filter with every bit set: every id is "possibly seen"."""
    driver = ShardDriver(settings(dedup_filter_bits=64, dedup_hashes=1))
    for bits in driver.machine.state.dedup.filters:
        bits[:] = b"\xff" * len(bits)
    return driver


def test_possibly_seen_and_not_in_the_exact_map_asks_the_database() -> None:
    driver = _saturated_driver()
    driver.resident(1, USDT=10**9)
    out = driver.run(driver.place(1, "a"))
    assert only(out, DedupLookup) == DedupLookup(1, "a")
    assert only(out, ShardResult).parked
    assert _counter(driver, "dedup_lookups_sent") == 1
    # Later commands of this user wait behind it, in log order.
    out = driver.run(driver.deposit(1, "USDT", 5), driver.place(1, "b"))
    assert [r.parked for r in results(out)] == [True, True]
    out = driver.run(driver.dedup_answer(1, "a", None))  # not seen: a new order
    final = results(out)
    assert [r.accepted for r in final] == [True, True, False]
    assert final[2].parked  # "b" is possibly seen as well: its own lookup now
    assert _counter(driver, "dedup_answers_not_seen") == 1
    out = driver.run(driver.dedup_answer(1, "b", None))
    assert results(out)[0].accepted


def test_database_says_seen_returns_the_original_and_remembers_it() -> None:
    driver = _saturated_driver()
    driver.resident(1, USDT=10**9)
    driver.run(driver.place(1, "a"))
    original = RecentResult("a", "s1:1:41", 0, driver.now - 5)
    out = driver.run(driver.dedup_answer(1, "a", original))
    result = only(out, ShardResult)
    assert result.duplicate and result.order_id == "s1:1:41"
    assert of_type(out, SubmitToMatcher) == []
    # The next retry is answered from memory.
    again = driver.run(driver.place(1, "a"))
    assert only(again, ShardResult).duplicate and of_type(again, DedupLookup) == []
    assert _counter(driver, "dedup_exact_hits") == 1


def test_a_database_original_past_the_horizon_is_a_new_order() -> None:
    driver = _saturated_driver()
    driver.resident(1, USDT=10**9)
    driver.run(driver.place(1, "a"))
    ancient = RecentResult("a", "s1:1:1", 0, driver.now - HORIZON_MS - 1)
    result = results(driver.run(driver.dedup_answer(1, "a", ancient)))[0]
    assert result.accepted and not result.duplicate


def test_a_stale_dedup_answer_is_dropped_and_lookups_are_re_driven() -> None:
    driver = _saturated_driver()
    driver.resident(1, USDT=10**9)
    driver.run(driver.place(1, "a"))
    before = driver.machine.state_hash()
    assert driver.run(driver.dedup_answer(1, "zzz", None)) == []
    assert driver.machine.state_hash() == before
    assert _counter(driver, "dedup_answers_stale") == 1
    assert of_type(driver.tick(driver.settings.redrive_after_ms), DedupLookup) == [
        DedupLookup(1, "a")
    ]


def test_a_user_waiting_for_a_dedup_answer_is_not_evicted() -> None:
    driver = _saturated_driver()
    driver.resident(1, USDT=10**9)
    driver.run(driver.place(1, "a"))
    out = driver.tick(driver.settings.idle_ttl_ms)
    assert [type(item).__name__ for item in out] == ["DedupLookup"]


def test_filters_rotate_on_session_boundaries_and_remember_through_the_horizon() -> None:
    index = RotatingDedupIndex(1 << 12, 4, 3, 1_000)
    index.rotate_to(10_000)
    positions = index.positions(1, "a")
    index.insert(positions)
    index.rotate_to(11_000)
    index.rotate_to(12_999)
    assert index.possibly_seen(positions)  # two rotations later: still there
    index.rotate_to(13_000)
    assert not index.possibly_seen(positions)  # its filter was cleared on the third
    assert index.rotate_to(99_000) == 3  # a long gap clears every filter, no more


def test_bit_positions_are_stable_across_processes() -> None:
    # blake2b with a fixed personalisation, never Python's salted hash(): a golden value
    # holds in every process and on every replica whatever PYTHONHASHSEED is.
    index = RotatingDedupIndex(1 << 20, 4, 3, 1_000)
    assert index.positions(42, "client-1") == [620149, 926475, 317884, 77910]
