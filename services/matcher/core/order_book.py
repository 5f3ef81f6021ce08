"""Price-time priority books: a dict of price levels per side and their sorted keys.

Each side keeps `keys`, its level prices sorted so that the best level is the
LAST key (bids: key = price, asks: key = -price). Reading the best level is
O(1); a new level costs a bisect plus a short memmove, as new levels mostly
open near the top of the book, i.e. near the end of the list.

A level is a FIFO (`deque`) of records in arrival order. Cancelling from the
middle is O(1) by lazy deletion: the record leaves the live count at once, and
its dead entry is dropped when it reaches the front or when the level is
compacted. `live_count` counts the live records; a level with none is removed.
`total_lots` is the sum of the live records' `remaining_lots`: kept exact wherever a
record rests, leaves, or (`matching`) trades as maker. Both are derived state: not in
the snapshot nor the state hash; a restore rebuilds them by resting the live orders.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator

from services.matcher.core.errors import MatcherInvariantError
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import LAST_LIVE

# Compact a level once its dead entries outnumber the live ones by this much.
_COMPACT_SLACK = 32


class PriceLevel:
    __slots__ = ("live_count", "orders", "price_ticks", "total_lots")

    def __init__(self, price_ticks: int) -> None:
        self.price_ticks = price_ticks
        self.orders: deque[OrderRecord] = deque()
        self.live_count = 0
        self.total_lots = 0  # the live records' remaining lots

    def live_orders(self) -> Iterator[OrderRecord]:
        """The live records in time priority."""
        return (order for order in self.orders if order.status <= LAST_LIVE)


class BookSide:
    __slots__ = ("is_bid", "keys", "levels")

    def __init__(self, is_bid: bool) -> None:
        self.is_bid = is_bid
        self.levels: dict[int, PriceLevel] = {}
        self.keys: list[int] = []  # sorted ascending, best level last

    def best_price(self) -> int | None:
        keys = self.keys
        if not keys:
            return None
        key = keys[-1]
        return key if self.is_bid else -key

    def rest(self, order: OrderRecord) -> None:
        """Append a live record at the back of its price level."""
        price = order.price_ticks
        level = self.levels.get(price)
        if level is None:
            level = PriceLevel(price)
            self.levels[price] = level
            insort(self.keys, price if self.is_bid else -price)
        level.orders.append(order)
        level.live_count += 1
        level.total_lots += order.remaining_lots

    def withdraw(self, order: OrderRecord) -> None:
        """Take out a record that just stopped being live (its status already moved on)."""
        level = self.levels.get(order.price_ticks)
        if level is None or level.live_count <= 0:
            raise MatcherInvariantError(f"order {order.order_id} is not in the book it names")
        level.live_count -= 1
        level.total_lots -= order.remaining_lots
        if level.live_count == 0:
            self.remove_level(level)
        elif len(level.orders) > 2 * level.live_count + _COMPACT_SLACK:
            level.orders = deque(level.live_orders())

    def remove_level(self, level: PriceLevel) -> None:
        price = level.price_ticks
        key = price if self.is_bid else -price
        keys = self.keys
        if keys[-1] == key:
            keys.pop()
        else:
            index = bisect_left(keys, key)
            if index == len(keys) or keys[index] != key:
                raise MatcherInvariantError(f"price level {price} has no sort key")
            del keys[index]
        del self.levels[price]

    def levels_best_first(self) -> Iterator[PriceLevel]:
        levels = self.levels
        sign = 1 if self.is_bid else -1
        for key in reversed(self.keys):
            yield levels[sign * key]

    def check_aggregates(self) -> None:
        """Each level's `live_count` and `total_lots` against its records (tests, restores)."""
        for price, level in self.levels.items():
            live = list(level.live_orders())
            if (
                level.price_ticks != price
                or not live
                or level.live_count != len(live)
                or level.total_lots != sum(order.remaining_lots for order in live)
            ):
                raise MatcherInvariantError(f"price level {price} disagrees with its orders")
        if len(self.keys) != len(self.levels):
            raise MatcherInvariantError("a book side's sort keys and levels disagree")

    def live_orders(self) -> Iterator[OrderRecord]:
        """Every live record of this side in priority order: best level first, FIFO within."""
        for level in self.levels_best_first():
            yield from level.live_orders()
