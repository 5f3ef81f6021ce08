"""Reconciliation: the matcher's open orders for one user against the shard's index.

Applied only once this shard has applied the matcher group's sequence the
report is as-of (before that, the report would see fills still in flight), and
only to a user none of whose orders had an event after that sequence (after
it, the report describes a past the index has moved on from: it is stale and
counted, and the next round's report is judged instead). From state-machine
version 2 the same holds for a user who left this shard since (evicted, or moved
away by routing): its tombstone keeps the sequences of its last events, and a
report older than them is stale; at version 1 any order listed for a user not
resident is an impossible state, a false alert when the report was merely late.
Until the sequence is applied a report waits, at most `max_deferred_reconciles`
of them (the oldest is dropped beyond that: the reconciler sends another report
next round).

Healing, deterministically:
- a phantom (the shard holds it OPEN or PARTIALLY_FILLED in this group, the
  matcher does not list it) is closed as CANCELLED and its reservation released;
- a PENDING order the matcher lists was accepted and the Accepted was lost: OPEN;
- a reservation with no live order is released (a leak);
- an order the matcher lists and the shard does not know, or with fewer lots
  remaining than the shard holds (fills that never arrived), is an impossible
  state: counted and raised as a risk alert, never guessed at.
"""

from __future__ import annotations

from services.shard.core.commands import Reconcile, ReconciledOrder
from services.shard.core.egress import ALERT_RECONCILE_IMPOSSIBLE, Egress, OrderUpdate, RiskAlert
from services.shard.core.orders import OpenOrder, advance
from services.shard.core.reservations import release
from services.shard.core.settlement import Settlement
from services.shard.core.shard_state import ShardState
from services.shard.core.vocabulary import CANCELLED, OPEN, PENDING


class ReconcileEngine:
    def __init__(self, state: ShardState, settlement: Settlement) -> None:
        self.state = state
        self.settlement = settlement
        self.max_deferred = state.settings.max_deferred_reconciles

    def defer(self, command: Reconcile) -> bool:
        """Keep a report that is ahead of the applied sequence; True if it now waits."""
        state = self.state
        if state.sequences.get(command.matcher_group, 0) >= command.as_of_sequence:
            return False
        state.deferred_reconciles.append(command)
        state.counters.reconciles_deferred += 1
        if len(state.deferred_reconciles) > self.max_deferred:
            del state.deferred_reconciles[0]
            state.counters.reconciles_dropped += 1
        return True

    def ready(self, matcher_group: str) -> list[Reconcile]:
        """Take the deferred reports of `matcher_group` whose sequence has now been applied."""
        state = self.state
        last = state.sequences.get(matcher_group, 0)
        ready: list[Reconcile] = []
        waiting: list[Reconcile] = []
        for report in state.deferred_reconciles:
            if report.matcher_group == matcher_group and report.as_of_sequence <= last:
                ready.append(report)
            else:
                waiting.append(report)
        if ready:
            state.deferred_reconciles = waiting
        return ready

    def apply(self, command: Reconcile, now_ms: int, out: list[Egress]) -> None:
        state = self.state
        counters = state.counters
        counters.reconciles_applied += 1
        listed: dict[str, ReconciledOrder] = {o.order_id: o for o in command.open_orders}
        actor = state.actors.get(command.user_id)
        if actor is None:
            if self._left_after(command):
                # The user went flat and left after the snapshot's sequence (an event of
                # the group came later): the report judges a past, as for a resident user
                # whose orders moved after it.
                counters.reconciles_stale += 1
                return
            # Not resident means flat: anything the matcher still holds is impossible here.
            for listed_order in command.open_orders:
                self._impossible(
                    command.user_id, listed_order.order_id, "user holds no orders", out
                )
            return
        if actor.event_sequences.get(command.matcher_group, 0) > command.as_of_sequence:
            # The user's orders moved after the matcher's snapshot: judging today's index by
            # it would close live orders. The reconciler reports again next round.
            counters.reconciles_stale += 1
            return
        changed = False
        for order in list(actor.orders.values()):
            if order.matcher_group != command.matcher_group:
                continue
            seen = listed.get(order.order_id)
            if order.status == PENDING:
                if seen is not None:
                    state.saga_answered(order)
                    advance(order, OPEN)
                    counters.reconcile_acceptances_healed += 1
                    out.append(_update(actor.user_id, order))
                    changed = True
                continue
            if seen is None:
                advance(order, CANCELLED)
                released = self.settlement.end(actor, order, now_ms)
                counters.reconcile_phantoms_closed += 1
                if released:
                    counters.reconcile_reservations_released += 1
                out.append(_update(actor.user_id, order))
                changed = True
            elif seen.remaining_lots < order.remaining_lots:
                self._impossible(
                    actor.user_id,
                    order.order_id,
                    f"matcher has {seen.remaining_lots} lots left, shard {order.remaining_lots}",
                    out,
                )
        for order_id in list(actor.reservations):
            if order_id not in actor.orders:
                release(actor, order_id)
                counters.reconcile_reservations_released += 1
                changed = True
        for order_id in listed:
            if order_id not in actor.orders:
                self._impossible(actor.user_id, order_id, "unknown to the shard", out)
        if changed:
            state.mark_dirty(actor)

    def _left_after(self, command: Reconcile) -> bool:
        """From version 2: whether the user's last event of the report's group, when it left
        this shard, came after the report's snapshot (its tombstone keeps the sequences)."""
        state = self.state
        if state.machine_version < 2:
            return False
        events = dict(state.tombstone_events.get(command.user_id, ()))
        return events.get(command.matcher_group, 0) > command.as_of_sequence

    def _impossible(self, user_id: int, order_id: str, detail: str, out: list[Egress]) -> None:
        counters = self.state.counters
        counters.reconcile_impossible_states += 1
        counters.risk_alerts += 1
        out.append(RiskAlert(user_id, ALERT_RECONCILE_IMPOSSIBLE, f"order {order_id}: {detail}"))


def _update(user_id: int, order: OpenOrder) -> OrderUpdate:
    return OrderUpdate(
        user_id,
        order.order_id,
        order.client_order_id,
        order.symbol,
        order.status,
        order.filled_lots,
        order.remaining_lots,
        0,
        0,
        0,
    )
