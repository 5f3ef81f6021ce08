"""A new order: dedup, admission, acceptance, matching, then rest or cancel its remainder.

The hot path of the engine (the rules are in `engine`'s docstring): written with
locals and inlined helpers, each inlined helper named where it is inlined.
"""

from __future__ import annotations

from typing import Final

from services.matcher.core.commands import CommandResult, SubmitCommand
from services.matcher.core.engine_state import (
    CANCEL_BOTH,
    CANCEL_OLDEST,
    IOC_REMAINDER,
    EngineState,
)
from services.matcher.core.event_log import ACCEPTED as ACCEPTED_KIND
from services.matcher.core.event_log import AcceptedEvent, EventRecord
from services.matcher.core.matching import match
from services.matcher.core.money import affordable_lots, market_reach
from services.matcher.core.order_book import BookSide
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import (
    BUY,
    CANCELLED,
    FOK,
    GTC,
    GTD,
    IOC,
    LAST_LIVE,
    LIMIT,
    MARKET,
    OPEN,
    POST_ONLY,
    SELL,
    OrderSpec,
    OrderView,
    new_record,
    unrecorded_view,
)
from services.matcher.core.settings import BPS, INT64_MAX
from services.matcher.core.state_digest import (
    FINISH,
    M_REMAINING,
    MASK,
    OPEN_STATUS_DIGEST,
    S_ARRIVAL,
    S_EXPIRE,
    S_FLAGS,
    S_PRICE,
    S_QUANTITY,
    S_QUOTE,
    S_SEQ,
    S_USER,
)
from services.matcher.core.symbols import SymbolBook
from services.matcher.core.validation import (
    BELOW_MIN_NOTIONAL,
    FOK_NOT_FILLABLE,
    INVALID_ORDER,
    INVALID_ORDER_ID,
    NO_LIQUIDITY,
    OUTSIDE_PRICE_BAND,
    POST_ONLY_WOULD_CROSS,
    SYMBOL_HALTED,
    UNKNOWN_SYMBOL,
    USER_KILL_SWITCHED,
    admission_reject_reason,
)

# Builds an OrderRecord without running `OrderRecord.__init__` (the hot path sets every slot).
_new_order = object.__new__
# state_digest.static_digest's flags term, by [side][order_type][time_in_force][stp], for
# the values an accepted order can have (rejected ones use `static_digest` itself).
_FLAG_DIGESTS: Final = tuple(
    tuple(
        tuple(
            tuple(
                (side + (order_type << 8) + (time_in_force << 16) + (stp << 24)) * S_FLAGS
                for stp in range(CANCEL_BOTH + 1)
            )
            for time_in_force in range(POST_ONLY + 1)
        )
        for order_type in range(MARKET + 1)
    )
    for side in range(SELL + 1)
)
_SIDES: Final = (BUY, SELL)
_IOC_FOK: Final = (IOC, FOK)


def submit(
    state: EngineState, command: SubmitCommand, now: int, events: list[EventRecord]
) -> CommandResult:
    # The hot path of the engine: written with locals and inlined helpers. What it
    # inlines is stated once elsewhere: the admission checks in `validation`, the
    # record's fields in `OrderRecord.__init__`, the digests in `state_digest`,
    # resting in `BookSide.rest`.
    spec = command.spec
    (
        order_id,
        user_id,
        symbol,
        side,
        order_type,
        time_in_force,
        price,
        quantity,
        quote_amount,
        expire_at_ms,
        stp,
        oms_shard,
        user_seq,
    ) = spec
    if not user_seq:
        return CommandResult(
            command.correlation_id, False, unrecorded_view(spec), INVALID_ORDER_ID, False
        )
    dedup_orders = state.dedup.orders
    known = dedup_orders.get(order_id)
    if known is not None:
        return CommandResult(command.correlation_id, True, known.view(), known.reject_reason, False)
    book = state.books.get(symbol)
    if book is None:
        return state.reject(command.correlation_id, spec, UNKNOWN_SYMBOL, now, events)
    is_limit = order_type == LIMIT
    if (
        is_limit
        and price > 0
        and quantity > 0
        and not quote_amount
        and not expire_at_ms
        and side in _SIDES
        and (GTC <= time_in_force <= FOK or time_in_force == POST_ONLY)
        and 0 <= stp <= CANCEL_BOTH
    ):
        # `admission_reject_reason` for a limit order whose fields are consistent
        # (`field_reject_reason` is 0) and that is not GTD.
        kill_switched = state.kill_switched
        if kill_switched and user_id in kill_switched:
            reason = USER_KILL_SWITCHED
        elif book.halted:
            reason = SYMBOL_HALTED
        else:
            settings = book.settings
            limit_notional = price * quantity * settings.tick_size
            if limit_notional < settings.min_notional:
                reason = BELOW_MIN_NOTIONAL
            elif limit_notional > INT64_MAX:
                reason = INVALID_ORDER
            else:
                reference = book.last_price_ticks or settings.reference_price_ticks
                distance = price - reference if price >= reference else reference - price
                if distance * BPS > reference * settings.price_band_bps:
                    reason = OUTSIDE_PRICE_BAND
                else:
                    reason = 0
    else:
        reason = admission_reject_reason(spec, book, now, state.kill_switched)
    if reason:
        return state.reject(command.correlation_id, spec, reason, now, events)

    is_buy = side == BUY
    contra = book.asks if is_buy else book.bids
    contra_keys = contra.keys
    best = (-contra_keys[-1] if is_buy else contra_keys[-1]) if contra_keys else None
    if is_limit:
        crosses = best is not None and (best <= price if is_buy else best >= price)
        if crosses:
            if time_in_force == POST_ONLY:
                reason = POST_ONLY_WOULD_CROSS
            elif time_in_force == FOK and not _fok_fillable(spec, contra):
                reason = FOK_NOT_FILLABLE
        elif time_in_force == FOK:
            reason = FOK_NOT_FILLABLE
        if not reason and not is_buy and best is not None:
            # INVALID_ORDER when a sell's worst-case proceeds would not fit in int64.
            highest = price if price > best else best
            if quantity * highest * book.settings.tick_size > INT64_MAX:
                reason = INVALID_ORDER
    else:
        crosses = True
        reason = _market_liquidity(spec, book, best, is_buy)
        if not reason and not is_buy and best is not None:
            reason = _sell_overflow(quantity, best, book)
    if reason:
        return state.reject(command.correlation_id, spec, reason, now, events)

    stream = state.streams.get(oms_shard) or state.shard_stream(oms_shard)
    arrival = state.last_arrival + 1
    state.last_arrival = arrival
    # state_digest.static_digest(spec, stream.digest, book.digest, arrival, 0)
    key_digest = (
        stream.digest
        + book.digest
        + user_id * S_USER
        + user_seq * S_SEQ
        + price * S_PRICE
        + quantity * S_QUANTITY
        + _FLAG_DIGESTS[side][order_type][time_in_force][stp]
        + arrival * S_ARRIVAL
    )
    if quote_amount:
        key_digest += quote_amount * S_QUOTE
    if expire_at_ms:
        key_digest += expire_at_ms * S_EXPIRE
    key_digest &= MASK
    # OrderRecord(spec, stream, arrival, key_digest), moved NEW -> OPEN
    order = _new_order(OrderRecord)
    order.spec = spec
    order.order_id = order_id
    order.user_id = user_id
    order.side = side
    order.price_ticks = price
    order.stream = stream
    order.arrival = arrival
    order.key_digest = key_digest
    order.digest = 0
    order.status = OPEN
    order.filled_lots = 0
    order.remaining_lots = quantity
    order.filled_notional = 0
    order.fees_paid = 0
    order.quote_spent = 0
    order.end_time_ms = 0
    order.reject_reason = 0
    dedup_orders[order_id] = order
    sequence = stream.next_sequence
    stream.next_sequence = sequence + 1
    events.append(new_record(AcceptedEvent, (sequence, now, spec)))
    stream.retained.append((ACCEPTED_KIND, sequence, now) + spec)  # noqa: RUF005

    if not crosses and is_limit and time_in_force not in _IOC_FOK:
        # Rests untouched (GTC, GTD, POST_ONLY): BookSide.rest, the user index, the digest.
        own = book.bids if is_buy else book.asks
        level = own.levels.get(price)
        if level is None:
            own.rest(order)
        else:
            level.orders.append(order)
            level.live_count += 1
            level.total_lots += quantity
        by_user = state.user_orders.get(user_id)
        if by_user is None:
            state.user_orders[user_id] = {order_id: order}
        else:
            by_user[order_id] = order
        if time_in_force == GTD:
            state.expiries.push(order)
        # state_digest.order_digest(order): only status and remaining are non-zero.
        value = (key_digest + OPEN_STATUS_DIGEST + quantity * M_REMAINING) & MASK
        value = ((value ^ (value >> 32)) * FINISH) & MASK
        digest = value ^ (value >> 29)
        order.digest = digest
        state.digest_sum = (state.digest_sum + digest) & MASK
        return new_record(
            CommandResult,
            (
                command.correlation_id,
                False,
                new_record(OrderView, (spec, OPEN, 0, quantity, 0, 0, 0)),
                0,
                False,
            ),
        )

    stop = match(state, order, book, contra, now, events) if crosses else 0
    if order.status <= LAST_LIVE:
        if stop:
            state.close(order, CANCELLED, stop, now, events)
        elif not is_limit or time_in_force in _IOC_FOK:
            state.close(order, CANCELLED, IOC_REMAINDER, now, events)
        else:
            (book.bids if is_buy else book.asks).rest(order)
            by_user = state.user_orders.get(user_id)
            if by_user is None:
                state.user_orders[user_id] = {order_id: order}
            else:
                by_user[order_id] = order
            if time_in_force == GTD:
                state.expiries.push(order)
    else:
        order.end_time_ms = now
        state.dedup.finished.append(order)
    state.rehash(order)
    return new_record(CommandResult, (command.correlation_id, False, order.view(), 0, False))


def _market_liquidity(spec: OrderSpec, book: SymbolBook, best: int | None, is_buy: bool) -> int:
    """NO_LIQUIDITY when the first step of a market order could fill nothing, else 0."""
    if best is None:
        return NO_LIQUIDITY
    settings = book.settings
    reach = market_reach(book.reference_price_ticks(), settings.price_band_bps, is_buy)
    if best > reach if is_buy else best < reach:
        return NO_LIQUIDITY
    if is_buy and not affordable_lots(
        spec.quote_amount, best * settings.tick_size, settings.taker_fee_ppm
    ):
        return NO_LIQUIDITY
    return 0


def _fok_fillable(spec: OrderSpec, contra: BookSide) -> bool:
    needed = spec.quantity_lots
    limit = spec.price_ticks
    user_id = spec.user_id
    skip_own = spec.self_trade_prevention == CANCEL_OLDEST
    for level in contra.levels_best_first():
        if level.price_ticks > limit if not contra.is_bid else level.price_ticks < limit:
            return False
        for maker in level.live_orders():
            if maker.user_id == user_id:
                if skip_own:
                    continue
                return False
            needed -= maker.remaining_lots
            if needed <= 0:
                return True
    return False


def _sell_overflow(quantity_lots: int, highest_price: int, book: SymbolBook) -> int:
    """INVALID_ORDER when a sell's worst-case proceeds would not fit in int64."""
    if quantity_lots * highest_price * book.settings.tick_size > INT64_MAX:
        return INVALID_ORDER
    return 0
