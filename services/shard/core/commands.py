"""Commands the shard applies, already decoded from `oms.v1.ShardCommand`.

Commands are immutable NamedTuples rather than frozen dataclasses: the bytes
path builds one per logged command on the apply loop, and a NamedTuple is built
several times faster. Being tuples, two commands of different types with equal
fields compare equal: compare types too when that matters.

Units: price in ticks, quantity in lots, amounts in the asset's minor units,
times in consensus milliseconds.
"""

from __future__ import annotations

from typing import NamedTuple

from services.shard.core.risk import RiskLimits
from services.shard.core.user_state import RecentResult, UserState


class PlaceOrder(NamedTuple):
    correlation_id: int
    user_id: int
    client_order_id: str
    symbol: str
    side: int
    order_type: int
    time_in_force: int
    price_ticks: int
    quantity_lots: int
    quote_amount: int  # market buy: spend including fee
    expire_at_ms: int
    self_trade_prevention: int
    routing_epoch: int
    # W3C traceparent of a sampled order: logged with it and handed to the matcher
    # request, never decided on (replicas that ignore it apply identically).
    trace_parent: str = ""
    # The cancel-on-disconnect session it is placed on (0: none; version 3).
    session_id: int = 0


class CancelOrder(NamedTuple):
    correlation_id: int
    user_id: int
    order_id: str  # either the order id ...
    client_order_id: str  # ... or the client's id of the order
    routing_epoch: int


class CancelAllOrders(NamedTuple):
    """Cancel every open order of the user, or of one symbol ("": every symbol's)."""

    correlation_id: int
    user_id: int
    symbol: str
    routing_epoch: int


class CancelAllAfter(NamedTuple):
    """A dead man's switch: cancel every live order `timeout_ms` of consensus time from
    now unless called again first; 0 disarms it."""

    correlation_id: int
    user_id: int
    timeout_ms: int
    routing_epoch: int


class KeepSession(NamedTuple):
    """Open, or keep alive, a cancel-on-disconnect session for `timeout_ms` from now."""

    correlation_id: int
    user_id: int
    session_id: int
    timeout_ms: int
    routing_epoch: int


class EndSession(NamedTuple):
    """End a session: cleanly, or cancelling its live orders."""

    correlation_id: int
    user_id: int
    session_id: int
    cancel_orders: bool
    routing_epoch: int


class Deposit(NamedTuple):
    correlation_id: int
    user_id: int
    asset: str
    amount: int
    transfer_id: str


class Withdraw(NamedTuple):
    correlation_id: int
    user_id: int
    asset: str
    amount: int
    transfer_id: str


class HydrateUser(NamedTuple):
    correlation_id: int
    user_id: int
    epoch: int
    known: bool
    state: UserState | None


class FlushComplete(NamedTuple):
    correlation_id: int
    user_id: int
    epoch: int
    db_version: int


class FlushRefused(NamedTuple):
    correlation_id: int
    user_id: int
    epoch: int
    reason: str


class MatcherEvent(NamedTuple):
    """One lifecycle event of one order; fields that do not apply to `kind` are zero."""

    sequence: int
    oms_shard: str
    order_id: str
    user_id: int
    kind: int  # EventKind
    trade_id: int = 0
    symbol: str = ""
    side: int = 0
    price_ticks: int = 0
    quantity_lots: int = 0
    notional: int = 0
    fee: int = 0
    maker: bool = False
    remaining_lots: int = 0
    order_done: bool = False
    reason: int = 0  # matcher reject reason or cancel reason


class MatcherEvents(NamedTuple):
    correlation_id: int
    matcher_group: str
    events: tuple[MatcherEvent, ...]


class MarkPrices(NamedTuple):
    correlation_id: int
    prices: tuple[tuple[str, int], ...]  # (symbol, price_ticks), newest per symbol


class ReconciledOrder(NamedTuple):
    """The matcher's view of one open order (from `oms.v1.OrderState`)."""

    order_id: str
    symbol: str
    side: int
    status: int
    remaining_lots: int


class Reconcile(NamedTuple):
    correlation_id: int
    user_id: int
    matcher_group: str
    as_of_sequence: int
    open_orders: tuple[ReconciledOrder, ...]


class DedupAnswer(NamedTuple):
    correlation_id: int
    user_id: int
    client_order_id: str
    seen: bool
    original: RecentResult | None


class SetRiskLimits(NamedTuple):
    correlation_id: int
    user_id: int
    limits: RiskLimits
    clear_reduce_only: bool
    operator: str = ""  # who asked (the admin key id), for the audit
    note: str = ""  # why, in the operator's words
    request_id: str = ""  # the admin request's id: its retries are answered, not redone
    if_control_version: int | None = None  # decided only at this control version


class UserControl(NamedTuple):
    """An operator's control of one user: halt or resume trading, or restart the actor."""

    correlation_id: int
    user_id: int
    action: int  # UserControlAction
    operator: str
    note: str
    request_id: str = ""  # the admin request's id: its retries are answered, not redone
    if_control_version: int | None = None  # decided only at this control version


class SetRouting(NamedTuple):
    """A routing document (its canonical bytes) of a newer epoch than the shard's."""

    correlation_id: int
    document: bytes


class Persisted(NamedTuple):
    """The persister's cursor: the log is in PostgreSQL through `through_position`."""

    correlation_id: int
    through_position: int


class MalformedCommand(NamedTuple):
    """A batch item that decoded as protobuf but is not a command (no oneof, bad fields)."""

    correlation_id: int
    detail: str


Command = (
    PlaceOrder
    | CancelOrder
    | CancelAllOrders
    | CancelAllAfter
    | KeepSession
    | EndSession
    | Deposit
    | Withdraw
    | HydrateUser
    | FlushComplete
    | FlushRefused
    | MatcherEvents
    | MarkPrices
    | Reconcile
    | DedupAnswer
    | SetRiskLimits
    | UserControl
    | SetRouting
    | Persisted
    | MalformedCommand
)

# Commands a client sends; they get exactly one final ShardResult each.
ClientCommand = (
    PlaceOrder
    | CancelOrder
    | CancelAllOrders
    | CancelAllAfter
    | KeepSession
    | EndSession
    | Deposit
    | Withdraw
    | SetRiskLimits
    | UserControl
)
