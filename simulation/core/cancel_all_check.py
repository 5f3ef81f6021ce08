"""What a trader expects of a cancel-all, checked against each shard's durable egress.

`CancelAllOrders` is decided in one shard log entry (`OrderSaga.cancel_all`, shard
state-machine version 3) and answered by a `CancelAllAck` stamped with that entry's
position. A trader who reads its order updates in log order expects:

- the answer covers exactly the user's live orders of the symbol asked for (every
  symbol's when none was) at that position: each is listed in `cancelled_order_ids`
  or counted in `already_cancelling`, nothing else is listed, and the count is the
  number of those whose cancel was on its way before;
- a listed order's cancel is sent by that very entry, just before its answer, in the
  order the orders were placed, and an order already being cancelled is not listed;
- every order whose cancel was sent (by `CancelOrder` or by a cancel-all) ends
  CANCELLED or FILLED (a fill got there first), or REJECTED if it never rested: the
  matcher refused the order itself (e.g. below the minimum notional) before the
  cancel reached it, while the order was still PENDING; none rests for ever: once the
  mesh has settled, every order the egress opened has its final update. (EXPIRED is
  a GTD order's, and the clients place none.)

The live orders are kept from the egress alone, as the persister and the gateway's
order-update feed read it: an order is live from its first `OrderUpdate` (PENDING, at
admission) to its final one, and being cancelled from its first `CancelToMatcher`.
A `CancelAllOrders` command's own egress is its `CancelToMatcher`s followed by its
`ShardResult`, so the listed orders are those cancels. Which results answer a
cancel-all the gateway says (`expect`, by correlation id, with the symbol the client
asked for, not the one the command carried). Pure: it reads egress the persister has
written and consumes no randomness, so it changes no seed's trajectory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from services.shard.core.egress import CancelToMatcher, OrderUpdate, ShardResult
from services.shard.core.vocabulary import CANCELLED, EXPIRED, FILLED, PENDING, REJECTED

FINAL: Final = frozenset({FILLED, CANCELLED, EXPIRED, REJECTED})
# How an order whose owner cancelled it may end: cancelled, or filled first (or
# rejected by the matcher, if it never rested).
CANCEL_ENDS: Final = frozenset({CANCELLED, FILLED})

# The violations' kinds.
CANCEL_ALL = "cancel-all"
CANCEL_OUTCOME = "cancel-outcome"

# One shard's durable egress: (position, consensus time ms, items), in log order.
EgressEntries = Sequence[tuple[int, int, Sequence[Any]]]


class LiveOrder:
    """One live order as the egress told it."""

    __slots__ = ("cancel_at", "rested", "symbol")

    def __init__(self, symbol: str) -> None:
        self.symbol = symbol
        self.cancel_at: tuple[int, int] | None = None  # its first cancel's (position, index)
        self.rested = False  # the matcher took it (OPEN or PARTIALLY_FILLED was told)


class ShardView:
    """One shard's egress as read so far: each user's live orders."""

    __slots__ = ("live", "through")

    def __init__(self) -> None:
        self.through = 0  # the last position read
        self.live: dict[int, dict[str, LiveOrder]] = {}


class CancelAllCheck:
    """The cancel-alls of a run, judged as the egress that answered them is written."""

    __slots__ = (
        "already_cancelling",
        "cancel_ends",
        "expected",
        "judged",
        "listed",
        "refused",
        "rejected_first",
        "views",
    )

    def __init__(self) -> None:
        self.expected: dict[int, tuple[int, str]] = {}  # correlation -> (user, symbol asked)
        self.views: dict[str, ShardView] = {}
        self.judged = 0  # accepted answers checked
        self.refused = 0  # answers refusing a cancel-all (the shard's reasons)
        self.listed = 0
        self.already_cancelling = 0
        self.cancel_ends = 0  # ends of orders with a cancel sent, checked
        self.rejected_first = 0  # ... of which the matcher had refused the order itself

    def expect(self, correlation_id: int, user_id: int, symbol: str) -> None:
        """The gateway sent a cancel-all under `correlation_id`."""
        self.expected[correlation_id] = (user_id, symbol)

    def follow(self, shard: str, entries: EgressEntries) -> list[tuple[str, str]]:
        """The shard's egress at the positions after the last read: what it broke, as
        (violation kind, detail): `cancel-all` for an answer, `cancel-outcome` for the
        end of an order being cancelled."""
        view = self.views.get(shard)
        if view is None:
            view = self.views[shard] = ShardView()
        problems: list[tuple[str, str]] = []
        live = view.live
        for position, _, items in entries:
            if position <= view.through:
                continue  # read again (a persister that went back to its stored cursor)
            view.through = position
            for index, item in enumerate(items):
                kind = type(item)
                if kind is OrderUpdate:
                    problem, found = self._update(live, item), CANCEL_OUTCOME
                elif kind is CancelToMatcher:
                    problem, found = _cancel(live, item, position, index), CANCEL_ALL
                elif kind is ShardResult and not item.parked:
                    if item.correlation_id not in self.expected:
                        continue
                    problem, found = self._answer(live, items, index, position), CANCEL_ALL
                else:
                    continue
                if problem is not None:
                    problems.append((found, f"{shard} position {position}: {problem}"))
        return problems

    def left_live(self) -> list[str]:
        """After settling: orders whose end never came as an order update."""
        problems = []
        for shard, view in sorted(self.views.items()):
            for user_id, orders in sorted(view.live.items()):
                if orders:
                    problems.append(
                        f"{shard}: user {user_id}'s orders {sorted(orders)[:4]} never ended"
                        f" (cancel sent: {sorted(o for o, v in orders.items() if v.cancel_at)[:4]})"
                    )
        return problems

    def _update(self, live: dict[int, dict[str, LiveOrder]], update: OrderUpdate) -> str | None:
        user_id = update.user_id
        orders = live.get(user_id)
        if update.status not in FINAL:
            if orders is None:
                orders = live[user_id] = {}
            known = orders.get(update.order_id)
            if known is None:
                known = orders[update.order_id] = LiveOrder(update.symbol)
            if update.status != PENDING:
                known.rested = True
            return None
        order = orders.pop(update.order_id, None) if orders is not None else None
        if orders is not None and not orders:
            del live[user_id]
        if order is None or order.cancel_at is None:
            return None
        self.cancel_ends += 1
        if update.status == REJECTED and not order.rested:
            self.rejected_first += 1
            return None
        if update.status not in CANCEL_ENDS:
            return (
                f"order {update.order_id}, whose owner's cancel was sent at"
                f" {order.cancel_at[0]}, ended with status {update.status}"
            )
        return None

    def _answer(
        self,
        live: dict[int, dict[str, LiveOrder]],
        items: Sequence[Any],
        index: int,
        position: int,
    ) -> str | None:
        """The cancel-all answered by `items[index]`, against the live orders now (its
        own cancels, just before it, already marked)."""
        result: ShardResult = items[index]
        user_id, symbol = self.expected[result.correlation_id]
        what = f"user {user_id}'s cancel-all of {symbol or 'every symbol'}"
        if not result.accepted:
            self.refused += 1
            return None
        self.judged += 1
        listed = result.cancelled_order_ids
        count = len(listed)
        self.listed += count
        self.already_cancelling += result.already_cancelling
        sent = items[index - count : index] if count <= index else ()
        if tuple(_sent_by(sent, user_id)) != listed:
            return f"{what} lists {list(listed)[:4]}, its entry sent cancels {list(sent)[:4]}"
        orders = live.get(user_id, {})
        matching = {
            order_id: order
            for order_id, order in orders.items()
            if not symbol or order.symbol == symbol
        }
        first = index - count
        for offset, order_id in enumerate(listed):
            order = matching.get(order_id)
            if order is None:
                held = orders.get(order_id)
                was = f"of {held.symbol}" if held is not None else "not live"
                return f"{what} lists {order_id}, {was}"
            if order.cancel_at != (position, first + offset):
                return f"{what} lists {order_id}, its cancel on its way since {order.cancel_at}"
        uncovered = sorted(o for o, order in matching.items() if order.cancel_at is None)
        if uncovered:
            return f"{what} leaves live {uncovered[:4]} neither listed nor being cancelled"
        if result.already_cancelling != len(matching) - count:
            return (
                f"{what} counts {result.already_cancelling} already cancelling, there were"
                f" {len(matching) - count}"
            )
        sequences = [_user_seq(order_id) for order_id in listed]
        if sequences != sorted(sequences):
            return f"{what} lists {list(listed)[:4]} out of the order they were placed in"
        return None


def _cancel(
    live: dict[int, dict[str, LiveOrder]], cancel: CancelToMatcher, position: int, index: int
) -> str | None:
    order = live.get(cancel.user_id, {}).get(cancel.order_id)
    if order is None:
        return f"a cancel sent for {cancel.order_id}, not a live order of user {cancel.user_id}"
    if order.cancel_at is None:
        order.cancel_at = (position, index)
        return None
    return f"a second cancel sent for {cancel.order_id}, already being cancelled"


def _sent_by(items: Iterable[Any], user_id: int) -> Iterable[str]:
    for item in items:
        if type(item) is not CancelToMatcher or item.user_id != user_id:
            yield ""  # not one of this cancel-all's cancels
        else:
            yield item.order_id


def _user_seq(order_id: str) -> int:
    """The user's sequence in a shard's order id (`shard:user:sequence`)."""
    return int(order_id.rsplit(":", 1)[1])
