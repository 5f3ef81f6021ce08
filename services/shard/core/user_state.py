"""The quiescent subset of an actor: what the persister stores and hydrates.

Mirrors `oms.v1.UserState`. It is only ever produced for a flat user (no open
order, saga or reservation), so it carries totals and no reservations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.shard.core.risk import RiskLimits

# Transfer ids travel in `UserState.recent` under this prefix (the contract has
# no field of its own for them yet). A control character: the gateway never
# accepts it in a client order id, and the shard refuses client ids that start with it.
TRANSFER_PREFIX = "\x1ftransfer:"


@dataclass(frozen=True, slots=True)
class RecentResult:
    """What a client order id (or transfer id) was answered, and when."""

    client_order_id: str
    order_id: str  # for a transfer: its content fingerprint
    reject_reason: int
    accepted_at_ms: int


@dataclass(frozen=True, slots=True)
class PositionState:
    symbol: str
    quantity_lots: int  # signed: long > 0
    cost_basis: int  # quote minor units paid for the open quantity (negative when short)
    realized_pnl: int


@dataclass(frozen=True, slots=True)
class UserState:
    user_id: int
    db_version: int = 0
    tier: int = 0
    balances: tuple[tuple[str, int], ...] = ()  # (asset, total)
    positions: tuple[PositionState, ...] = ()
    user_seq: int = 0
    recent: tuple[RecentResult, ...] = ()
    risk_limits: RiskLimits = field(default_factory=RiskLimits)
    reduce_only: bool = False
    peak_equity: int = 0
    trading_halted: bool = False  # an operator's halt: places and withdrawals refused
    control_version: int = 0  # operator controls accepted so far (operator_controls.py)
    last_control_id: str = ""  # the request id of the last of them
