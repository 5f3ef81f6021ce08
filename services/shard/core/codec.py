"""`oms.v1` protobuf at the edge of the core: commands in, egress out, user state both ways.

Inbound, `decode_command_batch` turns a `ShardCommandBatch` into core commands;
a batch item that is protobuf but not a command becomes `MalformedCommand`
(the machine answers it MALFORMED), bytes that are not a batch raise
`MalformedCommandError`. Outbound, `egress_to_protobuf` turns core egress into
`ShardEgress`, stamped with the log position and consensus time of the entry
that produced it. The command encoders serve tests, benchmarks and the
service's own ingress adapters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeAlias

from google.protobuf.message import DecodeError

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2
from services.shard.core.commands import (
    CancelAllAfter,
    CancelAllOrders,
    CancelOrder,
    Command,
    DedupAnswer,
    Deposit,
    EndSession,
    FlushComplete,
    FlushRefused,
    HydrateUser,
    KeepSession,
    MalformedCommand,
    MarkPrices,
    MatcherEvent,
    MatcherEvents,
    Persisted,
    PlaceOrder,
    Reconcile,
    ReconciledOrder,
    SetRiskLimits,
    SetRouting,
    UserControl,
    Withdraw,
)
from services.shard.core.egress import (
    BeginDehydrate,
    CancelToMatcher,
    DedupLookup,
    Egress,
    FillRecord,
    HydrateRequest,
    LedgerPosting,
    OperatorAudit,
    OrderUpdate,
    RiskAlert,
    ShardResult,
    SubmitToMatcher,
)
from services.shard.core.errors import MalformedCommandError
from services.shard.core.risk import RiskLimits
from services.shard.core.user_state import PositionState, RecentResult, UserState
from services.shard.core.vocabulary import LIMIT, EventKind, TimeInForce

MAX_COMMANDS_PER_BATCH = 100_000
MAX_TRACE_PARENT_CHARS = 64  # a W3C traceparent is 55

_Side: TypeAlias = common_pb2.Side.ValueType
_OrderType: TypeAlias = common_pb2.OrderType.ValueType
_TimeInForce: TypeAlias = common_pb2.TimeInForce.ValueType
_OrderStatus: TypeAlias = common_pb2.OrderStatus.ValueType
_SelfTrade: TypeAlias = matcher_pb2.SelfTradePrevention.ValueType
_MatcherReason: TypeAlias = matcher_pb2.MatcherRejectReason.ValueType
_CancelReason: TypeAlias = matcher_pb2.CancelReason.ValueType
_ShardReason: TypeAlias = shard_pb2.ShardRejectReason.ValueType
_Tier: TypeAlias = shard_pb2.UserTier.ValueType

_ACCEPTED = int(EventKind.ACCEPTED)
_REJECTED = int(EventKind.REJECTED)
_FILL = int(EventKind.FILL)
_CANCELLED = int(EventKind.CANCELLED)
_EXPIRED = int(EventKind.EXPIRED)
_make_place = PlaceOrder._make
_make_event = MatcherEvent._make

_GTC = int(TimeInForce.GTC)


# --- inbound ----------------------------------------------------------------------------


def decode_command_batch(data: bytes) -> list[Command]:
    try:
        batch = shard_pb2.ShardCommandBatch.FromString(data)
    except (DecodeError, ValueError) as error:
        raise MalformedCommandError(f"not a ShardCommandBatch: {error}") from error
    messages = batch.commands
    if len(messages) > MAX_COMMANDS_PER_BATCH:
        raise MalformedCommandError(f"{len(messages)} commands in one batch")
    return [decode_command(message) for message in messages]


def decode_command(message: shard_pb2.ShardCommand) -> Command:
    which = message.WhichOneof("command")
    correlation_id = message.correlation_id
    if which == "place":
        p = message.place
        if len(p.trace_parent) > MAX_TRACE_PARENT_CHARS:
            return MalformedCommand(correlation_id, "trace_parent longer than a traceparent")
        return _make_place(
            (
                correlation_id,
                p.user_id,
                p.client_order_id,
                p.symbol,
                p.side,
                p.order_type,
                p.time_in_force,
                p.price_ticks,
                p.quantity_lots,
                p.quote_amount,
                p.expire_at_ms,
                p.self_trade_prevention,
                p.routing_epoch,
                p.trace_parent,
                p.session_id,
            )
        )
    if which == "matcher_events":
        batch = message.matcher_events
        events = []
        for event in batch.events:
            decoded = decode_matcher_event(event)
            if decoded is None:
                return MalformedCommand(correlation_id, f"event {event.sequence} has no payload")
            events.append(decoded)
        return MatcherEvents(correlation_id, batch.matcher_group, tuple(events))
    if which == "cancel":
        c = message.cancel
        return CancelOrder(
            correlation_id, c.user_id, c.order_id, c.client_order_id, c.routing_epoch
        )
    if which == "cancel_all":
        every = message.cancel_all
        return CancelAllOrders(correlation_id, every.user_id, every.symbol, every.routing_epoch)
    if which == "cancel_all_after":
        switch = message.cancel_all_after
        return CancelAllAfter(
            correlation_id, switch.user_id, switch.timeout_ms, switch.routing_epoch
        )
    if which == "keep_session":
        keep = message.keep_session
        return KeepSession(
            correlation_id, keep.user_id, keep.session_id, keep.timeout_ms, keep.routing_epoch
        )
    if which == "end_session":
        end = message.end_session
        return EndSession(
            correlation_id, end.user_id, end.session_id, end.cancel_orders, end.routing_epoch
        )
    if which == "deposit":
        d = message.deposit
        return Deposit(correlation_id, d.user_id, d.asset, d.amount, d.transfer_id)
    if which == "withdraw":
        w = message.withdraw
        return Withdraw(correlation_id, w.user_id, w.asset, w.amount, w.transfer_id)
    if which == "hydrate":
        h = message.hydrate
        state = user_state_from_protobuf(h.state) if h.HasField("state") else None
        return HydrateUser(correlation_id, h.user_id, h.epoch, h.known, state)
    if which == "flush_complete":
        f = message.flush_complete
        return FlushComplete(correlation_id, f.user_id, f.epoch, f.db_version)
    if which == "flush_refused":
        r = message.flush_refused
        return FlushRefused(correlation_id, r.user_id, r.epoch, r.reason)
    if which == "mark_prices":
        prices = tuple((m.symbol, m.price_ticks) for m in message.mark_prices.prices)
        return MarkPrices(correlation_id, prices)
    if which == "reconcile":
        rc = message.reconcile
        orders = tuple(
            ReconciledOrder(
                o.order.order_id, o.order.symbol, o.order.side, o.status, o.remaining_lots
            )
            for o in rc.open_orders
        )
        return Reconcile(correlation_id, rc.user_id, rc.matcher_group, rc.as_of_sequence, orders)
    if which == "dedup_answer":
        a = message.dedup_answer
        original = recent_from_protobuf(a.original) if a.HasField("original") else None
        return DedupAnswer(correlation_id, a.user_id, a.client_order_id, a.seen, original)
    if which == "set_risk_limits":
        s = message.set_risk_limits
        return SetRiskLimits(
            correlation_id,
            s.user_id,
            limits_from_protobuf(s.limits),
            s.clear_reduce_only,
            s.operator,
            s.note,
            s.request_id,
            s.if_control_version if s.HasField("if_control_version") else None,
        )
    if which == "user_control":
        control = message.user_control
        return UserControl(
            correlation_id,
            control.user_id,
            control.action,
            control.operator,
            control.note,
            control.request_id,
            control.if_control_version if control.HasField("if_control_version") else None,
        )
    if which == "set_routing":
        return SetRouting(correlation_id, message.set_routing.document)
    if which == "persisted":
        return Persisted(correlation_id, message.persisted.through_position)
    return MalformedCommand(correlation_id, "no command set")


def decode_matcher_event(event: matcher_pb2.MatcherEvent) -> MatcherEvent | None:
    which = event.WhichOneof("event")
    head = (event.sequence, event.oms_shard, event.order_id, event.user_id)
    if which == "fill":
        f = event.fill
        return _make_event(
            (
                *head,
                _FILL,
                f.trade_id,
                f.symbol,
                f.side,
                f.price_ticks,
                f.quantity_lots,
                f.notional,
                f.fee,
                f.maker,
                f.remaining_lots,
                f.order_done,
                0,
            )
        )
    # Positional, every field: a NamedTuple's keyword/default path costs several times more.
    if which == "accepted":
        return _make_event((*head, _ACCEPTED, 0, "", 0, 0, 0, 0, 0, False, 0, False, 0))
    if which == "cancelled":
        c = event.cancelled
        return _make_event(
            (*head, _CANCELLED, 0, "", 0, 0, 0, 0, 0, False, c.remaining_lots, False, c.reason)
        )
    if which == "rejected":
        reason = event.rejected.reason
        return _make_event((*head, _REJECTED, 0, "", 0, 0, 0, 0, 0, False, 0, False, reason))
    if which == "expired":
        remaining = event.expired.remaining_lots
        return _make_event((*head, _EXPIRED, 0, "", 0, 0, 0, 0, 0, False, remaining, False, 0))
    return None


def limits_from_protobuf(message: shard_pb2.RiskLimits) -> RiskLimits:
    return RiskLimits(
        message.max_order_notional,
        message.max_position_lots,
        message.max_open_orders,
        message.price_band_bps,
        message.max_drawdown,
    )


def recent_from_protobuf(message: shard_pb2.RecentResult) -> RecentResult:
    return RecentResult(
        message.client_order_id, message.order_id, message.reject_reason, message.accepted_at_ms
    )


def user_state_from_protobuf(message: shard_pb2.UserState) -> UserState:
    return UserState(
        message.user_id,
        message.db_version,
        message.tier,
        tuple((b.asset, b.total) for b in message.balances),
        tuple(
            PositionState(p.symbol, p.quantity_lots, p.cost_basis, p.realized_pnl)
            for p in message.positions
        ),
        message.user_seq,
        tuple(recent_from_protobuf(r) for r in message.recent),
        limits_from_protobuf(message.risk_limits),
        message.reduce_only,
        message.peak_equity,
        message.trading_halted,
        message.control_version,
        message.last_control_id,
    )


# --- outbound ---------------------------------------------------------------------------


def fill_limits(target: shard_pb2.RiskLimits, limits: RiskLimits) -> None:
    target.max_order_notional = limits.max_order_notional
    target.max_position_lots = limits.max_position_lots
    target.max_open_orders = limits.max_open_orders
    target.price_band_bps = limits.price_band_bps
    target.max_drawdown = limits.max_drawdown


def fill_recent(target: shard_pb2.RecentResult, result: RecentResult) -> None:
    target.client_order_id = result.client_order_id
    target.order_id = result.order_id
    target.reject_reason = _ShardReason(result.reject_reason)
    target.accepted_at_ms = result.accepted_at_ms


def fill_user_state(target: shard_pb2.UserState, state: UserState) -> None:
    target.user_id = state.user_id
    target.db_version = state.db_version
    target.tier = _Tier(state.tier)
    for asset, total in state.balances:
        target.balances.add(asset=asset, total=total, reserved=0)
    for position in state.positions:
        target.positions.add(
            symbol=position.symbol,
            quantity_lots=position.quantity_lots,
            cost_basis=position.cost_basis,
            realized_pnl=position.realized_pnl,
        )
    target.user_seq = state.user_seq
    for result in state.recent:
        fill_recent(target.recent.add(), result)
    fill_limits(target.risk_limits, state.risk_limits)
    target.reduce_only = state.reduce_only
    target.peak_equity = state.peak_equity
    target.trading_halted = state.trading_halted
    target.control_version = state.control_version
    target.last_control_id = state.last_control_id


def user_state_to_protobuf(state: UserState) -> shard_pb2.UserState:
    message = shard_pb2.UserState()
    fill_user_state(message, state)
    return message


def egress_to_protobuf(
    item: Egress, position: int, consensus_time_ms: int
) -> shard_pb2.ShardEgress:
    message = shard_pb2.ShardEgress()
    message.stamp.position = position
    message.stamp.consensus_time_ms = consensus_time_ms
    if isinstance(item, ShardResult):
        r = message.result
        r.correlation_id = item.correlation_id
        r.accepted = item.accepted
        r.reject_reason = _ShardReason(item.reject_reason)
        r.matcher_reason = _MatcherReason(item.matcher_reason)
        r.retryable = item.retryable
        r.duplicate = item.duplicate
        r.order_id = item.order_id
        r.status = _OrderStatus(item.status)
        r.parked = item.parked
        r.routing_epoch = item.routing_epoch
        if item.cancelled_order_ids:
            r.cancelled_order_ids.extend(item.cancelled_order_ids)
        r.already_cancelling = item.already_cancelling
        r.cancel_all_at_ms = item.cancel_all_at_ms
        r.stamp.position = position
        r.stamp.consensus_time_ms = consensus_time_ms
    elif isinstance(item, SubmitToMatcher):
        s = message.submit
        s.matcher_group = item.matcher_group
        o = s.order
        request = item.request
        o.order_id = item.order_id
        o.user_id = request.user_id
        o.symbol = request.symbol
        o.side = _Side(request.side)
        o.order_type = _OrderType(request.order_type)
        time_in_force = request.time_in_force
        if not time_in_force and request.order_type == LIMIT:
            # The shard admits a limit order without a time in force as GTC (vocabulary);
            # the matcher takes only an explicit one, and refused it INVALID_ORDER.
            time_in_force = _GTC
        o.time_in_force = _TimeInForce(time_in_force)
        o.price_ticks = request.price_ticks
        o.quantity_lots = request.quantity_lots
        o.quote_amount = request.quote_amount
        o.expire_at_ms = request.expire_at_ms
        o.self_trade_prevention = _SelfTrade(request.self_trade_prevention)
        if request.trace_parent:
            o.trace_parent = request.trace_parent
    elif isinstance(item, CancelToMatcher):
        message.cancel.matcher_group = item.matcher_group
        message.cancel.order_id = item.order_id
        message.cancel.user_id = item.user_id
    elif isinstance(item, BeginDehydrate):
        message.begin_dehydrate.user_id = item.user_id
        message.begin_dehydrate.epoch = item.epoch
        fill_user_state(message.begin_dehydrate.state, item.state)
    elif isinstance(item, HydrateRequest):
        message.hydrate_request.user_id = item.user_id
        message.hydrate_request.epoch = item.epoch
    elif isinstance(item, DedupLookup):
        message.dedup_lookup.user_id = item.user_id
        message.dedup_lookup.client_order_id = item.client_order_id
    elif isinstance(item, OrderUpdate):
        u = message.order_update
        u.user_id = item.user_id
        u.order_id = item.order_id
        u.client_order_id = item.client_order_id
        u.symbol = item.symbol
        u.status = _OrderStatus(item.status)
        u.filled_lots = item.filled_lots
        u.remaining_lots = item.remaining_lots
        u.last_fill_price_ticks = item.last_fill_price_ticks
        u.last_fill_lots = item.last_fill_lots
        u.matcher_reason = _MatcherReason(item.matcher_reason)
        u.stamp.position = position
        u.stamp.consensus_time_ms = consensus_time_ms
    elif isinstance(item, FillRecord):
        fill = message.fill
        fill.order_id = item.order_id
        fill.user_id = item.user_id
        fill.trade_id = item.trade_id
        fill.symbol = item.symbol
        fill.side = _Side(item.side)
        fill.price_ticks = item.price_ticks
        fill.quantity_lots = item.quantity_lots
        fill.fee = item.fee
        fill.maker = item.maker
    elif isinstance(item, RiskAlert):
        message.risk_alert.user_id = item.user_id
        message.risk_alert.kind = item.kind
        message.risk_alert.detail = item.detail
    elif isinstance(item, OperatorAudit):
        audit = message.operator_audit
        audit.user_id = item.user_id
        audit.operator = item.operator
        audit.action = item.action
        audit.detail = item.detail
        audit.accepted = item.accepted
        audit.reject_reason = _ShardReason(item.reject_reason)
        audit.note = item.note
    else:
        raise TypeError(f"not shard egress: {item!r}")
    return message


def egress_to_protobufs(
    item: Egress, position: int, consensus_time_ms: int
) -> list[shard_pb2.ShardEgress]:
    """One core egress record as `ShardEgress` messages: a ledger posting is one per row."""
    if isinstance(item, LedgerPosting):
        messages = []
        for user_id, account, asset, amount in item.rows:
            message = shard_pb2.ShardEgress()
            message.stamp.position = position
            message.stamp.consensus_time_ms = consensus_time_ms
            entry = message.ledger
            entry.user_id = user_id
            entry.account = account
            entry.asset = asset
            entry.amount = amount
            entry.reference = item.reference
            messages.append(message)
        return messages
    return [egress_to_protobuf(item, position, consensus_time_ms)]


def encode_egress_batch(
    items: Iterable[Egress], position: int, consensus_time_ms: int
) -> shard_pb2.ShardEgressBatch:
    batch = shard_pb2.ShardEgressBatch()
    for item in items:
        batch.items.extend(egress_to_protobufs(item, position, consensus_time_ms))
    return batch


# --- commands to protobuf (tests, benchmarks, ingress adapters) ---------------------------


def command_to_protobuf(command: Command) -> shard_pb2.ShardCommand:
    message = shard_pb2.ShardCommand(correlation_id=command.correlation_id)
    if isinstance(command, PlaceOrder):
        p = message.place
        p.user_id = command.user_id
        p.client_order_id = command.client_order_id
        p.symbol = command.symbol
        p.side = _Side(command.side)
        p.order_type = _OrderType(command.order_type)
        p.time_in_force = _TimeInForce(command.time_in_force)
        p.price_ticks = command.price_ticks
        p.quantity_lots = command.quantity_lots
        p.quote_amount = command.quote_amount
        p.expire_at_ms = command.expire_at_ms
        p.self_trade_prevention = _SelfTrade(command.self_trade_prevention)
        p.routing_epoch = command.routing_epoch
        p.trace_parent = command.trace_parent
        p.session_id = command.session_id
    elif isinstance(command, CancelOrder):
        c = message.cancel
        c.user_id = command.user_id
        c.order_id = command.order_id
        c.client_order_id = command.client_order_id
        c.routing_epoch = command.routing_epoch
    elif isinstance(command, CancelAllOrders):
        every = message.cancel_all
        every.user_id = command.user_id
        every.symbol = command.symbol
        every.routing_epoch = command.routing_epoch
    elif isinstance(command, CancelAllAfter):
        switch = message.cancel_all_after
        switch.user_id = command.user_id
        switch.timeout_ms = command.timeout_ms
        switch.routing_epoch = command.routing_epoch
    elif isinstance(command, KeepSession):
        keep = message.keep_session
        keep.user_id = command.user_id
        keep.session_id = command.session_id
        keep.timeout_ms = command.timeout_ms
        keep.routing_epoch = command.routing_epoch
    elif isinstance(command, EndSession):
        end = message.end_session
        end.user_id = command.user_id
        end.session_id = command.session_id
        end.cancel_orders = command.cancel_orders
        end.routing_epoch = command.routing_epoch
    elif isinstance(command, Deposit):
        message.deposit.user_id = command.user_id
        message.deposit.asset = command.asset
        message.deposit.amount = command.amount
        message.deposit.transfer_id = command.transfer_id
    elif isinstance(command, Withdraw):
        message.withdraw.user_id = command.user_id
        message.withdraw.asset = command.asset
        message.withdraw.amount = command.amount
        message.withdraw.transfer_id = command.transfer_id
    elif isinstance(command, HydrateUser):
        h = message.hydrate
        h.user_id = command.user_id
        h.epoch = command.epoch
        h.known = command.known
        if command.state is not None:
            fill_user_state(h.state, command.state)
    elif isinstance(command, FlushComplete):
        message.flush_complete.user_id = command.user_id
        message.flush_complete.epoch = command.epoch
        message.flush_complete.db_version = command.db_version
    elif isinstance(command, FlushRefused):
        message.flush_refused.user_id = command.user_id
        message.flush_refused.epoch = command.epoch
        message.flush_refused.reason = command.reason
    elif isinstance(command, MatcherEvents):
        message.matcher_events.matcher_group = command.matcher_group
        for event in command.events:
            fill_matcher_event(message.matcher_events.events.add(), event)
    elif isinstance(command, MarkPrices):
        for symbol, price in command.prices:
            message.mark_prices.prices.add(symbol=symbol, price_ticks=price)
    elif isinstance(command, Reconcile):
        rc = message.reconcile
        rc.user_id = command.user_id
        rc.matcher_group = command.matcher_group
        rc.as_of_sequence = command.as_of_sequence
        for order in command.open_orders:
            entry = rc.open_orders.add()
            entry.order.order_id = order.order_id
            entry.order.symbol = order.symbol
            entry.order.side = _Side(order.side)
            entry.status = _OrderStatus(order.status)
            entry.remaining_lots = order.remaining_lots
    elif isinstance(command, DedupAnswer):
        a = message.dedup_answer
        a.user_id = command.user_id
        a.client_order_id = command.client_order_id
        a.seen = command.seen
        if command.original is not None:
            fill_recent(a.original, command.original)
    elif isinstance(command, SetRiskLimits):
        message.set_risk_limits.user_id = command.user_id
        fill_limits(message.set_risk_limits.limits, command.limits)
        message.set_risk_limits.clear_reduce_only = command.clear_reduce_only
        message.set_risk_limits.operator = command.operator
        message.set_risk_limits.note = command.note
        message.set_risk_limits.request_id = command.request_id
        if command.if_control_version is not None:
            message.set_risk_limits.if_control_version = command.if_control_version
    elif isinstance(command, UserControl):
        control = message.user_control
        control.user_id = command.user_id
        control.action = shard_pb2.UserControlAction.ValueType(command.action)
        control.operator = command.operator
        control.note = command.note
        control.request_id = command.request_id
        if command.if_control_version is not None:
            control.if_control_version = command.if_control_version
    elif isinstance(command, SetRouting):
        message.set_routing.document = command.document
    elif isinstance(command, Persisted):
        message.persisted.through_position = command.through_position
    # MalformedCommand: an empty ShardCommand, which decodes back to MalformedCommand.
    return message


def fill_matcher_event(target: matcher_pb2.MatcherEvent, event: MatcherEvent) -> None:
    target.sequence = event.sequence
    target.oms_shard = event.oms_shard
    target.order_id = event.order_id
    target.user_id = event.user_id
    kind = event.kind
    if kind == _FILL:
        f = target.fill
        f.trade_id = event.trade_id
        f.symbol = event.symbol
        f.side = _Side(event.side)
        f.price_ticks = event.price_ticks
        f.quantity_lots = event.quantity_lots
        f.notional = event.notional
        f.fee = event.fee
        f.maker = event.maker
        f.remaining_lots = event.remaining_lots
        f.order_done = event.order_done
    elif kind == _ACCEPTED:
        target.accepted.order.order.order_id = event.order_id
    elif kind == _REJECTED:
        target.rejected.order.order_id = event.order_id
        target.rejected.reason = _MatcherReason(event.reason)
    elif kind == _CANCELLED:
        target.cancelled.reason = _CancelReason(event.reason)
        target.cancelled.remaining_lots = event.remaining_lots
    elif kind == _EXPIRED:
        target.expired.remaining_lots = event.remaining_lots
    else:
        raise ValueError(f"unknown matcher event kind {kind}")


def encode_command_batch(commands: Sequence[Command]) -> bytes:
    batch = shard_pb2.ShardCommandBatch()
    batch.commands.extend(command_to_protobuf(command) for command in commands)
    return batch.SerializeToString()
