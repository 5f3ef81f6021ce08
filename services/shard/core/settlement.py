"""The credit-reservation saga, matcher side: answers, fills, ends.

Accepted -> OPEN. Rejected -> release the reservation, REJECTED. Fill -> settle
at the real price with double entry, update the position, PARTIALLY_FILLED or
(order_done) FILLED and release what is left. Cancelled / Expired -> release
what is left. Every money movement is computed and checked first and then
applied as plain integer updates that cannot fail halfway.

A fill, buyer side (quote Q, base B, notional N = price * lots * tick_size):
    user Q -(N + fee) out of the reservation; clearing Q +N; fees Q +fee;
    user B +lots*lot_size; clearing B -lots*lot_size.
Seller side:
    user B -lots*lot_size out of the reservation; clearing B +lots*lot_size;
    user Q +(N - fee); clearing Q -N; fees Q +fee.

An event for an order the user does not hold (an "orphan": only possible when
the two sides already disagree) is never dropped: a fill is still settled out
of the user's available funds when they cover it, everything is counted and
raised as a risk alert for the reconciler and operators.
"""

from __future__ import annotations

from services.shard.core.actor import UserActor
from services.shard.core.commands import MatcherEvent
from services.shard.core.egress import (
    ALERT_DRAWDOWN,
    ALERT_ORPHAN_EVENT,
    CLEARING_ACCOUNT,
    FEES_ACCOUNT,
    USER_ACCOUNT,
    Egress,
    FillRecord,
    LedgerPosting,
    LedgerRow,
    OrderUpdate,
    RiskAlert,
)
from services.shard.core.orders import OpenOrder, advance
from services.shard.core.reservations import available, consume, release
from services.shard.core.risk_checks import drawdown_breached, equity
from services.shard.core.settings import SymbolSettings
from services.shard.core.shard_state import ShardState
from services.shard.core.vocabulary import (
    BUY,
    CANCELLED,
    EXPIRED,
    FILLED,
    LIMIT,
    OPEN,
    PARTIALLY_FILLED,
    PENDING,
    REJECTED,
    SELL,
    EventKind,
)

_ACCEPTED = int(EventKind.ACCEPTED)
_REJECTED = int(EventKind.REJECTED)
_FILL = int(EventKind.FILL)
_CANCELLED = int(EventKind.CANCELLED)
_EXPIRED = int(EventKind.EXPIRED)
_KINDS = (_ACCEPTED, _REJECTED, _FILL, _CANCELLED, _EXPIRED)


class Settlement:
    def __init__(self, state: ShardState) -> None:
        self.state = state

    def apply(self, actor: UserActor, event: MatcherEvent, now_ms: int, out: list[Egress]) -> None:
        order = actor.orders.get(event.order_id)
        if order is None:
            self._orphan(actor, event, now_ms, out)
            return
        kind = event.kind
        state = self.state
        if kind == _FILL:
            self._fill(actor, order, event, now_ms, out)
            return
        if kind == _ACCEPTED:
            if order.status != PENDING:
                return  # already proven accepted by an earlier fill or a reconcile
            state.saga_answered(order)
            advance(order, OPEN)
            state.touch(actor, now_ms)
            out.append(_update(actor, order, 0, 0, 0))
            return
        if kind == _REJECTED:
            status = REJECTED
        elif kind == _CANCELLED:
            status = CANCELLED
        elif kind == _EXPIRED:
            status = EXPIRED
        else:
            self._orphan(actor, event, now_ms, out)
            return
        advance(order, status)  # refuses e.g. a Rejected after an Accepted
        self.end(actor, order, now_ms)
        state.touch(actor, now_ms)
        out.append(_update(actor, order, 0, 0, event.reason if kind == _REJECTED else 0))

    def end(self, actor: UserActor, order: OpenOrder, now_ms: int) -> int:
        """The order is over: release what is left of its reservation; return the amount."""
        _, amount = release(actor, order.order_id)
        self.state.remove_order(actor, order)
        return amount

    # --- fills ---------------------------------------------------------------------

    def _fill(
        self,
        actor: UserActor,
        order: OpenOrder,
        event: MatcherEvent,
        now_ms: int,
        out: list[Egress],
    ) -> None:
        state = self.state
        request = order.request
        side = request.side
        symbol = state.symbols[request.symbol]
        quantity = event.quantity_lots
        problem = _fill_problem(event, request.symbol, side, symbol.tick_size)
        if not problem and request.order_type == LIMIT and quantity > order.remaining_lots:
            problem = f"fill of {quantity} lots above the {order.remaining_lots} remaining"
        if not problem and not self._covered(actor, order.order_id, side, event, symbol):
            problem = "the reservation and available funds do not cover the fill"
        if problem:
            self._impossible(actor, event, problem, out)
            return
        self._move_money(actor, order.order_id, side, event, settings=symbol, out=out)
        order.filled_lots += quantity
        if order.remaining_lots:
            order.remaining_lots -= quantity
        state.saga_answered(order)
        done = event.order_done
        advance(order, FILLED if done else PARTIALLY_FILLED)
        if done:
            self.end(actor, order, now_ms)
        state.touch(actor, now_ms)
        state.counters.fills_settled += 1
        out.append(
            FillRecord(
                order.order_id,
                actor.user_id,
                event.trade_id,
                request.symbol,
                side,
                event.price_ticks,
                quantity,
                event.fee,
                event.maker,
            )
        )
        out.append(_update(actor, order, event.price_ticks, quantity, 0))
        if actor.limits.max_drawdown:
            self.check_drawdown(actor, out)

    def _covered(
        self,
        actor: UserActor,
        order_id: str,
        side: int,
        event: MatcherEvent,
        settings: SymbolSettings,
    ) -> bool:
        reservation = actor.reservations.get(order_id)
        reserved = reservation.amount if reservation is not None else 0
        if side == BUY:
            needed = event.notional + event.fee
            asset = settings.quote_asset
        else:
            needed = event.quantity_lots * settings.lot_size
            asset = settings.base_asset
        return needed <= reserved or needed - reserved <= available(actor, asset)

    def _move_money(
        self,
        actor: UserActor,
        order_id: str,
        side: int,
        event: MatcherEvent,
        *,
        settings: SymbolSettings,
        out: list[Egress],
    ) -> None:
        state = self.state
        accounts = state.accounts
        quote = settings.quote_asset
        base = settings.base_asset
        notional = event.notional
        fee = event.fee
        base_amount = event.quantity_lots * settings.lot_size
        user_id = actor.user_id
        if side == BUY:
            cost = notional + fee
            consume(actor, order_id, cost)
            state.debit(actor, quote, cost)
            accounts.clearing[quote] += notional
            accounts.fees[quote] += fee
            state.credit(actor, base, base_amount)
            accounts.clearing[base] -= base_amount
            rows: tuple[LedgerRow, ...] = (
                (user_id, USER_ACCOUNT, quote, -cost),
                (0, CLEARING_ACCOUNT, quote, notional),
                (0, FEES_ACCOUNT, quote, fee),
                (user_id, USER_ACCOUNT, base, base_amount),
                (0, CLEARING_ACCOUNT, base, -base_amount),
            )
        else:
            consume(actor, order_id, base_amount)
            state.debit(actor, base, base_amount)
            accounts.clearing[base] += base_amount
            proceeds = notional - fee
            state.credit(actor, quote, proceeds)
            accounts.clearing[quote] -= notional
            accounts.fees[quote] += fee
            rows = (
                (user_id, USER_ACCOUNT, base, -base_amount),
                (0, CLEARING_ACCOUNT, base, base_amount),
                (user_id, USER_ACCOUNT, quote, proceeds),
                (0, CLEARING_ACCOUNT, quote, -notional),
                (0, FEES_ACCOUNT, quote, fee),
            )
        # The trade id names the trade; both legs of it (two users) share it.
        out.append(LedgerPosting(f"trade:{event.trade_id}:{order_id}", rows))
        position = state.position(actor, settings.symbol)
        position.apply_fill(side == BUY, event.quantity_lots, notional, fee)
        state.note_position(actor, settings.symbol, position)

    def check_drawdown(self, actor: UserActor, out: list[Egress]) -> None:
        """Raise the peak; past max_drawdown below it, alert and go reduce-only."""
        state = self.state
        current = equity(actor, state.marks, state.settlement_symbols)
        peak_before = actor.peak_equity
        if drawdown_breached(actor, current):
            actor.reduce_only = True
            state.counters.risk_alerts += 1
            out.append(
                RiskAlert(
                    actor.user_id,
                    ALERT_DRAWDOWN,
                    f"equity {current} is {actor.peak_equity - current} below the peak "
                    f"{actor.peak_equity} (limit {actor.limits.max_drawdown}): reduce-only",
                )
            )
            state.mark_dirty(actor)
        elif actor.peak_equity != peak_before:
            state.mark_dirty(actor)

    # --- orphans -------------------------------------------------------------------

    def _orphan(
        self, actor: UserActor, event: MatcherEvent, now_ms: int, out: list[Egress]
    ) -> None:
        state = self.state
        state.counters.orphan_events += 1
        if event.kind != _FILL:
            self._alert(actor, event, "no live order with this id", out)
            return
        symbol = state.symbols.get(event.symbol)
        if symbol is None or event.side not in (BUY, SELL):
            self._impossible(actor, event, "fill names no known symbol or side", out)
            return
        problem = _fill_problem(event, event.symbol, event.side, symbol.tick_size)
        if not problem and not self._covered(actor, event.order_id, event.side, event, symbol):
            problem = "available funds do not cover the fill"
        if problem:
            self._impossible(actor, event, problem, out)
            return
        self._move_money(actor, event.order_id, event.side, event, settings=symbol, out=out)
        state.touch(actor, now_ms)
        state.counters.orphan_fills_settled += 1
        out.append(
            FillRecord(
                event.order_id,
                actor.user_id,
                event.trade_id,
                event.symbol,
                event.side,
                event.price_ticks,
                event.quantity_lots,
                event.fee,
                event.maker,
            )
        )
        self._alert(actor, event, "fill settled without an order, out of available funds", out)

    def _impossible(
        self, actor: UserActor, event: MatcherEvent, problem: str, out: list[Egress]
    ) -> None:
        self.state.counters.reconcile_impossible_states += 1
        self._alert(actor, event, problem, out)

    def _alert(
        self, actor: UserActor, event: MatcherEvent, problem: str, out: list[Egress]
    ) -> None:
        self.state.counters.risk_alerts += 1
        kind = EventKind(event.kind).name if event.kind in _KINDS else str(event.kind)
        detail = f"matcher event {event.sequence} ({kind}) for {event.order_id}: {problem}"
        out.append(RiskAlert(actor.user_id, ALERT_ORPHAN_EVENT, detail))


def _fill_problem(event: MatcherEvent, symbol: str, side: int, tick_size: int) -> str:
    quantity = event.quantity_lots
    if quantity <= 0 or event.price_ticks <= 0:
        return "fill without a positive price and quantity"
    if event.notional != event.price_ticks * quantity * tick_size:
        return "fill notional is not price * quantity * tick_size"
    if not 0 <= event.fee <= event.notional:
        return "fill fee outside 0..notional"
    if event.symbol and event.symbol != symbol:
        return f"fill for symbol {event.symbol}, order is {symbol}"
    if event.side and event.side != side:
        return "fill side differs from the order's"
    return ""


def _update(
    actor: UserActor, order: OpenOrder, price_ticks: int, lots: int, matcher_reason: int
) -> OrderUpdate:
    return OrderUpdate(
        actor.user_id,
        order.order_id,
        order.request.client_order_id,
        order.request.symbol,
        order.status,
        order.filled_lots,
        order.remaining_lots,
        price_ticks,
        lots,
        matcher_reason,
    )
