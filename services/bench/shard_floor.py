"""The floor under `oms bench shard`: the least Python any shard must run per command.

Not a shard. `ShardFloor` applies the benchmark's own workload (the same decoded
commands, the same resident users) doing only what the issue's rules cannot do
without, each in its cheapest plain-Python form:

- place: find the resident actor and touch its recency (one `OrderedDict` move),
  two Bloom filter positions from one stable CRC-32 (cheaper than the shard's
  blake2b, weaker too), a token-bucket refill, the positive-size and funds checks,
  the exact debit of a limit order, the reservation, the deterministic order id,
  the order in the user's index and the shard's, the Bloom insert and the recent
  id, and three egress tuples (submit, acknowledgement, order update);
- deposit: touch, transfer-id dedup, credit against a clearing account, two tuples;
- cancel: touch, find the user's order, two tuples;
- matcher events: per-group sequence dedup, find the order, touch; a fill moves
  the reservation into the trade (clearing and fee accounts), the average cost
  or realized P&L of the position, and releases the rest when the order is done;
  a cancel releases the reservation; one or two tuples each.

What it leaves out, which the shard does: the double-entry ledger as such, the
per-order saga records and in-flight counts, market orders and their debits, risk
limits and marks, supervision, counters, egress as typed records, the dedup
window's rotation and parked DB lookups, hydration and eviction bookkeeping, and
the incremental state digest. Its rate is a yardstick rather than a proven
limit: a Python shard doing all of that should not expect to pass it, and the
gap between the two says how much the shard's own structure costs.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from services.shard.core.commands import (
    CancelOrder,
    Command,
    Deposit,
    MatcherEvent,
    MatcherEvents,
    PlaceOrder,
)
from services.shard.core.settings import SymbolSettings
from services.shard.core.vocabulary import BUY, PPM, EventKind

_ACCEPTED = int(EventKind.ACCEPTED)
_FILL = int(EventKind.FILL)
_CANCELLED = int(EventKind.CANCELLED)
_BLOOM_MASK = (1 << 26) - 1
_TOKEN_MILLIS = 1_000
_BURST_MILLIS = 1_000 * _TOKEN_MILLIS


class FloorActor:
    __slots__ = (
        "average_cost",
        "balances",
        "last_active_ms",
        "open_orders",
        "position",
        "realized_pnl",
        "recent_ids",
        "reserved",
        "token_ms",
        "tokens",
        "transfers",
        "user_id",
        "user_seq",
    )

    def __init__(self, user_id: int, balances: dict[str, int]) -> None:
        self.user_id = user_id
        self.balances = balances
        self.reserved: dict[str, int] = {}
        self.open_orders: dict[str, FloorOrder] = {}
        self.recent_ids: dict[str, tuple[str, int]] = {}
        self.transfers: dict[str, int] = {}
        self.user_seq = 0
        self.tokens = _BURST_MILLIS
        self.token_ms = 0
        self.position = 0
        self.average_cost = 0
        self.realized_pnl = 0
        self.last_active_ms = 0


class FloorOrder:
    __slots__ = ("actor", "asset", "is_buy", "order_id", "remaining_lots", "reserved", "status")

    # Positional, as the floor builds one per order on its hot path.
    def __init__(  # noqa: PLR0917
        self, order_id: str, actor: FloorActor, is_buy: bool, asset: str, reserved: int, lots: int
    ) -> None:
        self.order_id = order_id
        self.actor = actor
        self.is_buy = is_buy
        self.asset = asset
        self.reserved = reserved
        self.remaining_lots = lots
        self.status = 0


class ShardFloor:
    def __init__(self, shard_id: str, symbol: SymbolSettings) -> None:
        self.shard_id = shard_id
        self.symbol = symbol
        self.actors: OrderedDict[int, FloorActor] = OrderedDict()
        self.orders: dict[str, FloorOrder] = {}
        self.bloom = bytearray((_BLOOM_MASK + 1) // 8)
        self.matcher_sequences: dict[str, int] = {}
        self.clearing: dict[str, int] = {}
        self.fees: dict[str, int] = {}
        self._handlers: dict[type, Callable[[Any, int, list[tuple[object, ...]]], None]] = {
            PlaceOrder: self.place,
            Deposit: self.deposit,
            CancelOrder: self.cancel,
            MatcherEvents: self.matcher_events,
        }

    def add_users(self, first_user: int, count: int, balances: Sequence[tuple[str, int]]) -> None:
        for user_id in range(first_user, first_user + count):
            self.actors[user_id] = FloorActor(user_id, dict(balances))

    def apply_commands(self, commands: Sequence[Command], now_ms: int) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        handlers = self._handlers
        for command in commands:
            handlers[type(command)](command, now_ms, out)
        return out

    def _touch(self, user_id: int, now_ms: int) -> FloorActor:
        actor = self.actors[user_id]
        self.actors.move_to_end(user_id)
        actor.last_active_ms = now_ms
        return actor

    def place(self, command: PlaceOrder, now_ms: int, out: list[tuple[object, ...]]) -> None:
        actor = self._touch(command.user_id, now_ms)
        client_order_id = command.client_order_id
        hashed = zlib.crc32(client_order_id.encode(), command.user_id)
        first, second = hashed & _BLOOM_MASK, (hashed >> 6) & _BLOOM_MASK
        bloom = self.bloom
        if (
            bloom[first >> 3] & (1 << (first & 7))
            and bloom[second >> 3] & (1 << (second & 7))
            and client_order_id in actor.recent_ids
        ):
            out.append(("duplicate", command.correlation_id))
            return
        tokens = min(_BURST_MILLIS, actor.tokens + (now_ms - actor.token_ms) * _TOKEN_MILLIS)
        lots = command.quantity_lots
        if tokens < _TOKEN_MILLIS or lots <= 0 or command.price_ticks <= 0:
            out.append(("refused", command.correlation_id))
            return
        symbol = self.symbol
        is_buy = command.side == BUY
        if is_buy:
            notional = command.price_ticks * lots * symbol.tick_size
            asset = symbol.quote_asset
            amount = notional + notional * symbol.taker_fee_ppm // PPM
        else:
            asset = symbol.base_asset
            amount = lots * symbol.lot_size
        reserved = actor.reserved
        if actor.balances.get(asset, 0) - reserved.get(asset, 0) < amount:
            out.append(("refused", command.correlation_id))
            return
        actor.tokens = tokens - _TOKEN_MILLIS
        actor.token_ms = now_ms
        actor.user_seq += 1
        order_id = f"{self.shard_id}:{command.user_id}:{actor.user_seq}"
        reserved[asset] = reserved.get(asset, 0) + amount
        order = FloorOrder(order_id, actor, is_buy, asset, amount, lots)
        actor.open_orders[order_id] = order
        self.orders[order_id] = order
        bloom[first >> 3] |= 1 << (first & 7)
        bloom[second >> 3] |= 1 << (second & 7)
        actor.recent_ids[client_order_id] = (order_id, now_ms)
        out.append(("submit", order_id, command))
        out.append(("acknowledged", command.correlation_id, order_id))
        out.append(("order", command.user_id, order_id, 0))

    def deposit(self, command: Deposit, now_ms: int, out: list[tuple[object, ...]]) -> None:
        actor = self._touch(command.user_id, now_ms)
        if command.transfer_id in actor.transfers or command.amount <= 0:
            out.append(("refused", command.correlation_id))
            return
        actor.transfers[command.transfer_id] = now_ms
        asset = command.asset
        balance = actor.balances.get(asset, 0) + command.amount
        actor.balances[asset] = balance
        self.clearing[asset] = self.clearing.get(asset, 0) - command.amount
        out.append(("acknowledged", command.correlation_id))
        out.append(("balance", command.user_id, asset, balance))

    def cancel(self, command: CancelOrder, now_ms: int, out: list[tuple[object, ...]]) -> None:
        actor = self._touch(command.user_id, now_ms)
        if command.order_id not in actor.open_orders:
            out.append(("not found", command.correlation_id))
            return
        out.append(("cancel", command.order_id))
        out.append(("acknowledged", command.correlation_id))

    def matcher_events(
        self, command: MatcherEvents, now_ms: int, out: list[tuple[object, ...]]
    ) -> None:
        group = command.matcher_group
        sequences = self.matcher_sequences
        for event in command.events:
            if event.sequence <= sequences.get(group, 0):
                continue
            sequences[group] = event.sequence
            order = self.orders.get(event.order_id)
            if order is None:
                continue
            actor = self._touch(order.actor.user_id, now_ms)
            kind = event.kind
            if kind == _ACCEPTED:
                order.status = _ACCEPTED
                out.append(("order", actor.user_id, order.order_id, kind))
            elif kind == _FILL:
                self._fill(actor, order, event, out)
            elif kind == _CANCELLED:
                self._close(actor, order)
                out.append(("order", actor.user_id, order.order_id, kind))

    def _fill(
        self,
        actor: FloorActor,
        order: FloorOrder,
        event: MatcherEvent,
        out: list[tuple[object, ...]],
    ) -> None:
        symbol = self.symbol
        base = event.quantity_lots * symbol.lot_size
        notional = event.notional
        fee = event.fee
        balances = actor.balances
        clearing = self.clearing
        quote_asset = symbol.quote_asset
        base_asset = symbol.base_asset
        if order.is_buy:
            spent = notional + fee
            order.reserved -= spent
            actor.reserved[quote_asset] -= spent
            balances[quote_asset] -= spent
            balances[base_asset] = balances.get(base_asset, 0) + base
            clearing[quote_asset] = clearing.get(quote_asset, 0) + notional
            clearing[base_asset] = clearing.get(base_asset, 0) - base
            actor.average_cost += notional
            actor.position += base
        else:
            order.reserved -= base
            actor.reserved[base_asset] -= base
            balances[base_asset] -= base
            balances[quote_asset] = balances.get(quote_asset, 0) + notional - fee
            clearing[base_asset] = clearing.get(base_asset, 0) + base
            clearing[quote_asset] = clearing.get(quote_asset, 0) - notional
            if actor.position > 0:
                cost = actor.average_cost * base // actor.position
                actor.realized_pnl += notional - cost
                actor.average_cost -= cost
            actor.position -= base
        self.fees[quote_asset] = self.fees.get(quote_asset, 0) + fee
        order.remaining_lots -= event.quantity_lots
        if event.order_done:
            self._close(actor, order)
        out.append(("fill", actor.user_id, order.order_id, event.quantity_lots, event.price_ticks))
        out.append(("persist", actor.user_id, order.order_id, event.trade_id))

    def _close(self, actor: FloorActor, order: FloorOrder) -> None:
        if order.reserved:
            actor.reserved[order.asset] -= order.reserved
            order.reserved = 0
        del actor.open_orders[order.order_id]
        del self.orders[order.order_id]

    def totals(self) -> dict[str, int]:
        """Per asset: every balance plus the clearing and fee accounts (constant)."""
        totals: dict[str, int] = {}
        for actor in self.actors.values():
            for asset, amount in actor.balances.items():
                totals[asset] = totals.get(asset, 0) + amount
        for account in (self.clearing, self.fees):
            for asset, amount in account.items():
                totals[asset] = totals.get(asset, 0) + amount
        return totals


def floor_seconds(floor: ShardFloor, groups: Sequence[Sequence[Command]], now_ms: int) -> float:
    """Apply `groups` (one per log entry) and return the seconds it took."""
    started = time.perf_counter()
    for index, group in enumerate(groups):
        floor.apply_commands(group, now_ms + index)
    return time.perf_counter() - started
