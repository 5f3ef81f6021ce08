"""Routing epochs mid-flight: users moved between shard groups while they trade.

The wave controller's one primitive (`services/routing/wave_controller.py`), with the
real document changes (`services/routing/core/routing_changes.py`): a user is put in
transit (the next epoch: nobody owns it; its old owner refuses its commands and lets
it go once flat, flushing it with the versioned write); once the old owner has logged
that epoch and no longer holds the user, it lands on its new owner (the epoch after);
a user still held when the quiesce time is up goes back. Shards learn each epoch from
the routing watcher (`SimWorld._publish_routing`); clients route by the newest one and
wait while a user is in transit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.routing.core.routing_changes import with_in_transit, with_landed, with_returned
from simulation.core.faults import USER_MOVE

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

MOVE_EVERY_MS = (200, 1_500)
POLL_MS = 20
QUIESCE_MS = 3_000


@dataclass(frozen=True, slots=True)
class Move:
    user_id: int
    source: str
    destination: str
    epoch: int
    started_ms: int


class SimWaves:
    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.moving: Move | None = None
        self.landed = 0
        self.returned = 0
        self._next_move()
        world.scheduler.after(POLL_MS, "waves", self._poll)

    def _next_move(self) -> None:
        world = self.world
        world.scheduler.after(world.rng.randrange(*MOVE_EVERY_MS), "move", self._start)

    def _start(self) -> None:
        world = self.world
        self._next_move()
        if self.moving is not None or world.clients.settling or not world.plan.on(USER_MOVE):
            return
        user = world.clients.users[world.rng.randrange(len(world.clients.users))]
        source = world.routing.owner_of(user)
        others = [shard for shard in world.shard_ids if shard != source]
        if source is None or not others:
            return
        destination = others[world.rng.randrange(len(others))]
        world.routing = with_in_transit(world.routing, {user: destination})
        self.moving = Move(user, source, destination, world.routing.epoch, world.scheduler.now_ms)
        world.faults.note(
            world.scheduler.now_ms,
            USER_MOVE,
            f"user {user} {source}→{destination} (epoch {world.routing.epoch})",
        )

    def _poll(self) -> None:
        world = self.world
        world.scheduler.after(POLL_MS, "waves", self._poll)
        move = self.moving
        if move is None:
            return
        leader = world.leading_replica(move.source)
        if leader is not None:
            state = leader.machine.state
            epoch = state.routing.epoch if state.routing is not None else 0
            if epoch >= move.epoch and move.user_id not in state.actors:
                world.routing = with_landed(world.routing, [move.user_id])
                self.landed += 1
                self.moving = None
                return
        if world.scheduler.now_ms - move.started_ms >= QUIESCE_MS:
            world.routing = with_returned(world.routing, [move.user_id])
            self.returned += 1
            self.moving = None
