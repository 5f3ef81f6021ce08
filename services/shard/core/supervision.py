"""Supervision: one user's failure stays that user's, and is decided deterministically.

One-for-one, as an actor system's supervisor (seeds/actor-model-risk-engine.txt):

- resume: the failing message is refused (INTERNAL_ERROR for a client command;
  a risk alert for a matcher event, whose sequence stays consumed) and the
  egress it had produced is discarded;
- restart: if the actor then fails its own invariant check it is quarantined:
  client commands are refused USER_HALTED until it is evicted and hydrated
  afresh from the system of record (by the sweep once it is flat and consistent
  again, or by an operator's RestartUser once flat); matcher events still settle,
  so money never stops moving;
- escalate: `supervision_max_failures` failures within `supervision_window_ms`
  of consensus time halt the actor, with a risk alert.

Only consensus time and the log decide, so every replica takes the same branch.
Other users are never touched.
"""

from __future__ import annotations

from services.shard.core.actor import HALTED, HEALTHY, QUARANTINED, check_actor
from services.shard.core.egress import (
    ALERT_SETTLEMENT_FAILED,
    ALERT_SUPERVISION_HALT,
    ALERT_SUPERVISION_QUARANTINE,
    Egress,
    RiskAlert,
    ShardResult,
)
from services.shard.core.errors import ShardInvariantError
from services.shard.core.shard_state import ShardState
from services.shard.core.vocabulary import RejectReason

RESUMED = "resumed"
QUARANTINE = "quarantined"
HALT = "halted"


class Supervisor:
    def __init__(self, state: ShardState) -> None:
        self.state = state
        self.max_failures = state.settings.supervision_max_failures
        self.window_ms = state.settings.supervision_window_ms

    def on_failure(
        self,
        user_id: int,
        error: Exception,
        now_ms: int,
        out: list[Egress],
        correlation_id: int | None,
    ) -> str:
        """Decide resume, quarantine or halt after `error`; return which."""
        state = self.state
        counters = state.counters
        counters.supervision_failures += 1
        if correlation_id is not None:
            out.append(ShardResult(correlation_id, False, RejectReason.INTERNAL_ERROR, 0, False))
        else:
            counters.risk_alerts += 1
            out.append(
                RiskAlert(user_id, ALERT_SETTLEMENT_FAILED, f"{type(error).__name__}: {error}")
            )
        actor = state.actors.get(user_id)
        if actor is None:
            return RESUMED
        failures = [at for at in actor.failures if now_ms - at < self.window_ms]
        failures.append(now_ms)
        actor.failures = failures[-self.max_failures :]
        state.mark_dirty(actor)
        if actor.health == HALTED:
            return HALT
        if len(actor.failures) >= self.max_failures:
            if actor.health == QUARANTINED:
                state.quarantined -= 1
            actor.change_health(HALTED)
            state.halted += 1
            counters.supervision_halts += 1
            counters.risk_alerts += 1
            out.append(
                RiskAlert(
                    user_id,
                    ALERT_SUPERVISION_HALT,
                    f"{len(actor.failures)} failures within {self.window_ms} ms; last: "
                    f"{type(error).__name__}: {error}",
                )
            )
            return HALT
        if actor.health == HEALTHY:
            try:
                check_actor(actor, state.pending_submits, state.pending_cancels)
            except ShardInvariantError as broken:
                actor.change_health(QUARANTINED)
                state.quarantined += 1
                counters.supervision_quarantines += 1
                counters.risk_alerts += 1
                out.append(RiskAlert(user_id, ALERT_SUPERVISION_QUARANTINE, str(broken)))
                return QUARANTINE
        return RESUMED
