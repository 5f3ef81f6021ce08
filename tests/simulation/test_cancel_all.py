"""Cancel-all in the simulated mesh: clients cancel every symbol's orders, one symbol's,
or name a symbol not traded here (refused by the gateway), under every fault; each
accepted answer is judged on the shard's durable egress (`simulation/core/
cancel_all_check.py`): exactly the user's live orders of its symbol at its log position,
listed or counted as already cancelling, and every order whose cancel was sent ending
CANCELLED or FILLED (or REJECTED by the matcher before it ever rested).
"""

from __future__ import annotations

from typing import Any

from services.markets.catalog import load_catalog
from services.matcher.core import versions as matcher_versions
from services.shard.core import versions as shard_versions
from services.shard.core.egress import CancelToMatcher, OrderUpdate, ShardResult
from services.shard.core.vocabulary import CANCELLED, EXPIRED, FILLED, OPEN, PENDING, REJECTED
from simulation.core.cancel_all_check import CANCEL_ALL, CANCEL_OUTCOME, CancelAllCheck
from simulation.core.world import SimConfig, SimWorld
from simulation.report_text import run_text


def test_cancel_alls_under_every_fault_cover_exactly_the_live_orders() -> None:
    """Seed 1 with every fault kind, on the newest shard version (3, which decides
    `CancelAllOrders`; older ones refuse it MALFORMED, which a client would flag)."""
    config = SimConfig(seed=1, steps=20_000, markets=load_catalog().markets)
    world = SimWorld(config)
    result = world.run()
    assert result.ok, run_text(config, result, trace=True)
    for group, nodes in world.replicas.items():
        implemented = (
            shard_versions.IMPLEMENTED_VERSIONS
            if group in world.shard_ids
            else matcher_versions.IMPLEMENTED_VERSIONS
        )
        assert {node.machine.version for node in nodes} == {max(implemented)}, group
    assert max(shard_versions.IMPLEMENTED_VERSIONS) >= 3
    clients, figures = result.clients, result.figures
    assert clients["cancel_alls_accepted"] >= 5 and clients["cancel_alls_listing_orders"] >= 3
    # Every answer a client had was judged (and copies the client never heard of).
    assert figures["cancel_alls_checked"] >= clients["cancel_alls_accepted"]
    assert figures["cancel_all_orders_listed"] >= 10
    assert figures["cancel_all_already_cancelling"] >= 1  # a retry, or an earlier cancel
    assert figures["cancelled_order_ends_checked"] >= figures["cancel_all_orders_listed"]
    assert figures["cancelled_orders_checked"] >= figures["cancel_all_orders_listed"] // 2
    assert figures["gateway_refused_UNKNOWN_SYMBOL"] >= 1


# --- the check itself, on egress written by hand ------------------------------------------


def _check() -> CancelAllCheck:
    """User 7 with three live orders: two of BTC-USDT (the second being cancelled
    already), one of ETH-USDT."""
    check = CancelAllCheck()
    placed: list[tuple[int, int, list[Any]]] = [
        (1, 0, [_update("s1:7:1", "BTC-USDT", PENDING)]),
        (2, 0, [_update("s1:7:2", "BTC-USDT", PENDING), _update("s1:7:3", "ETH-USDT", PENDING)]),
        (3, 0, [_update("s1:7:2", "BTC-USDT", OPEN), CancelToMatcher("g1", "s1:7:2", 7)]),
    ]
    assert check.follow("s1", placed) == []
    return check


def _update(order_id: str, symbol: str, status: int) -> OrderUpdate:
    return OrderUpdate(7, order_id, "c", symbol, status, 0, 1)


def _answer(correlation: int, listed: tuple[str, ...], already: int) -> list[Any]:
    cancels: list[Any] = [CancelToMatcher("g1", order_id, 7) for order_id in listed]
    return [
        *cancels,
        ShardResult(correlation, True, cancelled_order_ids=listed, already_cancelling=already),
    ]


def _kinds(problems: list[tuple[str, str]]) -> list[str]:
    return [kind for kind, _ in problems]


def test_an_answer_covering_the_live_orders_of_its_symbol_passes() -> None:
    check = _check()
    check.expect(50, 7, "BTC-USDT")
    check.expect(51, 7, "")
    assert check.follow("s1", [(4, 0, _answer(50, ("s1:7:1",), 1))]) == []
    # Every symbol's, later: the two BTC-USDT orders are being cancelled now.
    assert check.follow("s1", [(5, 0, _answer(51, ("s1:7:3",), 2))]) == []
    ends = [
        _update("s1:7:1", "BTC-USDT", REJECTED),  # the matcher refused it, still PENDING
        _update("s1:7:2", "BTC-USDT", CANCELLED),
        _update("s1:7:3", "ETH-USDT", FILLED),  # a fill got there first
    ]
    assert check.follow("s1", [(6, 0, ends)]) == []
    assert check.left_live() == []
    assert (check.judged, check.listed, check.already_cancelling) == (2, 2, 3)
    assert (check.cancel_ends, check.rejected_first) == (3, 1)


def test_an_answer_leaving_a_live_order_out_is_found() -> None:
    check = _check()
    check.expect(50, 7, "")
    problems = check.follow("s1", [(4, 0, _answer(50, ("s1:7:1",), 1))])
    assert _kinds(problems) == [CANCEL_ALL] and "neither listed" in problems[0][1], problems


def test_an_answer_listing_another_symbols_order_is_found() -> None:
    check = _check()
    check.expect(50, 7, "BTC-USDT")
    problems = check.follow("s1", [(4, 0, _answer(50, ("s1:7:1", "s1:7:3"), 1))])
    assert _kinds(problems) == [CANCEL_ALL] and "of ETH-USDT" in problems[0][1], problems


def test_a_wrong_count_of_orders_already_cancelling_is_found() -> None:
    check = _check()
    check.expect(50, 7, "BTC-USDT")
    problems = check.follow("s1", [(4, 0, _answer(50, ("s1:7:1",), 0))])
    assert _kinds(problems) == [CANCEL_ALL] and "already cancelling" in problems[0][1], problems


def test_an_answer_listing_cancels_its_entry_did_not_send_is_found() -> None:
    check = _check()
    check.expect(50, 7, "BTC-USDT")
    answer = ShardResult(50, True, cancelled_order_ids=("s1:7:1",), already_cancelling=1)
    problems = check.follow("s1", [(4, 0, [answer])])
    assert _kinds(problems) == [CANCEL_ALL] and "sent cancels" in problems[0][1], problems


def test_a_cancelled_order_that_rested_then_ended_otherwise_is_found() -> None:
    check = _check()
    # s1:7:2 rested (OPEN) and was being cancelled: REJECTED is no end for it; nor is
    # EXPIRED for s1:7:1 once cancelled.
    entry = [CancelToMatcher("g1", "s1:7:1", 7), _update("s1:7:1", "BTC-USDT", EXPIRED)]
    rejected = [_update("s1:7:2", "BTC-USDT", REJECTED)]
    problems = check.follow("s1", [(4, 0, entry), (5, 0, rejected)])
    assert _kinds(problems) == [CANCEL_OUTCOME, CANCEL_OUTCOME], problems


def test_what_is_read_again_is_skipped_and_an_order_never_ended_is_found() -> None:
    check = _check()
    check.expect(50, 7, "")
    # A persister back at its stored cursor reads position 3 again: nothing changes.
    again = [(3, 0, [CancelToMatcher("g1", "s1:7:2", 7)])]
    assert check.follow("s1", again) == []
    assert check.follow("s1", [(4, 0, _answer(50, ("s1:7:1", "s1:7:3"), 1))]) == []
    assert check.follow("s1", [(5, 0, [_update("s1:7:1", "BTC-USDT", CANCELLED)])]) == []
    left = check.left_live()
    assert len(left) == 1 and "s1:7:2" in left[0] and "s1:7:3" in left[0], left
