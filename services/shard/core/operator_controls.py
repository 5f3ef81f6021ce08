"""An operator's controls of one user, as logged commands: every replica decides alike.

- SetRiskLimits: new limits, and optionally reduce-only cleared (drawdown is then
  measured from the equity of this position on). Allowed whatever the actor's
  health: tightening limits is how risk responds to trouble.
- HALT_TRADING / RESUME_TRADING: an operator's halt of the user's trading. Places
  and withdrawals are refused TRADING_HALTED; cancels, deposits and matcher events
  pass, so an operator can take risk off a halted account. The flag lives in the
  user's state (`UserState.trading_halted`): it survives eviction and hydration.
- RESTART: supervision's restart directive (DESIGN.md section 4). A flat actor, in
  any health, starts a dehydration: its quiescent state (totals, positions, dedup
  window, limits, flags) is flushed to PostgreSQL by the usual CAS and the actor is
  dropped; the next command hydrates it from that row, healthy, with every derived
  structure (reservations, indexes, failure history) rebuilt. A user with open
  orders, sagas or reservations is refused USER_NOT_FLAT, changing nothing: cancel
  them first (the matcher's kill-switch cancels what rests). A user who is not
  resident needs no restart: its next hydration is fresh already.

Each control is decided once, whatever copies of it arrive (a link or the admin API's
retry may deliver one twice, and late). Every accepted control adds one to the user's
`control_version` and records its `request_id` as `last_control_id`, both kept in
`UserState`. A copy whose request id is the last control's is answered accepted again
and changes nothing; a control pinned (`if_control_version`) to a version the user has
moved past is refused CONTROL_VERSION_STALE and changes nothing. So a late copy of a
halt can never land after the resume that followed it. (A restart of a user with no
actor here, or of one already on its way to PostgreSQL, decides nothing new: accepted,
no version added.)

Each decision at the actor, accepted or refused, also leaves an `OperatorAudit`
egress item (who, what, the detail as canonical JSON, the operator's note), which
the persister writes to `admin_audit` at the command's log position, exactly once.
"""

from __future__ import annotations

import json
from typing import Any

from services.shard.core.actor import DEHYDRATING, HALTED, QUARANTINED, UserActor
from services.shard.core.commands import SetRiskLimits, UserControl
from services.shard.core.egress import (
    AUDIT_HALT_TRADING,
    AUDIT_RESTART,
    AUDIT_RESUME_TRADING,
    AUDIT_SET_RISK_LIMITS,
    Egress,
    OperatorAudit,
    ShardResult,
)
from services.shard.core.eviction import EvictionSweep
from services.shard.core.risk import NO_LIMITS
from services.shard.core.risk_checks import equity
from services.shard.core.saga import refused
from services.shard.core.shard_state import ShardState
from services.shard.core.vocabulary import RejectReason, UserControlAction

HEALTH_NAMES = {0: "healthy", QUARANTINED: "quarantined", HALTED: "halted"}
_ACTIONS = {
    UserControlAction.HALT_TRADING: AUDIT_HALT_TRADING,
    UserControlAction.RESUME_TRADING: AUDIT_RESUME_TRADING,
    UserControlAction.RESTART: AUDIT_RESTART,
}
USER_CONTROL_ACTIONS = frozenset(int(action) for action in _ACTIONS)


def canonical_json(detail: dict[str, Any]) -> str:
    """The same text on every replica: sorted keys, no spaces."""
    return json.dumps(detail, sort_keys=True, separators=(",", ":"))


class OperatorControls:
    def __init__(self, state: ShardState, eviction: EvictionSweep) -> None:
        self.state = state
        self.eviction = eviction

    def set_risk_limits(
        self, actor: UserActor, command: SetRiskLimits, now_ms: int, out: list[Egress]
    ) -> None:
        state = self.state
        before = {"limits": actor.limits.named(), "reduce_only": actor.reduce_only}
        detail: dict[str, Any] = {"health": HEALTH_NAMES[actor.health]}
        reason = self._admit(actor, command, detail)
        if reason is None:
            actor.limits = NO_LIMITS if command.limits == NO_LIMITS else command.limits
            if command.clear_reduce_only:
                actor.reduce_only = False
                # Measure drawdown from here on, or the old peak would trip it again at once.
                actor.peak_equity = equity(actor, state.marks, state.settlement_symbols)
            self._accepted(actor, command, now_ms, detail)
            detail["before"] = before
            detail["after"] = {"limits": actor.limits.named(), "reduce_only": actor.reduce_only}
        action = AUDIT_SET_RISK_LIMITS
        self._decided(actor.user_id, command, action, reason=reason or 0, detail=detail, out=out)

    def control(
        self, actor: UserActor, command: UserControl, now_ms: int, out: list[Egress]
    ) -> None:
        action = command.action
        detail: dict[str, Any] = {"health": HEALTH_NAMES[actor.health]}
        reason = self._admit(actor, command, detail)
        if reason is None and action == UserControlAction.RESTART:
            reason = self._restart(actor, command, now_ms, detail, out)
        elif reason is None:
            halt = action == UserControlAction.HALT_TRADING
            detail["trading_halted_before"] = actor.trading_halted
            actor.trading_halted = halt
            self._accepted(actor, command, now_ms, detail)
            detail["trading_halted"] = halt
        name = _ACTIONS[UserControlAction(action)]
        self._decided(actor.user_id, command, name, reason=reason or 0, detail=detail, out=out)

    @staticmethod
    def _admit(
        actor: UserActor, command: SetRiskLimits | UserControl, detail: dict[str, Any]
    ) -> int | None:
        """None to decide the command; 0 for a copy decided already; else a refusal."""
        if command.request_id and command.request_id == actor.last_control_id:
            detail["duplicate"] = True  # answered as first decided: nothing changes
            detail["control_version"] = actor.control_version
            return 0
        pinned = command.if_control_version
        if pinned is not None and pinned != actor.control_version:
            detail["control_version"] = actor.control_version
            detail["if_control_version"] = pinned
            return int(RejectReason.CONTROL_VERSION_STALE)
        return None

    def _accepted(
        self,
        actor: UserActor,
        command: SetRiskLimits | UserControl,
        now_ms: int,
        detail: dict[str, Any],
    ) -> None:
        """A control decided and accepted: the user's next control version."""
        actor.control_version += 1
        actor.last_control_id = command.request_id
        detail["control_version"] = actor.control_version
        # Activity: a flush already begun would write the state from before this control.
        self.state.touch(actor, now_ms)

    def _decided(
        self,
        user_id: int,
        command: SetRiskLimits | UserControl,
        action: str,
        *,
        reason: int,
        detail: dict[str, Any],
        out: list[Egress],
    ) -> None:
        if command.request_id:
            detail["request_id"] = command.request_id
        counters = self.state.counters
        counters.operator_commands += 1
        if reason:
            counters.operator_commands_refused += 1
            out.append(refused(command.correlation_id, reason))
        else:
            out.append(ShardResult(command.correlation_id, True))
        out.append(
            OperatorAudit(
                user_id,
                command.operator,
                action,
                canonical_json(detail),
                not reason,
                reason,
                command.note,
            )
        )

    def restart_absent(self, command: UserControl, out: list[Egress]) -> None:
        """A restart of a user with no actor here: nothing to rebuild, accepted as is."""
        detail = {"resident": False, "hydrating": command.user_id in self.state.hydrations}
        self._decided(command.user_id, command, AUDIT_RESTART, reason=0, detail=detail, out=out)

    def _restart(
        self,
        actor: UserActor,
        command: UserControl,
        now_ms: int,
        detail: dict[str, Any],
        out: list[Egress],
    ) -> int:
        if actor.lifecycle == DEHYDRATING:
            detail["dehydrating"] = True  # on its way to PostgreSQL already
            return 0
        if not actor.is_flat():
            detail["open_orders"] = len(actor.orders)
            detail["reservations"] = len(actor.reservations)
            detail["dedup_wait"] = actor.dedup_wait is not None
            return int(RejectReason.USER_NOT_FLAT)
        negative = sorted(asset for asset, total in actor.balances.items() if total < 0)
        if negative:
            # The money itself is wrong: flushing it would write the damage through.
            detail["negative_balances"] = negative
            return int(RejectReason.INTERNAL_ERROR)
        # Counted before the flush begins, so the flushed state carries it.
        self._accepted(actor, command, now_ms, detail)
        self.eviction.begin(actor, now_ms, out)
        self.state.counters.operator_restarts += 1
        detail["epoch"] = actor.epoch
        return 0
