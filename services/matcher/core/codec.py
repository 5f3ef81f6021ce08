"""`oms.v1` protobuf at the edge of the core: command batches in, results and events out.

Decoding turns a `MatcherCommandBatch` into `commands` records (order ids are
parsed here); encoding turns the engine's records into `MatcherCommandResult`,
`MatcherEvent`, `OrderState`, `OpenOrdersSnapshot` and `LastPrice`, and the
market feed's records into `BookUpdate`, `PublicTrade`, `BookSnapshot` and
`MarketDataBatch`. The same encoder serves live egress and resumes (`events_from`,
`book_updates_from`, `trades_from`), so a subscriber sees identical messages either
way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from google.protobuf.message import DecodeError

from protos.oms.v1 import matcher_pb2
from services.matcher.core.commands import (
    CancelCommand,
    Command,
    CommandResult,
    EmptyCommand,
    HaltCommand,
    KillSwitchCommand,
    ResumeCommand,
    SubmitCommand,
)
from services.matcher.core.errors import MatcherError
from services.matcher.core.event_log import (
    AcceptedEvent,
    CancelledEvent,
    EventRecord,
    FillEvent,
    RejectedEvent,
)
from services.matcher.core.market_feed import (
    BookLevel,
    BookSnapshot,
    BookUpdate,
    MarketRecord,
    PublicTrade,
)
from services.matcher.core.order_ids import parse_order_id
from services.matcher.core.orders import BUY, OPEN, OrderSpec, OrderView, new_record
from services.matcher.core.settings import SymbolSettings
from services.matcher.core.symbols import LastTrade


class CommandDecodeError(MatcherError, ValueError):
    """Bytes that are not a `MatcherCommandBatch` this matcher accepts."""


# --- inbound ----------------------------------------------------------------------------


def decode_command_batch(data: bytes, max_commands: int) -> list[Command]:
    try:
        batch = matcher_pb2.MatcherCommandBatch.FromString(data)
    except (DecodeError, ValueError) as error:
        raise CommandDecodeError(f"not a MatcherCommandBatch: {error}") from error
    messages = batch.commands
    if len(messages) > max_commands:
        raise CommandDecodeError(f"{len(messages)} commands in one batch, limit {max_commands}")
    commands: list[Command] = []
    append = commands.append
    for message in messages:
        if message.WhichOneof("command") == "submit":  # decode_command, its common case
            spec = spec_from_order(message.submit.order)
            append(new_record(SubmitCommand, (message.correlation_id, spec)))
        else:
            append(decode_command(message))
    return commands


def decode_command(message: matcher_pb2.MatcherCommand) -> Command:
    which = message.WhichOneof("command")
    correlation_id = message.correlation_id
    if which == "submit":
        return new_record(SubmitCommand, (correlation_id, spec_from_order(message.submit.order)))
    if which == "cancel":
        cancel = message.cancel
        return new_record(CancelCommand, (correlation_id, cancel.order_id, cancel.user_id))
    if which == "halt":
        halt = message.halt
        return HaltCommand(correlation_id, halt.symbol, halt.cancel_resting)
    if which == "resume":
        return ResumeCommand(correlation_id, message.resume.symbol)
    if which == "kill_switch":
        kill_switch = message.kill_switch
        return KillSwitchCommand(correlation_id, kill_switch.user_id, kill_switch.enable)
    return EmptyCommand(correlation_id)


def spec_from_order(order: matcher_pb2.Order) -> OrderSpec:
    order_id = order.order_id
    user_id = order.user_id
    parsed = parse_order_id(order_id, user_id)
    oms_shard, user_seq = ("", 0) if parsed is None else parsed
    # Symbols repeat on every order: share one string object (its hash is then computed once).
    symbol = order.symbol
    symbol = _SYMBOLS.get(symbol) or _known_symbol(symbol)
    return new_record(
        OrderSpec,
        (
            order_id,
            user_id,
            symbol,
            order.side,
            order.order_type,
            order.time_in_force,
            order.price_ticks,
            order.quantity_lots,
            order.quote_amount,
            order.expire_at_ms,
            order.self_trade_prevention,
            oms_shard,
            user_seq,
        ),
    )


# A bounded memo of symbol strings: which object holds a name changes nothing but speed.
_SYMBOLS: dict[str, str] = {}
_MAX_SYMBOLS = 4096


def _known_symbol(symbol: str) -> str:
    if len(_SYMBOLS) < _MAX_SYMBOLS:
        _SYMBOLS[symbol] = symbol
    return symbol


def symbol_settings_from_config(config: matcher_pb2.SymbolConfig) -> SymbolSettings:
    return SymbolSettings(
        symbol=config.symbol,
        base_asset=config.base_asset,
        quote_asset=config.quote_asset,
        lot_size=config.lot_size,
        tick_size=config.tick_size,
        min_notional=config.min_notional,
        price_band_bps=config.price_band_bps,
        reference_price_ticks=config.reference_price_ticks,
        maker_fee_ppm=config.maker_fee_ppm,
        taker_fee_ppm=config.taker_fee_ppm,
    )


# --- outbound ---------------------------------------------------------------------------


def symbol_config_message(settings: SymbolSettings) -> matcher_pb2.SymbolConfig:
    return matcher_pb2.SymbolConfig(
        symbol=settings.symbol,
        base_asset=settings.base_asset,
        quote_asset=settings.quote_asset,
        lot_size=settings.lot_size,
        tick_size=settings.tick_size,
        min_notional=settings.min_notional,
        price_band_bps=settings.price_band_bps,
        reference_price_ticks=settings.reference_price_ticks,
        maker_fee_ppm=settings.maker_fee_ppm,
        taker_fee_ppm=settings.taker_fee_ppm,
    )


# Messages are filled field by field: with the upb backend that is about twice as
# fast as keyword construction, and proto3 zero values are simply not set. Enum fields
# take the records' plain ints (`type: ignore[assignment]` rather than a `cast` call).


def fill_order(target: matcher_pb2.Order, spec: OrderSpec) -> None:
    (
        order_id,
        user_id,
        symbol,
        side,
        order_type,
        time_in_force,
        price_ticks,
        quantity_lots,
        quote_amount,
        expire_at_ms,
        self_trade_prevention,
        _,
        _,
    ) = spec
    target.order_id = order_id
    target.user_id = user_id
    target.symbol = symbol
    target.side = side  # type: ignore[assignment]
    target.order_type = order_type  # type: ignore[assignment]
    if time_in_force:
        target.time_in_force = time_in_force  # type: ignore[assignment]
    if price_ticks:
        target.price_ticks = price_ticks
    if quantity_lots:
        target.quantity_lots = quantity_lots
    if quote_amount:
        target.quote_amount = quote_amount
    if expire_at_ms:
        target.expire_at_ms = expire_at_ms
    if self_trade_prevention:
        target.self_trade_prevention = self_trade_prevention  # type: ignore[assignment]


def fill_order_state(target: matcher_pb2.OrderState, view: OrderView) -> None:
    spec, status, filled_lots, remaining_lots, filled_notional, fees_paid, quote_spent = view
    fill_order(target.order, spec)
    target.status = status  # type: ignore[assignment]
    if filled_lots:
        target.filled_lots = filled_lots
    if remaining_lots:
        target.remaining_lots = remaining_lots
    if filled_notional:
        target.filled_notional = filled_notional
    if fees_paid:
        target.fees_paid = fees_paid
    if quote_spent:
        target.quote_spent = quote_spent


def order_message(spec: OrderSpec) -> matcher_pb2.Order:
    message = matcher_pb2.Order()
    fill_order(message, spec)
    return message


def order_state_message(view: OrderView) -> matcher_pb2.OrderState:
    message = matcher_pb2.OrderState()
    fill_order_state(message, view)
    return message


def fill_result(target: matcher_pb2.MatcherCommandResult, result: CommandResult) -> None:
    correlation_id, duplicate, order, reject_reason, not_found = result
    if correlation_id:
        target.correlation_id = correlation_id
    if duplicate:
        target.duplicate = True
    if order is not None:
        fill_order_state(target.order, order)
    if reject_reason:
        target.reject_reason = reject_reason  # type: ignore[assignment]
    if not_found:
        target.not_found = True


def result_message(result: CommandResult) -> matcher_pb2.MatcherCommandResult:
    message = matcher_pb2.MatcherCommandResult()
    fill_result(message, result)
    return message


def result_batch_message(results: Sequence[CommandResult]) -> matcher_pb2.MatcherResultBatch:
    batch = matcher_pb2.MatcherResultBatch()
    add = batch.results.add
    for correlation_id, duplicate, order, reject_reason, not_found in results:
        # fill_result and fill_order_state, inlined: this runs once per command.
        target = add()
        if correlation_id:
            target.correlation_id = correlation_id
        if duplicate:
            target.duplicate = True
        if order is not None:
            spec, status, filled_lots, remaining_lots, filled_notional, fees_paid, quote_spent = (
                order
            )
            state = target.order
            fill_order(state.order, spec)
            state.status = status  # type: ignore[assignment]
            if filled_lots:
                state.filled_lots = filled_lots
            if remaining_lots:
                state.remaining_lots = remaining_lots
            if filled_notional:
                state.filled_notional = filled_notional
            if fees_paid:
                state.fees_paid = fees_paid
            if quote_spent:
                state.quote_spent = quote_spent
        if reject_reason:
            target.reject_reason = reject_reason  # type: ignore[assignment]
        if not_found:
            target.not_found = True
    return batch


def fill_event(target: matcher_pb2.MatcherEvent, event: EventRecord) -> None:
    spec = event.spec
    target.sequence = event.sequence
    target.oms_shard = spec.oms_shard
    target.order_id = spec.order_id
    target.user_id = spec.user_id
    target.consensus_time_ms = event.consensus_time_ms
    if isinstance(event, FillEvent):
        (
            _,
            _,
            _,
            trade_id,
            price_ticks,
            quantity_lots,
            notional,
            fee,
            maker,
            remaining_lots,
            order_done,
        ) = event
        fill = target.fill
        fill.trade_id = trade_id
        fill.symbol = spec.symbol
        fill.side = spec.side  # type: ignore[assignment]
        fill.price_ticks = price_ticks
        fill.quantity_lots = quantity_lots
        fill.notional = notional
        fill.fee = fee
        fill.maker = maker
        fill.remaining_lots = remaining_lots
        fill.order_done = order_done
    elif isinstance(event, AcceptedEvent):
        state = target.accepted.order
        fill_order(state.order, spec)
        state.status = OPEN  # type: ignore[assignment]
        state.remaining_lots = spec.quantity_lots
    elif isinstance(event, CancelledEvent):
        cancelled = target.cancelled
        cancelled.reason = event.reason  # type: ignore[assignment]
        cancelled.remaining_lots = event.remaining_lots
    elif isinstance(event, RejectedEvent):
        rejected = target.rejected
        fill_order(rejected.order, spec)
        rejected.reason = event.reason  # type: ignore[assignment]
    else:
        target.expired.remaining_lots = event.remaining_lots


def event_message(event: EventRecord) -> matcher_pb2.MatcherEvent:
    message = matcher_pb2.MatcherEvent()
    fill_event(message, event)
    return message


def event_batch_message(events: Iterable[EventRecord]) -> matcher_pb2.MatcherEventBatch:
    batch = matcher_pb2.MatcherEventBatch()
    add = batch.events.add
    for event in events:
        fill_event(add(), event)
    return batch


def open_orders_message(
    as_of_sequence: int, views: list[OrderView]
) -> matcher_pb2.OpenOrdersSnapshot:
    return matcher_pb2.OpenOrdersSnapshot(
        as_of_sequence=as_of_sequence, orders=[order_state_message(view) for view in views]
    )


def last_price_message(trade: LastTrade) -> matcher_pb2.LastPrice:
    return matcher_pb2.LastPrice(
        symbol=trade.symbol,
        price_ticks=trade.price_ticks,
        trade_id=trade.trade_id,
        consensus_time_ms=trade.consensus_time_ms,
    )


# --- market data ------------------------------------------------------------------------


def fill_book_update(target: matcher_pb2.BookUpdate, update: BookUpdate) -> None:
    symbol, book_sequence, consensus_time_ms, status, levels = update
    target.symbol = symbol
    target.book_sequence = book_sequence
    target.consensus_time_ms = consensus_time_ms
    target.status = status  # type: ignore[assignment]
    add_bid = target.bids.add
    add_ask = target.asks.add
    for side, price_ticks, total_lots, order_count in levels:
        level = add_bid() if side == BUY else add_ask()
        level.price_ticks = price_ticks
        if total_lots:
            level.total_lots = total_lots
        if order_count:
            level.order_count = order_count


def book_update_message(update: BookUpdate) -> matcher_pb2.BookUpdate:
    message = matcher_pb2.BookUpdate()
    fill_book_update(message, update)
    return message


def fill_public_trade(target: matcher_pb2.PublicTrade, trade: PublicTrade) -> None:
    (
        symbol,
        trade_sequence,
        trade_id,
        price_ticks,
        quantity_lots,
        taker_side,
        consensus_time_ms,
    ) = trade
    target.symbol = symbol
    target.trade_sequence = trade_sequence
    target.trade_id = trade_id
    target.price_ticks = price_ticks
    target.quantity_lots = quantity_lots
    target.taker_side = taker_side  # type: ignore[assignment]
    target.consensus_time_ms = consensus_time_ms


def public_trade_message(trade: PublicTrade) -> matcher_pb2.PublicTrade:
    message = matcher_pb2.PublicTrade()
    fill_public_trade(message, trade)
    return message


def market_data_batch_message(records: Iterable[MarketRecord]) -> matcher_pb2.MarketDataBatch:
    """One entry's market data: its trades, then its book updates, each in the order
    published (per symbol in symbol order)."""
    batch = matcher_pb2.MarketDataBatch()
    add_trade = batch.trades.add
    add_update = batch.book_updates.add
    for record in records:
        if isinstance(record, PublicTrade):
            fill_public_trade(add_trade(), record)
        else:
            fill_book_update(add_update(), record)
    return batch


def _fill_levels(target: Iterable[BookLevel], add: Callable[[], matcher_pb2.BookLevel]) -> None:
    for price_ticks, total_lots, order_count in target:
        level = add()
        level.price_ticks = price_ticks
        level.total_lots = total_lots
        level.order_count = order_count


def book_snapshot_message(symbol: str, snapshot: BookSnapshot) -> matcher_pb2.BookSnapshot:
    book_sequence, trade_sequence, status, bids, asks, last_trade_id, time_ms, price = snapshot
    message = matcher_pb2.BookSnapshot(symbol=symbol)
    if price:
        message.last_price_ticks = price
    if last_trade_id:
        message.last_trade_id = last_trade_id
    if time_ms:
        message.consensus_time_ms = time_ms
    if book_sequence:
        message.book_sequence = book_sequence
    if trade_sequence:
        message.trade_sequence = trade_sequence
    message.status = status  # type: ignore[assignment]
    _fill_levels(bids, message.bids.add)
    _fill_levels(asks, message.asks.add)
    return message
