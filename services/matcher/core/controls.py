"""Commands that end or stop orders rather than submit them: cancel, halt, resume, kill switch."""

from __future__ import annotations

from services.matcher.core.commands import (
    CancelCommand,
    CommandResult,
    HaltCommand,
    KillSwitchCommand,
    ResumeCommand,
)
from services.matcher.core.engine_state import HALT, KILL_SWITCH, REQUESTED, EngineState
from services.matcher.core.errors import MatcherInvariantError
from services.matcher.core.event_log import CANCELLED as CANCELLED_KIND
from services.matcher.core.event_log import CancelledEvent, EventRecord
from services.matcher.core.orders import BUY, CANCELLED, GTD, LAST_LIVE, OrderView, new_record
from services.matcher.core.state_digest import (
    CANCELLED_STATUS_DIGEST,
    FINISH,
    M_END,
    M_FEES,
    M_FILLED,
    M_NOTIONAL,
    M_REMAINING,
    M_SPENT,
    MASK,
)
from services.matcher.core.validation import UNKNOWN_SYMBOL


def cancel(
    state: EngineState, command: CancelCommand, now: int, events: list[EventRecord]
) -> CommandResult:
    correlation_id, order_id, user_id = command
    order = state.dedup.orders.get(order_id)
    if order is None or order.user_id != user_id:
        return new_record(CommandResult, (correlation_id, False, None, 0, True))
    if order.status > LAST_LIVE:
        return new_record(CommandResult, (correlation_id, False, order.view(), 0, False))
    # EngineState.cancel_resting(order, CANCELLED, REQUESTED, ...), inlined. `retire`: a live
    # record is OPEN or PARTIALLY_FILLED, both of which may move to CANCELLED.
    order.status = CANCELLED
    order.end_time_ms = now
    state.dedup.finished.append(order)
    user_orders = state.user_orders
    by_user = user_orders.get(user_id)
    if by_user is None or by_user.pop(order_id, None) is not order:
        raise MatcherInvariantError(f"resting order {order_id} is not indexed")
    if not by_user:
        del user_orders[user_id]
    spec = order.spec
    if spec.time_in_force == GTD:
        state.expiries.note_finished()
    book = state.books[spec.symbol]
    (book.bids if order.side == BUY else book.asks).withdraw(order)
    # EngineState.emit_cancelled(order, REQUESTED, ...)
    stream = order.stream
    sequence = stream.next_sequence
    stream.next_sequence = sequence + 1
    remaining = order.remaining_lots
    events.append(new_record(CancelledEvent, (sequence, now, spec, REQUESTED, remaining)))
    stream.retained.append((CANCELLED_KIND, sequence, now, REQUESTED, remaining) + spec)  # noqa: RUF005
    # EngineState.rehash(order): state_digest.order_digest, inlined
    filled = order.filled_lots
    notional = order.filled_notional
    fees = order.fees_paid
    spent = order.quote_spent
    value = (
        order.key_digest
        + CANCELLED_STATUS_DIGEST
        + remaining * M_REMAINING
        + filled * M_FILLED
        + notional * M_NOTIONAL
        + fees * M_FEES
        + spent * M_SPENT
        + now * M_END
    ) & MASK
    value = ((value ^ (value >> 32)) * FINISH) & MASK
    digest = value ^ (value >> 29)
    state.digest_sum = (state.digest_sum + digest - order.digest) & MASK
    order.digest = digest
    view = new_record(OrderView, (spec, CANCELLED, filled, remaining, notional, fees, spent))
    return new_record(CommandResult, (correlation_id, False, view, 0, False))


def halt(
    state: EngineState, command: HaltCommand, now: int, events: list[EventRecord]
) -> CommandResult:
    book = state.books.get(command.symbol)
    if book is None:
        return CommandResult(command.correlation_id, False, None, UNKNOWN_SYMBOL, False)
    book.halted = True
    if command.cancel_resting:
        for order in list(book.resting_orders()):
            state.cancel_resting(order, CANCELLED, HALT, now, events)
    return CommandResult(command.correlation_id, False, None, 0, False)


def resume(state: EngineState, command: ResumeCommand) -> CommandResult:
    book = state.books.get(command.symbol)
    if book is None:
        return CommandResult(command.correlation_id, False, None, UNKNOWN_SYMBOL, False)
    book.halted = False
    return CommandResult(command.correlation_id, False, None, 0, False)


def kill_switch(
    state: EngineState, command: KillSwitchCommand, now: int, events: list[EventRecord]
) -> CommandResult:
    user_id = command.user_id
    if command.enable:
        state.kill_switched[user_id] = None
        for order in list(state.user_orders.get(user_id, {}).values()):
            state.cancel_resting(order, CANCELLED, KILL_SWITCH, now, events)
    else:
        state.kill_switched.pop(user_id, None)
    return CommandResult(command.correlation_id, False, None, 0, False)
