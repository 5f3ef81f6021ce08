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
        actor.limits = NO_LIMITS if command.limits == NO_LIMITS else command.limits
        if command.clear_reduce_only:
            actor.reduce_only = False
            # Measure drawdown from here on, or the old peak would trip it again at once.
            actor.peak_equity = equity(actor, state.marks, state.settlement_symbols)
        state.touch(actor, now_ms)
        state.counters.operator_commands += 1
        after = {"limits": actor.limits.named(), "reduce_only": actor.reduce_only}
        out.append(ShardResult(command.correlation_id, True))
        detail = {"before": before, "after": after, "health": HEALTH_NAMES[actor.health]}
        out.append(
            OperatorAudit(
                actor.user_id,
                command.operator,
                AUDIT_SET_RISK_LIMITS,
                canonical_json(detail),
                True,
                0,
                command.note,
            )
        )

    def control(
        self, actor: UserActor, command: UserControl, now_ms: int, out: list[Egress]
    ) -> None:
        state = self.state
        action = command.action
        detail: dict[str, Any] = {"health": HEALTH_NAMES[actor.health]}
        reason = 0
        if action == UserControlAction.RESTART:
            reason = self._restart(actor, now_ms, detail, out)
        else:
            halt = action == UserControlAction.HALT_TRADING
            detail["trading_halted_before"] = actor.trading_halted
            if actor.trading_halted != halt:
                actor.trading_halted = halt
                state.touch(actor, now_ms)
            detail["trading_halted"] = halt
        counters = state.counters
        counters.operator_commands += 1
        if reason:
            counters.operator_commands_refused += 1
            out.append(refused(command.correlation_id, reason))
        else:
            out.append(ShardResult(command.correlation_id, True))
        out.append(
            OperatorAudit(
                actor.user_id,
                command.operator,
                _ACTIONS[UserControlAction(action)],
                canonical_json(detail),
                not reason,
                reason,
                command.note,
            )
        )

    def restart_absent(self, command: UserControl, out: list[Egress]) -> None:
        """A restart of a user with no actor here: nothing to rebuild, accepted as is."""
        state = self.state
        state.counters.operator_commands += 1
        hydrating = command.user_id in state.hydrations
        detail = {"resident": False, "hydrating": hydrating}
        out.append(ShardResult(command.correlation_id, True))
        out.append(
            OperatorAudit(
                command.user_id,
                command.operator,
                AUDIT_RESTART,
                canonical_json(detail),
                True,
                0,
                command.note,
            )
        )

    def _restart(
        self, actor: UserActor, now_ms: int, detail: dict[str, Any], out: list[Egress]
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
        self.eviction.begin(actor, now_ms, out)
        self.state.counters.operator_restarts += 1
        detail["epoch"] = actor.epoch
        return 0
