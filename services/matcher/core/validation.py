"""Admission checks of a submitted order that need no look at the book.

The first failing check names the reject reason, in this order:
UNKNOWN_SYMBOL (checked by the engine), INVALID_ORDER (inconsistent fields),
PRICE_OFF_TICK, QUANTITY_OFF_LOT, EXPIRE_TIME_PASSED, USER_KILL_SWITCHED,
SYMBOL_HALTED, BELOW_MIN_NOTIONAL, OUTSIDE_PRICE_BAND. The book-dependent ones
(POST_ONLY_WOULD_CROSS, FOK_NOT_FILLABLE, NO_LIQUIDITY) follow in the engine.

Inconsistent fields (INVALID_ORDER): side, type, time in force or self-trade
mode outside their enums; a limit with no price (0), with a quote amount, with
time in force UNSPECIFIED; expire_at_ms set on anything but GTD, or missing on
GTD; a market order with a price or with a time in force other than
UNSPECIFIED/IOC; a market buy without a positive quote amount or with a
quantity; a market sell with a quote amount; a limit whose worst-case notional
does not fit in int64.
"""

from __future__ import annotations

from typing import Final

from protos.oms.v1 import matcher_pb2
from services.matcher.core.orders import (
    BUY,
    FOK,
    GTC,
    GTD,
    IOC,
    LIMIT,
    MARKET,
    POST_ONLY,
    SELL,
    TIF_UNSPECIFIED,
    OrderSpec,
)
from services.matcher.core.settings import BPS, INT64_MAX
from services.matcher.core.symbols import SymbolBook

UNKNOWN_SYMBOL: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL
PRICE_OFF_TICK: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_PRICE_OFF_TICK
QUANTITY_OFF_LOT: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT
BELOW_MIN_NOTIONAL: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_BELOW_MIN_NOTIONAL
OUTSIDE_PRICE_BAND: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND
SYMBOL_HALTED: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_SYMBOL_HALTED
POST_ONLY_WOULD_CROSS: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_POST_ONLY_WOULD_CROSS
FOK_NOT_FILLABLE: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_FOK_NOT_FILLABLE
INVALID_ORDER_ID: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_INVALID_ORDER_ID
INVALID_ORDER: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_INVALID_ORDER
EXPIRE_TIME_PASSED: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_EXPIRE_TIME_PASSED
USER_KILL_SWITCHED: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_USER_KILL_SWITCHED
NO_LIQUIDITY: Final[int] = matcher_pb2.MATCHER_REJECT_REASON_NO_LIQUIDITY

_LIMIT_TIME_IN_FORCE: Final = (GTC, IOC, FOK, GTD, POST_ONLY)
_MARKET_TIME_IN_FORCE: Final = (TIF_UNSPECIFIED, IOC)
_SELF_TRADE_MODES: Final = (0, 1, 2, 3)


def field_reject_reason(spec: OrderSpec) -> int:
    """INVALID_ORDER, PRICE_OFF_TICK or QUANTITY_OFF_LOT for the order's own fields, else 0."""
    side = spec.side
    if side != BUY and side != SELL:  # noqa: PLR1714 - two int compares beat a tuple here
        return INVALID_ORDER
    if spec.self_trade_prevention not in _SELF_TRADE_MODES:
        return INVALID_ORDER
    order_type = spec.order_type
    if order_type == LIMIT:
        time_in_force = spec.time_in_force
        if time_in_force not in _LIMIT_TIME_IN_FORCE or spec.quote_amount or not spec.price_ticks:
            return INVALID_ORDER
        if (time_in_force == GTD) != (spec.expire_at_ms != 0):
            return INVALID_ORDER
        if spec.price_ticks < 0:
            return PRICE_OFF_TICK
        if spec.quantity_lots <= 0:
            return QUANTITY_OFF_LOT
        return 0
    if order_type != MARKET:
        return INVALID_ORDER
    if spec.time_in_force not in _MARKET_TIME_IN_FORCE or spec.price_ticks or spec.expire_at_ms:
        return INVALID_ORDER
    if side == BUY:
        if spec.quote_amount <= 0 or spec.quantity_lots:
            return INVALID_ORDER
        return 0
    if spec.quote_amount:
        return INVALID_ORDER
    if spec.quantity_lots <= 0:
        return QUANTITY_OFF_LOT
    return 0


def admission_reject_reason(
    spec: OrderSpec, book: SymbolBook, now_ms: int, kill_switched: dict[int, None]
) -> int:
    """The first failing book-independent check for a known symbol, else 0."""
    reason = field_reject_reason(spec)
    if reason:
        return reason
    if spec.time_in_force == GTD and spec.expire_at_ms <= now_ms:
        return EXPIRE_TIME_PASSED
    if kill_switched and spec.user_id in kill_switched:
        return USER_KILL_SWITCHED
    if book.halted:
        return SYMBOL_HALTED
    if spec.order_type == LIMIT:
        settings = book.settings
        price = spec.price_ticks
        limit_notional = price * spec.quantity_lots * settings.tick_size
        if limit_notional < settings.min_notional:
            return BELOW_MIN_NOTIONAL
        if limit_notional > INT64_MAX:
            return INVALID_ORDER
        reference = book.last_price_ticks or settings.reference_price_ticks
        # money.within_band, inlined: |price - reference| * 10000 <= reference * band
        distance = price - reference if price >= reference else reference - price
        if distance * BPS > reference * settings.price_band_bps:
            return OUTSIDE_PRICE_BAND
    return 0
