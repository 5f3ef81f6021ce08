"""Builders for `oms.v1` matcher commands against the packaged catalog's group g1.

Group g1 trades BTC-USDT (reference 6,500,000 ticks) and ETH-USDT (reference
350,000 ticks), both with tick_size 1, min_notional 1,000,000 and a 10 % band.
A BTC-USDT lot at the reference is 6,500,000 quote minor units, over the minimum;
an ETH-USDT lot at the reference (350,000) is under it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from protos.oms.v1 import common_pb2, matcher_pb2

BTC = "BTC-USDT"
ETH = "ETH-USDT"
SYMBOLS = (BTC, ETH)
REFERENCE_TICKS = {BTC: 6_500_000, ETH: 350_000}
BAND_BPS = 1_000

BUY = common_pb2.SIDE_BUY
SELL = common_pb2.SIDE_SELL
LIMIT = common_pb2.ORDER_TYPE_LIMIT
MARKET = common_pb2.ORDER_TYPE_MARKET
GTC = common_pb2.TIME_IN_FORCE_GTC
IOC = common_pb2.TIME_IN_FORCE_IOC
GTD = common_pb2.TIME_IN_FORCE_GTD

OPEN = common_pb2.ORDER_STATUS_OPEN
PARTIALLY_FILLED = common_pb2.ORDER_STATUS_PARTIALLY_FILLED
FILLED = common_pb2.ORDER_STATUS_FILLED
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED
EXPIRED = common_pb2.ORDER_STATUS_EXPIRED
REJECTED = common_pb2.ORDER_STATUS_REJECTED

_correlation_ids = itertools.count(1)


@dataclass
class OrderFactory:
    """Orders of one OMS shard with well-formed, never reused ids "<shard>:<user>:<seq>"."""

    shard: str
    symbol: str = BTC
    next_seq: dict[int, int] = field(default_factory=dict)

    def order_id(self, user_id: int) -> str:
        user_seq = self.next_seq.get(user_id, 0) + 1
        self.next_seq[user_id] = user_seq
        return f"{self.shard}:{user_id}:{user_seq}"

    def limit(
        self,
        user_id: int,
        side: int,
        price_ticks: int,
        quantity_lots: int = 1,
        *,
        time_in_force: int = GTC,
        expire_at_ms: int = 0,
        symbol: str | None = None,
    ) -> matcher_pb2.Order:
        return matcher_pb2.Order(
            order_id=self.order_id(user_id),
            user_id=user_id,
            symbol=symbol or self.symbol,
            side=side,  # type: ignore[arg-type]
            order_type=LIMIT,
            time_in_force=time_in_force,  # type: ignore[arg-type]
            price_ticks=price_ticks,
            quantity_lots=quantity_lots,
            expire_at_ms=expire_at_ms,
        )


def submit(order: matcher_pb2.Order) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=next(_correlation_ids), submit=matcher_pb2.SubmitOrder(order=order)
    )


def cancel(order: matcher_pb2.Order) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=next(_correlation_ids),
        cancel=matcher_pb2.CancelOrder(order_id=order.order_id, user_id=order.user_id),
    )


def halt(symbol: str, *, cancel_resting: bool = False) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=next(_correlation_ids),
        halt=matcher_pb2.HaltSymbol(symbol=symbol, cancel_resting=cancel_resting),
    )


def resume(symbol: str) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=next(_correlation_ids), resume=matcher_pb2.ResumeSymbol(symbol=symbol)
    )


def batch(*commands: matcher_pb2.MatcherCommand) -> matcher_pb2.MatcherCommandBatch:
    return matcher_pb2.MatcherCommandBatch(commands=commands)


def submits(*orders: matcher_pb2.Order) -> matcher_pb2.MatcherCommandBatch:
    return batch(*(submit(order) for order in orders))
