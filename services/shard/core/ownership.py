"""Which users this shard owns under its routing epoch, and letting go of the others.

A newer routing document (`SetRouting`, at a log position) can take users away from
this shard: a wave put them in transit, or a cut-over hashes them elsewhere. Such a
user may still be resident here, with state the database does not have yet. Until
it is flushed and dropped, it is *leaving*:

- its client commands are refused with NOT_OWNER (`ShardMachine._not_owner`), and
  commands parked waiting for its hydration are refused the same way;
- matcher events for its orders still land here (it is still the only writer of its
  money), and a hydration nobody here is waiting for is dropped;
- as soon as it is flat, its eviction begins at once, not after the idle TTL; the
  new owner hydrates it from PostgreSQL once the flush has completed, which the
  wave controller waits for (it sees `leaving_users` go to 0) before the next epoch
  gives the user to its new owner.

`leaving` is derived from the actors and the document, so it is not part of the
snapshot or the state hash: `recompute` rebuilds it on restore, in actor order.
"""

from __future__ import annotations

from services.shard.core.egress import Egress, ShardResult
from services.shard.core.eviction import EvictionSweep
from services.shard.core.shard_state import ParkedEvent, ParkedItem, ShardState
from services.shard.core.vocabulary import RejectReason

_NOT_OWNER = int(RejectReason.NOT_OWNER)


class Ownership:
    def __init__(self, state: ShardState, eviction: EvictionSweep) -> None:
        self.state = state
        self.eviction = eviction
        self.cap = state.settings.max_evictions_per_sweep

    def recompute(self) -> None:
        """`leaving`: the resident users the document gives to another shard, or to none."""
        state = self.state
        state.leaving = {user_id: None for user_id in state.actors if not state.owns(user_id)}

    def on_new_document(self, now_ms: int, out: list[Egress]) -> None:
        self.recompute()
        self._refuse_parked(out)
        self.evict_leaving(now_ms, out)

    def evict_leaving(self, now_ms: int, out: list[Egress]) -> int:
        """Begin the eviction of every flat leaving user (at most the sweep's cap), in
        user order: `leaving` grows in the order documents and hydrations came, but a
        restore rebuilds it in the actors' order of its snapshot, and the order of
        beginning decides the actors' recency (which the state hash covers)."""
        state = self.state
        begun = 0
        for user_id in sorted(state.leaving):
            actor = state.actors.get(user_id)
            if actor is None:
                del state.leaving[user_id]
                continue
            if begun < self.cap and self.eviction.evictable(actor):
                self.eviction.begin(actor, now_ms, out)
                state.counters.leaving_evictions += 1
                begun += 1
        return begun

    def _refuse_parked(self, out: list[Egress]) -> None:
        """Client commands waiting for the hydration of a user no longer owned are
        refused (retryable: the gateway re-routes them); matcher events stay parked,
        since only this shard can apply them, and the hydration goes on for them."""
        state = self.state
        epoch = state.routing.epoch if state.routing is not None else 0
        for user_id in [user for user in state.hydrations if not state.owns(user)]:
            pending = state.hydrations[user_id]
            kept: list[ParkedItem] = [i for i in pending.parked if isinstance(i, ParkedEvent)]
            for item in pending.parked:
                if not isinstance(item, ParkedEvent):
                    state.counters.refused_not_owner += 1
                    out.append(
                        ShardResult(
                            item.correlation_id, False, _NOT_OWNER, 0, True, routing_epoch=epoch
                        )
                    )
            state.parked_client_commands -= pending.client_commands
            pending.client_commands = 0
            pending.parked = kept
            if not kept:
                del state.hydrations[user_id]
