"""Pre-trade risk checks on a user actor: admission limits, equity, drawdown.

Everything is an integer in quote minor units or lots. Limits of 0 mean "no
limit". Checks that need a mark price (band, market-order size) are skipped
while the symbol has none: the matcher's own band still applies.
"""

from __future__ import annotations

from services.shard.core.actor import UserActor
from services.shard.core.commands import PlaceOrder
from services.shard.core.risk import NO_LIMITS, estimated_lots
from services.shard.core.settings import SymbolSettings
from services.shard.core.vocabulary import BPS, BUY, LIMIT, MARKET, RejectReason


def admission_reason(
    actor: UserActor, symbol: SymbolSettings, command: PlaceOrder, notional: int, mark: int
) -> int:
    """The first risk limit the order breaks (a RejectReason), or 0."""
    side = command.side
    order_type = command.order_type
    quantity_lots = command.quantity_lots
    quote_amount = command.quote_amount
    limits = actor.limits
    is_buy = side == BUY
    position = actor.positions.get(symbol.symbol)
    held = position.quantity_lots if position is not None else 0
    lots = estimated_lots(order_type, quantity_lots, quote_amount, mark, symbol.tick_size)
    if actor.reduce_only:
        # Only an order that cannot grow |position| passes: opposite side, within it.
        reducing = held < 0 if is_buy else held > 0
        if not reducing or lots < 0 or lots > abs(held):
            return RejectReason.REDUCE_ONLY
    if limits is NO_LIMITS:
        return 0
    if limits.max_open_orders and len(actor.orders) >= limits.max_open_orders:
        return RejectReason.RISK_MAX_OPEN_ORDERS
    if (
        limits.price_band_bps
        and order_type == LIMIT
        and mark > 0
        and abs(command.price_ticks - mark) * BPS > mark * limits.price_band_bps
    ):
        return RejectReason.RISK_PRICE_BAND
    if limits.max_order_notional:
        value = notional
        if order_type == MARKET and not quote_amount:
            value = quantity_lots * mark * symbol.tick_size  # 0 without a mark
        if value > limits.max_order_notional:
            return RejectReason.RISK_MAX_ORDER_NOTIONAL
    if limits.max_position_lots and lots >= 0:
        # Worst case: every live order on this side fills, then this one.
        pending = 0
        for order in actor.orders.values():
            if order.symbol == symbol.symbol and (order.side == BUY) == is_buy:
                pending += order.remaining_lots
        projected = held + pending + lots if is_buy else held - pending - lots
        if abs(projected) > limits.max_position_lots:
            return RejectReason.RISK_MAX_POSITION
    return 0


def equity(actor: UserActor, marks: dict[str, int], symbols: dict[str, SymbolSettings]) -> int:
    """Realized plus unrealized P&L over the symbols quoted in the settlement asset."""
    total = 0
    for name, position in actor.positions.items():
        symbol = symbols.get(name)
        if symbol is None:
            continue
        total += position.realized_pnl + position.unrealized_pnl(
            marks.get(name, 0), symbol.tick_size
        )
    return total


def drawdown_breached(actor: UserActor, current_equity: int) -> bool:
    """Raise the peak; True the first time equity falls more than max_drawdown below it."""
    if current_equity > actor.peak_equity:
        actor.peak_equity = current_equity
        return False
    limit = actor.limits.max_drawdown
    return bool(limit) and not actor.reduce_only and actor.peak_equity - current_equity > limit
