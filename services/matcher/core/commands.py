"""Decoded commands (one per `oms.v1.MatcherCommand`) and their results.

`codec` builds these from a `MatcherCommandBatch`; tests and the benchmark may
build them directly to drive the engine without protobuf.
"""

from __future__ import annotations

from typing import NamedTuple

from services.matcher.core.orders import OrderSpec, OrderView


class SubmitCommand(NamedTuple):
    correlation_id: int
    spec: OrderSpec


class CancelCommand(NamedTuple):
    correlation_id: int
    order_id: str
    user_id: int


class HaltCommand(NamedTuple):
    correlation_id: int
    symbol: str
    cancel_resting: bool


class ResumeCommand(NamedTuple):
    correlation_id: int
    symbol: str


class KillSwitchCommand(NamedTuple):
    correlation_id: int
    user_id: int
    enable: bool


class EmptyCommand(NamedTuple):
    """A `MatcherCommand` with no command set: answered INVALID_ORDER, changes nothing."""

    correlation_id: int


Command = (
    SubmitCommand | CancelCommand | HaltCommand | ResumeCommand | KillSwitchCommand | EmptyCommand
)


class CommandResult(NamedTuple):
    """`oms.v1.MatcherCommandResult`: whether the command was new, and the order after it."""

    correlation_id: int
    duplicate: bool
    order: OrderView | None
    reject_reason: int  # MatcherRejectReason, 0 when none
    not_found: bool
