"""Matching: an incoming order trades against the resting orders of the other side.

Price-time priority at the resting orders' prices, self-trade prevention, fees; the
caller (`submission.submit`) rests or cancels what is left.
"""

from __future__ import annotations

from services.matcher.core.engine_state import (
    CANCEL_BOTH,
    CANCEL_OLDEST,
    PRICE_BAND,
    SELF_TRADE,
    EngineState,
)
from services.matcher.core.event_log import FILL as FILL_KIND
from services.matcher.core.event_log import EventRecord, FillEvent
from services.matcher.core.money import affordable_lots, market_reach
from services.matcher.core.order_book import BookSide
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import (
    CANCELLED,
    FILLED,
    GTD,
    LAST_LIVE,
    LIMIT,
    PARTIALLY_FILLED,
    new_record,
)
from services.matcher.core.settings import PPM
from services.matcher.core.state_digest import (
    FILLED_STATUS_DIGEST,
    FINISH,
    M_END,
    M_FEES,
    M_FILLED,
    M_NOTIONAL,
    M_REMAINING,
    M_SPENT,
    MASK,
    PARTIAL_STATUS_DIGEST,
)
from services.matcher.core.symbols import SymbolBook


def match(  # noqa: PLR0917 (positional: called once per crossing order)
    state: EngineState,
    taker: OrderRecord,
    book: SymbolBook,
    contra: BookSide,
    now: int,
    events: list[EventRecord],
) -> int:
    """Trade the taker against `contra` (its opposite side); return what stopped it, or 0.

    0 means the taker is filled, or no resting order is left within its limit
    price (or, for a market buy, its budget): the caller rests or cancels it.
    """
    spec = taker.spec
    contra_is_bid = contra.is_bid
    is_buy = not contra_is_bid
    settings = book.settings
    tick_size = settings.tick_size
    maker_fee_ppm = settings.maker_fee_ppm
    taker_fee_ppm = settings.taker_fee_ppm
    is_market = spec.order_type != LIMIT
    market_buy = is_market and is_buy
    quote_amount = spec.quote_amount
    if is_market:
        reach = market_reach(book.reference_price_ticks(), settings.price_band_bps, is_buy)
    else:
        reach = spec.price_ticks
    stp = spec.self_trade_prevention
    taker_user = taker.user_id
    taker_stream = taker.stream
    keys = contra.keys
    levels = contra.levels
    dedup_finished = state.dedup.finished
    user_orders = state.user_orders
    emit = events.append
    while keys:
        key = keys[-1]
        price = key if contra_is_bid else -key
        if price > reach if is_buy else price < reach:
            return PRICE_BAND if is_market else 0
        level = levels[price]
        queue = level.orders
        lot_cost = price * tick_size
        while True:
            maker = queue[0]
            if maker.status > LAST_LIVE:  # lazily deleted
                queue.popleft()
                continue
            if maker.user_id == taker_user:
                if stp != CANCEL_OLDEST and stp != CANCEL_BOTH:  # noqa: PLR1714
                    return SELF_TRADE
                queue.popleft()
                level.live_count -= 1
                level.total_lots -= maker.remaining_lots
                if not level.live_count:
                    keys.pop()
                    del levels[price]
                state.retire(maker, CANCELLED, now)
                state.emit_cancelled(maker, SELF_TRADE, now, events)
                state.rehash(maker)
                if stp == CANCEL_BOTH:
                    return SELF_TRADE
                if not level.live_count:
                    break
                continue
            maker_remaining = maker.remaining_lots
            if market_buy:
                quantity = affordable_lots(
                    quote_amount - taker.quote_spent, lot_cost, taker_fee_ppm
                )
                if not quantity:
                    return 0
                quantity = maker_remaining if maker_remaining < quantity else quantity
            else:
                quantity = taker.remaining_lots
                quantity = maker_remaining if maker_remaining < quantity else quantity
            trade_id = state.last_trade_id + 1
            state.last_trade_id = trade_id
            notional = lot_cost * quantity
            maker_fee = notional * maker_fee_ppm // PPM
            taker_fee = notional * taker_fee_ppm // PPM

            maker_remaining -= quantity
            maker_filled = maker.filled_lots + quantity
            maker_notional = maker.filled_notional + notional
            maker_fees = maker.fees_paid + maker_fee
            maker.remaining_lots = maker_remaining
            level.total_lots -= quantity
            maker.filled_lots = maker_filled
            maker.filled_notional = maker_notional
            maker.fees_paid = maker_fees
            stream = maker.stream
            sequence = stream.next_sequence
            stream.next_sequence = sequence + 1
            maker_spec = maker.spec
            maker_done = not maker_remaining
            emit(
                new_record(
                    FillEvent,
                    (
                        sequence,
                        now,
                        maker_spec,
                        trade_id,
                        price,
                        quantity,
                        notional,
                        maker_fee,
                        True,
                        maker_remaining,
                        maker_done,
                    ),
                )
            )
            row = (
                FILL_KIND,
                sequence,
                now,
                trade_id,
                price,
                quantity,
                notional,
                maker_fee,
                True,
                maker_remaining,
                maker_done,
            )
            stream.retained.append(row + maker_spec)

            taker.filled_lots += quantity
            taker.filled_notional += notional
            taker.fees_paid += taker_fee
            if market_buy:
                spent = taker.quote_spent + notional + taker_fee
                taker.quote_spent = spent
                taker_done = spent == quote_amount
            else:
                taker.remaining_lots -= quantity
                taker_done = not taker.remaining_lots
            taker.status = FILLED if taker_done else PARTIALLY_FILLED
            sequence = taker_stream.next_sequence
            taker_stream.next_sequence = sequence + 1
            taker_remaining = taker.remaining_lots
            emit(
                new_record(
                    FillEvent,
                    (
                        sequence,
                        now,
                        spec,
                        trade_id,
                        price,
                        quantity,
                        notional,
                        taker_fee,
                        False,
                        taker_remaining,
                        taker_done,
                    ),
                )
            )
            row = (
                FILL_KIND,
                sequence,
                now,
                trade_id,
                price,
                quantity,
                notional,
                taker_fee,
                False,
                taker_remaining,
                taker_done,
            )
            taker_stream.retained.append(row + spec)

            book.last_price_ticks = price
            book.last_trade_id = trade_id
            book.last_trade_time_ms = now

            if maker_remaining:
                maker.status = PARTIALLY_FILLED
                # state_digest.order_digest(maker), inlined (end_time_ms is 0)
                value = (
                    maker.key_digest
                    + PARTIAL_STATUS_DIGEST
                    + maker_remaining * M_REMAINING
                    + maker_filled * M_FILLED
                    + maker_notional * M_NOTIONAL
                    + maker_fees * M_FEES
                    + maker.quote_spent * M_SPENT
                ) & MASK
                value = ((value ^ (value >> 32)) * FINISH) & MASK
                digest = value ^ (value >> 29)
                state.digest_sum = (state.digest_sum + digest - maker.digest) & MASK
                maker.digest = digest
                # Only a market buy's budget stops short of a resting order.
                return 0
            maker.status = FILLED
            queue.popleft()
            maker.end_time_ms = now
            dedup_finished.append(maker)
            by_user = user_orders[maker.user_id]
            del by_user[maker.order_id]
            if not by_user:
                del user_orders[maker.user_id]
            if maker.spec.time_in_force == GTD:
                state.expiries.note_finished()
            # state_digest.order_digest(maker), inlined (remaining_lots is 0)
            value = (
                maker.key_digest
                + FILLED_STATUS_DIGEST
                + maker_filled * M_FILLED
                + maker_notional * M_NOTIONAL
                + maker_fees * M_FEES
                + maker.quote_spent * M_SPENT
                + now * M_END
            ) & MASK
            value = ((value ^ (value >> 32)) * FINISH) & MASK
            digest = value ^ (value >> 29)
            state.digest_sum = (state.digest_sum + digest - maker.digest) & MASK
            maker.digest = digest
            level.live_count -= 1
            if not level.live_count:
                keys.pop()
                del levels[price]
                if taker_done:
                    return 0
                break
            if taker_done:
                return 0
    return 0
