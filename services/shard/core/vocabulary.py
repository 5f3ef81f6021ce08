"""Stable codes shared with the `oms.v1` contract, as integer enums.

The values are the protobuf enum numbers, so a core value and a wire value are
the same integer and never need translating. Hot paths compare against the
plain-int aliases at the bottom (an enum attribute lookup costs more than an int).
"""

from __future__ import annotations

from enum import IntEnum

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2


class Side(IntEnum):
    BUY = common_pb2.SIDE_BUY
    SELL = common_pb2.SIDE_SELL


class OrderType(IntEnum):
    LIMIT = common_pb2.ORDER_TYPE_LIMIT
    MARKET = common_pb2.ORDER_TYPE_MARKET


class TimeInForce(IntEnum):
    UNSPECIFIED = common_pb2.TIME_IN_FORCE_UNSPECIFIED  # treated as GTC for limits
    GTC = common_pb2.TIME_IN_FORCE_GTC
    IOC = common_pb2.TIME_IN_FORCE_IOC
    FOK = common_pb2.TIME_IN_FORCE_FOK
    GTD = common_pb2.TIME_IN_FORCE_GTD
    POST_ONLY = common_pb2.TIME_IN_FORCE_POST_ONLY


class OrderStatus(IntEnum):
    UNSPECIFIED = common_pb2.ORDER_STATUS_UNSPECIFIED
    PENDING = common_pb2.ORDER_STATUS_PENDING
    OPEN = common_pb2.ORDER_STATUS_OPEN
    PARTIALLY_FILLED = common_pb2.ORDER_STATUS_PARTIALLY_FILLED
    FILLED = common_pb2.ORDER_STATUS_FILLED
    CANCELLED = common_pb2.ORDER_STATUS_CANCELLED
    EXPIRED = common_pb2.ORDER_STATUS_EXPIRED
    REJECTED = common_pb2.ORDER_STATUS_REJECTED


class RejectReason(IntEnum):
    NONE = shard_pb2.SHARD_REJECT_REASON_UNSPECIFIED
    MALFORMED = shard_pb2.SHARD_REJECT_REASON_MALFORMED
    UNKNOWN_USER = shard_pb2.SHARD_REJECT_REASON_UNKNOWN_USER
    NOT_OWNER = shard_pb2.SHARD_REJECT_REASON_NOT_OWNER
    UNKNOWN_SYMBOL = shard_pb2.SHARD_REJECT_REASON_UNKNOWN_SYMBOL
    UNKNOWN_ASSET = shard_pb2.SHARD_REJECT_REASON_UNKNOWN_ASSET
    INVALID_QUANTITY = shard_pb2.SHARD_REJECT_REASON_INVALID_QUANTITY
    INVALID_PRICE = shard_pb2.SHARD_REJECT_REASON_INVALID_PRICE
    INVALID_AMOUNT = shard_pb2.SHARD_REJECT_REASON_INVALID_AMOUNT
    INVALID_ORDER = shard_pb2.SHARD_REJECT_REASON_INVALID_ORDER
    INSUFFICIENT_FUNDS = shard_pb2.SHARD_REJECT_REASON_INSUFFICIENT_FUNDS
    RATE_LIMITED = shard_pb2.SHARD_REJECT_REASON_RATE_LIMITED
    BACKPRESSURE = shard_pb2.SHARD_REJECT_REASON_BACKPRESSURE
    RISK_MAX_ORDER_NOTIONAL = shard_pb2.SHARD_REJECT_REASON_RISK_MAX_ORDER_NOTIONAL
    RISK_MAX_POSITION = shard_pb2.SHARD_REJECT_REASON_RISK_MAX_POSITION
    RISK_MAX_OPEN_ORDERS = shard_pb2.SHARD_REJECT_REASON_RISK_MAX_OPEN_ORDERS
    RISK_PRICE_BAND = shard_pb2.SHARD_REJECT_REASON_RISK_PRICE_BAND
    REDUCE_ONLY = shard_pb2.SHARD_REJECT_REASON_REDUCE_ONLY
    ORDER_NOT_FOUND = shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_FOUND
    ORDER_NOT_CANCELLABLE = shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_CANCELLABLE
    USER_HALTED = shard_pb2.SHARD_REJECT_REASON_USER_HALTED
    MATCHER_REJECTED = shard_pb2.SHARD_REJECT_REASON_MATCHER_REJECTED
    INTERNAL_ERROR = shard_pb2.SHARD_REJECT_REASON_INTERNAL_ERROR
    DUPLICATE_TRANSFER = shard_pb2.SHARD_REJECT_REASON_DUPLICATE_TRANSFER
    USER_NOT_FLAT = shard_pb2.SHARD_REJECT_REASON_USER_NOT_FLAT
    TRADING_HALTED = shard_pb2.SHARD_REJECT_REASON_TRADING_HALTED
    CONTROL_VERSION_STALE = shard_pb2.SHARD_REJECT_REASON_CONTROL_VERSION_STALE
    INVALID_TIMEOUT = shard_pb2.SHARD_REJECT_REASON_INVALID_TIMEOUT
    SESSION_CLOSED = shard_pb2.SHARD_REJECT_REASON_SESSION_CLOSED
    TOO_MANY_SESSIONS = shard_pb2.SHARD_REJECT_REASON_TOO_MANY_SESSIONS


class UserControlAction(IntEnum):
    HALT_TRADING = shard_pb2.USER_CONTROL_ACTION_HALT_TRADING
    RESUME_TRADING = shard_pb2.USER_CONTROL_ACTION_RESUME_TRADING
    RESTART = shard_pb2.USER_CONTROL_ACTION_RESTART


# A client may retry these with the same command and expect a different answer.
# INTERNAL_ERROR is not among them: the same message fails the same way on replay.
RETRYABLE_REASONS: tuple[int, ...] = (
    RejectReason.RATE_LIMITED,
    RejectReason.BACKPRESSURE,
    RejectReason.USER_HALTED,
)


class UserTier(IntEnum):
    UNSPECIFIED = shard_pb2.USER_TIER_UNSPECIFIED  # treated as NORMAL
    NORMAL = shard_pb2.USER_TIER_NORMAL
    WHALE = shard_pb2.USER_TIER_WHALE


class SelfTradePrevention(IntEnum):
    UNSPECIFIED = matcher_pb2.SELF_TRADE_PREVENTION_UNSPECIFIED
    CANCEL_NEWEST = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_NEWEST
    CANCEL_OLDEST = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_OLDEST
    CANCEL_BOTH = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_BOTH


class EventKind(IntEnum):
    """Which matcher lifecycle event a `MatcherEvent` carries (core only, not on the wire)."""

    ACCEPTED = 1
    REJECTED = 2
    FILL = 3
    CANCELLED = 4
    EXPIRED = 5


# Plain-int aliases for the hot paths.
BUY = int(Side.BUY)
SELL = int(Side.SELL)
LIMIT = int(OrderType.LIMIT)
MARKET = int(OrderType.MARKET)
GTD = int(TimeInForce.GTD)
PENDING = int(OrderStatus.PENDING)
OPEN = int(OrderStatus.OPEN)
PARTIALLY_FILLED = int(OrderStatus.PARTIALLY_FILLED)
FILLED = int(OrderStatus.FILLED)
CANCELLED = int(OrderStatus.CANCELLED)
EXPIRED = int(OrderStatus.EXPIRED)
REJECTED = int(OrderStatus.REJECTED)
WHALE = int(UserTier.WHALE)

PPM = 1_000_000  # fee rates are millionths of notional
BPS = 10_000  # price bands are basis points
INT64_MAX = (1 << 63) - 1
