"""Eviction: LRU + TTL on consensus time, and the dehydration handshake.

Recency is the order of `ShardState.actors` (an OrderedDict: insertion-ordered
and deterministic); activity moves an actor to the hot end in O(1). The sweep
runs on logged timer ticks and walks from the cold end only: it stops at the
first actor active within the TTL, so it visits (expired + 1) actors however
many are resident. Expired actors that are not flat (or are already
dehydrating) are re-queued at the hot end and looked at again a TTL later.
A sweep handles at most `max_evictions_per_sweep` expired actors.

The valve keeps the resident count (not counting those already dehydrating)
at or below `max_resident` by evicting the least recently used flat actors
before their TTL, walking at most `max_valve_visits` actors per trigger.

Handshake: BeginDehydrate{user, epoch, state} marks the actor DEHYDRATING; it
stays resident (and serves activity, which cancels the eviction and bumps the
epoch) until FlushComplete with the same epoch removes it. A stale
FlushComplete is dropped; FlushRefused keeps the actor, with an alert.
"""

from __future__ import annotations

from services.shard.core.actor import (
    DEHYDRATING,
    EVICTED,
    HALTED,
    QUARANTINED,
    RESIDENT,
    UserActor,
    check_actor,
)
from services.shard.core.commands import FlushComplete, FlushRefused
from services.shard.core.egress import ALERT_FLUSH_REFUSED, BeginDehydrate, Egress, RiskAlert
from services.shard.core.errors import ShardInvariantError
from services.shard.core.hydration import user_state_of
from services.shard.core.shard_state import ShardState
from services.shard.core.statistics import SweepStatistics


class EvictionSweep:
    def __init__(self, state: ShardState) -> None:
        self.state = state
        settings = state.settings
        self.ttl_ms = settings.idle_ttl_ms
        self.max_per_sweep = settings.max_evictions_per_sweep
        self.max_resident = settings.max_resident
        self.max_valve_visits = settings.max_valve_visits
        self.horizon_ms = settings.dedup_horizon_ms

    def evictable(self, actor: UserActor) -> bool:
        """Flat, resident, and (when quarantined) consistent again; never a halted actor."""
        if actor.lifecycle != RESIDENT or not actor.is_flat() or actor.health == HALTED:
            return False
        if actor.health == QUARANTINED:
            state = self.state
            try:
                check_actor(actor, state.pending_submits, state.pending_cancels)
            except ShardInvariantError:
                return False
        return True

    def sweep(self, now_ms: int, out: list[Egress]) -> SweepStatistics:
        state = self.state
        ttl = self.ttl_ms
        cap = self.max_per_sweep
        visited = 0
        expired: list[UserActor] = []
        for actor in state.actors.values():
            visited += 1
            if now_ms - actor.last_active_ms < ttl:
                break
            expired.append(actor)
            if len(expired) >= cap:
                break
        evicted = requeued = 0
        for actor in expired:
            if self.evictable(actor):
                self.begin(actor, now_ms, out)
                evicted += 1
            else:
                state.requeue(actor)
                requeued += 1
        statistics = SweepStatistics(now_ms, visited, len(expired), evicted, requeued)
        state.last_sweep = statistics
        state.counters.sweeps += 1
        state.counters.sweep_visits_total += visited
        return statistics

    def valve(self, now_ms: int, out: list[Egress]) -> int:
        state = self.state
        excess = len(state.actors) - state.dehydrating - self.max_resident
        if excess <= 0:
            return 0
        chosen: list[UserActor] = []
        for visits, actor in enumerate(state.actors.values()):
            if visits >= self.max_valve_visits or len(chosen) >= excess:
                break
            if self.evictable(actor):
                chosen.append(actor)
        for actor in chosen:
            self.begin(actor, now_ms, out)
        state.counters.valve_evictions += len(chosen)
        return len(chosen)

    def begin(self, actor: UserActor, now_ms: int, out: list[Egress]) -> None:
        state = self.state
        actor.move_to(DEHYDRATING)
        state.dehydrating += 1
        state.requeue(actor)
        state.counters.evictions_started += 1
        out.append(
            BeginDehydrate(
                actor.user_id, actor.epoch, user_state_of(actor, now_ms, self.horizon_ms)
            )
        )

    def on_flush_complete(self, command: FlushComplete, out: list[Egress]) -> None:
        state = self.state
        actor = state.actors.get(command.user_id)
        if actor is None or actor.lifecycle != DEHYDRATING or command.epoch != actor.epoch:
            state.counters.flushes_stale += 1
            if actor is not None and command.db_version > actor.db_version:
                # The stale flush did land: the next flush must CAS against its version.
                actor.db_version = command.db_version
                state.mark_dirty(actor)
            return
        actor.move_to(EVICTED)
        state.dehydrating -= 1
        accounts = state.accounts
        for asset, total in actor.balances.items():
            accounts.resident[asset] -= total
            accounts.dehydrated_out[asset] += total
        if actor.health == QUARANTINED:
            state.quarantined -= 1
        elif actor.health == HALTED:  # an operator's restart (operator_controls.py)
            state.halted -= 1
        state.drop_actor(actor)
        state.leaving.pop(actor.user_id, None)
        events: tuple[tuple[str, int], ...] = ()
        if state.machine_version >= 2:
            events = tuple(sorted(actor.event_sequences.items()))
        state.remember_tombstone(actor.user_id, command.db_version, events)
        state.counters.evictions_completed += 1

    def on_flush_refused(self, command: FlushRefused, out: list[Egress]) -> None:
        state = self.state
        actor = state.actors.get(command.user_id)
        if actor is None or actor.lifecycle != DEHYDRATING or command.epoch != actor.epoch:
            state.counters.flushes_stale += 1
            return
        actor.move_to(RESIDENT)
        state.dehydrating -= 1
        actor.epoch = state.next_epoch()
        state.requeue(actor)
        state.counters.flushes_refused += 1
        state.counters.risk_alerts += 1
        out.append(
            RiskAlert(
                actor.user_id,
                ALERT_FLUSH_REFUSED,
                f"flush of epoch {command.epoch} refused: {command.reason}; "
                "the user stays resident",
            )
        )
