"""The simulation's check of the matchers' market-data feed (`simulation/core/feed_check.py`)
on a real `MatcherMachine` under the real `Replica`: an honest feed passes record after
record, from the switch to version 2 on, over a book that was there before the switch and
across a restore; and each way of breaking one record's feed is named. In the whole
simulated mesh, `test_planted_defects.py` plants `feed-omits-removed-levels`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from protos.oms.v1 import matcher_pb2
from services.matcher.core import MatcherEgress, MatcherMachine
from services.matcher.core.market_feed import BookUpdate, LevelChange, MarketRecord, PublicTrade
from services.runtime.core.log_batch import LogBatch, encode_version
from services.runtime.core.replica import Replica
from services.runtime.core.state_machine import EntryKind
from simulation.core.feed_check import MarketFeedCheck
from tests.matcher.support import BUY, SELL, batch_bytes, cancel, limit, settings

AAA = "AAA-USD"
BBB = "BBB-USD"
COMMAND = int(EntryKind.COMMAND)
VERSION = int(EntryKind.VERSION)

Market = tuple[MarketRecord, ...]


class CheckedReplica:
    """A matcher replica as the simulation runs one: every record checked after it."""

    def __init__(self) -> None:
        self.machine = MatcherMachine(settings())
        self.replica: Replica[MatcherEgress] = Replica(self.machine, 16)
        self.check = MarketFeedCheck()
        self.check.start(self.machine)
        self.now = 1_000

    def record(
        self,
        *entries: list[matcher_pb2.MatcherCommand] | int,
        corrupt: Callable[[Market], Market] | None = None,
    ) -> str | None:
        """Apply one record (a list of commands is a COMMAND entry, an int a VERSION
        entry), with its feed changed by `corrupt`, and check it."""
        self.now += 1
        batch = LogBatch(
            self.replica.applied_position + 1,
            self.now,
            [
                (VERSION, encode_version(entry))
                if isinstance(entry, int)
                else (COMMAND, batch_bytes(entry))
                for entry in entries
            ],
        )
        self.check.before_record(self.machine, batch)
        outputs: list[Sequence[Any]] = self.replica.apply_batch(batch)
        if corrupt is not None:
            outputs = [
                tuple(
                    dataclasses.replace(egress, market=corrupt(egress.market)) for egress in items
                )
                for items in outputs
            ]
        return self.check.after_record(self.machine, batch, outputs)

    def restore_from_itself(self) -> None:
        """A restart from a snapshot of the state now (a fresh machine, a fresh check)."""
        snapshot = self.machine.snapshot()
        position, time_ms = self.replica.applied_position, self.replica.consensus_time_ms
        self.machine = MatcherMachine(settings())
        self.replica = Replica(self.machine, 16)
        self.replica.restore(snapshot, position, time_ms)
        self.check = MarketFeedCheck()
        self.check.start(self.machine)


def trading_replica() -> CheckedReplica:
    """Resting orders on both sides of AAA under version 1, then the switch to 2."""
    node = CheckedReplica()
    assert node.record([limit("s1:1:1", 1, SELL, 102, 4), limit("s1:2:1", 2, BUY, 98, 2)]) is None
    assert node.check.views is None  # version 1: no feed to check
    assert (
        node.record(
            2,
            [
                limit("s1:1:2", 1, SELL, 101, 5),
                limit("s1:2:2", 2, BUY, 99, 2),
                limit("s1:3:1", 3, SELL, 101, 1),
            ],
        )
        is None
    )
    return node


def test_an_honest_feed_passes_from_the_switch_on_and_after_a_restore() -> None:
    node = trading_replica()
    # One taker through two makers at 101 and into 102; a cancel removes a level.
    assert node.record([limit("s1:4:1", 4, BUY, 102, 8), cancel("s1:2:1", 2)]) is None
    assert node.record([limit("s1:5:1", 5, SELL, 50, 3, symbol=BBB)]) is None
    assert node.check.trades == 3 and node.check.book_updates == 3
    node.restore_from_itself()  # the check starts again from the machine's feed
    views = node.check.views
    assert views is not None and (views[AAA].book_sequence, views[AAA].trade_sequence) == (2, 3)
    assert (
        node.record([limit("s1:6:1", 6, BUY, 102, 1), limit("s1:7:1", 7, BUY, 51, 1, symbol=BBB)])
        is None
    )
    assert node.record([limit("s1:8:1", 8, BUY, 50, 3, symbol=BBB)]) is None
    assert node.check.trades == 3 and node.check.book_updates == 3
    assert node.check.books_compared == 3


def test_a_switch_after_commands_in_its_record_starts_the_check_after_the_record() -> None:
    """Entries decided at version 1 before the switch in one record: the book at the switch
    is not known from outside, so the check starts from the machine after the record."""
    node = CheckedReplica()
    assert node.record([limit("s1:1:1", 1, SELL, 102, 4)], 2) is None
    views = node.check.views
    assert views is not None and views[AAA].asks == {102: (4, 1)}
    assert node.record([limit("s1:2:1", 2, BUY, 102, 1)]) is None
    assert node.check.trades == 1 and node.check.book_updates == 1


def _updates(change: Callable[[BookUpdate], BookUpdate]) -> Callable[[Market], Market]:
    def corrupt(market: Market) -> Market:
        return tuple(change(r) if isinstance(r, BookUpdate) else r for r in market)

    return corrupt


def _sequence_skipped(update: BookUpdate) -> BookUpdate:
    return update._replace(book_sequence=update.book_sequence + 1)


def _removals_left_out(update: BookUpdate) -> BookUpdate:
    return update._replace(levels=tuple(level for level in update.levels if level.total_lots))


def _lots_changed(update: BookUpdate) -> BookUpdate:
    return update._replace(
        levels=tuple(
            level._replace(total_lots=level.total_lots + 1) if level.total_lots else level
            for level in update.levels
        )
    )


def _crossing_bid_added(update: BookUpdate) -> BookUpdate:
    return update._replace(levels=(LevelChange(BUY, 110, 1, 1), *update.levels))


def _update_repeated(market: Market) -> Market:
    return market + tuple(r for r in market if isinstance(r, BookUpdate))


def _trade_repeated(market: Market) -> Market:
    trades = [r for r in market if isinstance(r, PublicTrade)]
    return (trades[0], *market)


def _trade_dropped(market: Market) -> Market:
    trades = [r for r in market if isinstance(r, PublicTrade)]
    last = trades[-1]
    return tuple(r for r in market if r is not last)


def _trade_price_changed(market: Market) -> Market:
    return tuple(
        r._replace(price_ticks=r.price_ticks + 1) if isinstance(r, PublicTrade) else r
        for r in market
    )


def _update_dropped(market: Market) -> Market:
    return tuple(r for r in market if not isinstance(r, BookUpdate))


@pytest.mark.parametrize(
    ("corrupt", "found"),
    [
        (_updates(_sequence_skipped), "book_sequence 3: after 1"),
        (_update_repeated, "two book updates in one entry"),
        (_updates(_removals_left_out), "AAA-USD bids from the feed [(99, 2, 1), (98, 2, 1)]"),
        (_updates(_lots_changed), "AAA-USD asks from the feed [(102, 3, 1)]"),
        (_updates(_crossing_bid_added), "crossed from the feed: best bid 110, best ask 102"),
        (_trade_repeated, "trade_sequence 1 after 1"),
        (_trade_dropped, "are not the taker fills"),
        (_trade_price_changed, "are not the taker fills"),
        (_update_dropped, "the engine is at book/trade sequences 2/3, its feed said 1/3"),
    ],
)
def test_a_broken_record_of_the_feed_is_named(
    corrupt: Callable[[Market], Market], found: str
) -> None:
    node = trading_replica()
    problem = node.record([limit("s1:4:1", 4, BUY, 102, 8), cancel("s1:2:1", 2)], corrupt=corrupt)
    assert problem is not None and found in problem, problem


def test_an_update_that_removes_a_level_it_never_had_is_named() -> None:
    node = trading_replica()
    phantom = _updates(
        lambda update: update._replace(levels=(*update.levels, LevelChange(SELL, 105, 0, 0)))
    )
    problem = node.record([cancel("s1:2:1", 2)], corrupt=phantom)
    assert problem is not None and "removes level 2/105, which it never had" in problem
