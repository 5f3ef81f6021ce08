"""Builders for matcher commands and a driver that reads the machine's output as plain tuples.

Everything the machine returns is read back through the protobuf messages it would
send (`MatcherEgress.result_messages()` / `event_messages()`), so tests exercise the
codec too. Tuples make mismatches readable in pytest's diff.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protos.oms.v1 import common_pb2, matcher_pb2
from services.matcher.core import EngineSettings, MatcherMachine, SymbolSettings
from services.runtime.core.state_machine import ApplyContext

BUY = common_pb2.SIDE_BUY
SELL = common_pb2.SIDE_SELL
LIMIT = common_pb2.ORDER_TYPE_LIMIT
MARKET = common_pb2.ORDER_TYPE_MARKET
GTC = common_pb2.TIME_IN_FORCE_GTC
IOC = common_pb2.TIME_IN_FORCE_IOC
FOK = common_pb2.TIME_IN_FORCE_FOK
GTD = common_pb2.TIME_IN_FORCE_GTD
POST_ONLY = common_pb2.TIME_IN_FORCE_POST_ONLY

OPEN = common_pb2.ORDER_STATUS_OPEN
PARTIALLY_FILLED = common_pb2.ORDER_STATUS_PARTIALLY_FILLED
FILLED = common_pb2.ORDER_STATUS_FILLED
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED
EXPIRED = common_pb2.ORDER_STATUS_EXPIRED
REJECTED = common_pb2.ORDER_STATUS_REJECTED

AAA = SymbolSettings(
    symbol="AAA-USD",
    base_asset="AAA",
    quote_asset="USD",
    lot_size=1_000,
    tick_size=3,
    min_notional=300,
    price_band_bps=500,  # +-5 ticks around 100
    reference_price_ticks=100,
    maker_fee_ppm=1_500,
    taker_fee_ppm=2_700,
)
BBB = SymbolSettings(
    symbol="BBB-USD",
    base_asset="BBB",
    quote_asset="USD",
    lot_size=10,
    tick_size=7,
    min_notional=0,
    price_band_bps=1_000,  # +-5 ticks around 50
    reference_price_ticks=50,
    maker_fee_ppm=0,
    taker_fee_ppm=10_000,
)
SYMBOLS = (AAA, BBB)


def settings(**overrides: int) -> EngineSettings:
    values: dict[str, int] = {
        "dedup_horizon_ms": 1_000,
        "retained_events_per_shard": 10_000,
        "max_expiries_per_timer": 1_000,
        "max_dedup_sweeps_per_timer": 1_000,
    }
    values.update(overrides)
    return EngineSettings(symbols=SYMBOLS, **values)


def order(
    order_id: str,
    user_id: int,
    side: int,
    *,
    price: int = 0,
    quantity: int = 0,
    quote: int = 0,
    order_type: int = LIMIT,
    tif: int = GTC,
    symbol: str = "AAA-USD",
    stp: int = 0,
    expire_at_ms: int = 0,
) -> matcher_pb2.Order:
    return matcher_pb2.Order(
        order_id=order_id,
        user_id=user_id,
        symbol=symbol,
        side=side,  # type: ignore[arg-type]
        order_type=order_type,  # type: ignore[arg-type]
        time_in_force=tif,  # type: ignore[arg-type]
        price_ticks=price,
        quantity_lots=quantity,
        quote_amount=quote,
        expire_at_ms=expire_at_ms,
        self_trade_prevention=stp,  # type: ignore[arg-type]
    )


def submit(order_message: matcher_pb2.Order, correlation_id: int = 0) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=correlation_id, submit=matcher_pb2.SubmitOrder(order=order_message)
    )


def limit(
    order_id: str, user_id: int, side: int, price: int, quantity: int, **kwargs: int | str
) -> matcher_pb2.MatcherCommand:
    return submit(order(order_id, user_id, side, price=price, quantity=quantity, **kwargs))  # type: ignore[arg-type]


def market_buy(
    order_id: str, user_id: int, quote: int, **kwargs: int | str
) -> matcher_pb2.MatcherCommand:
    return submit(
        order(order_id, user_id, BUY, quote=quote, order_type=MARKET, tif=0, **kwargs)  # type: ignore[arg-type]
    )


def market_sell(
    order_id: str, user_id: int, quantity: int, **kwargs: int | str
) -> matcher_pb2.MatcherCommand:
    return submit(
        order(order_id, user_id, SELL, quantity=quantity, order_type=MARKET, tif=0, **kwargs)  # type: ignore[arg-type]
    )


def cancel(order_id: str, user_id: int, correlation_id: int = 0) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=correlation_id,
        cancel=matcher_pb2.CancelOrder(order_id=order_id, user_id=user_id),
    )


def halt(symbol: str, cancel_resting: bool = False) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        halt=matcher_pb2.HaltSymbol(symbol=symbol, cancel_resting=cancel_resting)
    )


def resume(symbol: str) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(resume=matcher_pb2.ResumeSymbol(symbol=symbol))


def kill_switch(user_id: int, enable: bool) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        kill_switch=matcher_pb2.KillSwitchUser(user_id=user_id, enable=enable)
    )


def batch_bytes(commands: list[matcher_pb2.MatcherCommand]) -> bytes:
    return matcher_pb2.MatcherCommandBatch(commands=commands).SerializeToString()


# --- reading protobuf back as tuples -----------------------------------------------------

OrderFields = tuple[str, int, str, int, int, int, int, int, int, int, int]
Row = tuple[Any, ...]  # a result or an event read back as a tuple


def order_fields(message: matcher_pb2.Order) -> OrderFields:
    return (
        message.order_id,
        message.user_id,
        message.symbol,
        message.side,
        message.order_type,
        message.time_in_force,
        message.price_ticks,
        message.quantity_lots,
        message.quote_amount,
        message.expire_at_ms,
        message.self_trade_prevention,
    )


def state_tuple(message: matcher_pb2.OrderState) -> Row:
    return (
        order_fields(message.order),
        message.status,
        message.filled_lots,
        message.remaining_lots,
        message.filled_notional,
        message.fees_paid,
        message.quote_spent,
    )


def result_tuple(message: matcher_pb2.MatcherCommandResult) -> Row:
    state = state_tuple(message.order) if message.HasField("order") else None
    return (
        message.correlation_id,
        message.duplicate,
        state,
        message.reject_reason,
        message.not_found,
    )


def event_tuple(message: matcher_pb2.MatcherEvent) -> Row:
    head = (
        message.oms_shard,
        message.sequence,
        message.order_id,
        message.user_id,
        message.consensus_time_ms,
    )
    kind = message.WhichOneof("event")
    if kind == "accepted":
        return (*head, "accepted", state_tuple(message.accepted.order))
    if kind == "rejected":
        return (*head, "rejected", order_fields(message.rejected.order), message.rejected.reason)
    if kind == "fill":
        fill = message.fill
        return (
            *head,
            "fill",
            fill.trade_id,
            fill.symbol,
            fill.side,
            fill.price_ticks,
            fill.quantity_lots,
            fill.notional,
            fill.fee,
            fill.maker,
            fill.remaining_lots,
            fill.order_done,
        )
    if kind == "cancelled":
        return (*head, "cancelled", message.cancelled.reason, message.cancelled.remaining_lots)
    if kind == "expired":
        return (*head, "expired", message.expired.remaining_lots)
    raise AssertionError(f"event without a kind: {message}")


@dataclass
class Driver:
    """A `MatcherMachine` fed through bytes, with a log position counter."""

    machine: MatcherMachine
    position: int = 0
    events: list[Row] = field(default_factory=list)

    @classmethod
    def create(cls, **overrides: int) -> Driver:
        return cls(MatcherMachine(settings(**overrides)))

    def apply(
        self, commands: list[matcher_pb2.MatcherCommand], now_ms: int
    ) -> tuple[list[Row], list[Row]]:
        self.position += 1
        (egress,) = self.machine.apply(batch_bytes(commands), ApplyContext(self.position, now_ms))
        if egress.refused is not None:
            raise AssertionError(f"batch refused: {egress.refused}")
        results = [result_tuple(message) for message in egress.result_messages()]
        events = [event_tuple(message) for message in egress.event_messages()]
        self.events.extend(events)
        return results, events

    def one(self, command: matcher_pb2.MatcherCommand, now_ms: int) -> tuple[Row, list[Row]]:
        results, events = self.apply([command], now_ms)
        return results[0], events

    def timer(self, now_ms: int) -> list[Row]:
        self.position += 1
        outputs = self.machine.on_timer(ApplyContext(self.position, now_ms))
        events = [event_tuple(message) for egress in outputs for message in egress.event_messages()]
        self.events.extend(events)
        return events

    def book(self, symbol: str = "AAA-USD") -> dict[str, list[tuple[int, list[tuple[str, int]]]]]:
        engine = self.machine.engine
        return {
            name: [
                (price, [(view.spec.order_id, view.remaining_lots) for view in views])
                for price, views in engine.levels(symbol, side)
            ]
            for name, side in (("bids", BUY), ("asks", SELL))
        }
