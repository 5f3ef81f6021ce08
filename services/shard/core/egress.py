"""What the shard asks of the outside, mirroring `oms.v1.ShardEgress` items.

The runtime releases egress only once its log position is durable, and only
from the leader; `codec.egress_to_protobuf` stamps each item with the position
and consensus time of the entry that produced it. Built positionally on the
hot paths. Records are NamedTuples, like the commands: a frozen dataclass
assigns each field through `object.__setattr__`, and a ten-field `OrderUpdate`
cost 2.8 µs to build against 0.7 µs as a NamedTuple, with two or three records
per command. Being tuples, records of different types with equal fields compare
equal: compare types too when that matters.
"""

from __future__ import annotations

from typing import NamedTuple

from services.shard.core.commands import PlaceOrder
from services.shard.core.user_state import UserState


class ShardResult(NamedTuple):
    """The answer to one command, correlated by the command's id."""

    correlation_id: int
    accepted: bool
    reject_reason: int = 0  # RejectReason
    matcher_reason: int = 0
    retryable: bool = False
    duplicate: bool = False  # the original result of an earlier identical command
    order_id: str = ""
    status: int = 0  # OrderStatus
    parked: bool = False  # waiting for hydration or a DB dedup answer; a final result follows
    routing_epoch: int = 0  # with NOT_OWNER: the epoch the shard decided under
    cancelled_order_ids: tuple[str, ...] = ()  # an accepted cancel-all's cancels sent
    already_cancelling: int = 0  # an accepted cancel-all's orders with a cancel in flight
    cancel_all_at_ms: int = 0  # an accepted cancel-all-after's switch time (0: disarmed)


class SubmitToMatcher(NamedTuple):
    """Send an admitted order to its matcher group under its deterministic id.

    `request` is the client's command as admitted (immutable, shared with the
    order, not copied): user, symbol, side, type, time in force, price,
    quantity, quote amount, expiry and self-trade prevention. Its correlation
    id, client order id and routing epoch are not the matcher's business.
    """

    matcher_group: str
    order_id: str
    request: PlaceOrder


class CancelToMatcher(NamedTuple):
    matcher_group: str
    order_id: str
    user_id: int


class BeginDehydrate(NamedTuple):
    user_id: int
    epoch: int
    state: UserState


class HydrateRequest(NamedTuple):
    user_id: int
    epoch: int


class DedupLookup(NamedTuple):
    user_id: int
    client_order_id: str


class OrderUpdate(NamedTuple):
    """An order row for the write-behind and the client's order-update stream."""

    user_id: int
    order_id: str
    client_order_id: str
    symbol: str
    status: int
    filled_lots: int
    remaining_lots: int
    last_fill_price_ticks: int = 0
    last_fill_lots: int = 0
    matcher_reason: int = 0


# Ledger account names (LedgerEntry.account)
USER_ACCOUNT = "user"
CLEARING_ACCOUNT = "clearing"
FEES_ACCOUNT = "fees"
EXTERNAL_ACCOUNT = "external"


# One ledger row: (user id or 0 for shard accounts, account, asset, signed amount).
LedgerRow = tuple[int, str, str, int]


class LedgerPosting(NamedTuple):
    """One double-entry journal entry: its rows sum to zero per asset.

    The codec turns each row into one `oms.v1.LedgerEntry` carrying `reference`
    (trade or transfer id). Grouping the rows of one movement keeps the
    balance of the entry checkable as a unit and costs one record instead of
    four or five on the fill path.
    """

    reference: str
    rows: tuple[LedgerRow, ...]


class FillRecord(NamedTuple):
    order_id: str
    user_id: int
    trade_id: int
    symbol: str
    side: int
    price_ticks: int
    quantity_lots: int
    fee: int
    maker: bool


# RiskAlert.kind values
ALERT_DRAWDOWN = "drawdown"
ALERT_SUPERVISION_HALT = "supervision_halt"
ALERT_SUPERVISION_QUARANTINE = "supervision_quarantine"
ALERT_SETTLEMENT_FAILED = "settlement_failed"
ALERT_RECONCILE_IMPOSSIBLE = "reconcile_impossible"
ALERT_FLUSH_REFUSED = "flush_refused"
ALERT_ORPHAN_EVENT = "orphan_event"
ALERT_UNKNOWN_USER_EVENT = "unknown_user_event"


class RiskAlert(NamedTuple):
    user_id: int
    kind: str
    detail: str


# OperatorAudit.action values
AUDIT_SET_RISK_LIMITS = "set_risk_limits"
AUDIT_HALT_TRADING = "halt_trading"
AUDIT_RESUME_TRADING = "resume_trading"
AUDIT_RESTART = "restart"


class OperatorAudit(NamedTuple):
    """An operator's command as the shard decided it: the persister's `admin_audit` row."""

    user_id: int
    operator: str
    action: str
    detail: str  # what changed, as canonical JSON text
    accepted: bool
    reject_reason: int
    note: str


Egress = (
    ShardResult
    | SubmitToMatcher
    | CancelToMatcher
    | BeginDehydrate
    | HydrateRequest
    | DedupLookup
    | OrderUpdate
    | LedgerPosting
    | FillRecord
    | RiskAlert
    | OperatorAudit
)
