"""Routing epochs mid-flight: the wave controller moving users while they trade.

A model of `services/routing/wave_controller.py`, step for step, deciding with the
same code: the document changes (`services/routing/core/routing_changes.py`) and the
choice of movers, waves and stuck users (`services/routing/core/wave_plan.py`). Its
operations, one at a time, as the real controller runs them:

- **a user's move** (fault kind `user_move`): in transit (nobody owns it; its old
  owner refuses its commands and lets it go once flat, flushing it with the versioned
  write), then landed on its new owner once the old one has logged that epoch and no
  longer holds it, or returned when the quiesce time is up;
- **a scale-out** (kind `scale`): a shard group outside the document joins as
  receiving, the resident users the hash gives it move in waves, then the cut-over
  (one epoch puts every user the hash moves in transit; the old owners let go of
  them) ends with the group active; a user that will not go flat is held on its old
  owner;
- **a scale-in** (kind `scale`): an active group drains (the users moved to it are
  sent home first, as an operator must), its resident users move to where the hash
  puts them without it, then its cut-over removes it; a user that will not go flat
  undoes the cut-over and the group stays draining until a later scale-in.

Every operation begins by resuming what an earlier one left (transits settled, a
cut-over finished): the controller crashes as any process does (kind `crash`), and
its next incarnation resumes. Its steps are a generator that yields how long to wait
(simulated ms); a crash drops it where it stood. It reads the shards as the real
one's `ShardProbe` does, from each group's leader (the epoch it logged, the users
leaving, the users resident); shards learn each epoch from the routing watcher
(`SimWorld._publish_routing`); clients route by the newest one and wait while a
user is in transit.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from services.routing.core.routing_changes import (
    with_cluster_draining,
    with_cluster_joining,
    with_cut_over,
    with_cut_over_done,
    with_cut_over_undone,
    with_held,
    with_in_transit,
    with_transit_ended,
)
from services.routing.core.routing_document import (
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
)
from services.routing.core.wave_plan import (
    arrivals,
    departures,
    homes_without,
    moved_to,
    still_to_move,
    stuck_at_cut_over,
    waves_of,
)
from simulation.core.defects import LANDS_BEFORE_LETTING_GO
from simulation.core.faults import SCALE, USER_MOVE

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

MOVE_EVERY_MS = (200, 1_500)
SCALE_EVERY_MS = (500, 3_000)
POLL_MS = 20
QUIESCE_MS = 3_000  # how long a user may take to go flat and be flushed
APPLY_MS = 5_000  # how long a group may take to log a new epoch
WAVE_SIZE = 64  # users in transit at once, as `WaveSettings.wave_size`

Steps = Generator[int, None, Any]  # yields the simulated ms to wait


class WaveStalled(RuntimeError):
    """A group did not log an epoch within APPLY_MS (no leader, a paused one)."""


class WaveBlocked(RuntimeError):
    """A scale-in's cut-over undone: users that would not go flat."""


class SimWaves:
    label = "waves"

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.alive = True
        self.incarnation = 0
        self.running: str | None = None  # the operation under way
        self.scale_due = False  # a scaling operation waits for the one under way
        self.landed = 0
        self.returned = 0
        self.figures: dict[str, int] = {
            "scale_outs": 0,
            "scale_ins": 0,
            "scale_ins_blocked": 0,
            "scale_users_held": 0,
            "scale_waves": 0,
            "wave_stalls": 0,
            "wave_refusals": 0,
            "wave_resumes": 0,
            "wave_operations_killed": 0,
        }
        world.scheduler.after(world.rng.randrange(*MOVE_EVERY_MS), "move", self._start_move)
        world.scheduler.after(world.rng.randrange(*SCALE_EVERY_MS), "scale", self._start_scale)

    # --- process life ------------------------------------------------------------------

    def crash(self) -> None:
        if self.running is not None:
            self.figures["wave_operations_killed"] += 1
        self.alive = False
        self.scale_due = False
        self.incarnation += 1
        self.running = None

    def restart(self) -> None:
        """A new controller: it resumes whatever the last one left under way."""
        self.alive = True
        self.figures["wave_resumes"] += 1
        self._run("resume", self.resume())

    def settle_round(self) -> None:
        """While settling (no new operations), finish what the document has under way."""
        document = self.world.routing
        if self.alive and self.running is None and (document.transit or document.cutting_over):
            self._run("resume", self.resume())

    @property
    def idle(self) -> bool:
        document = self.world.routing
        return self.running is None and not document.transit and not document.cutting_over

    # --- choosing operations -----------------------------------------------------------

    def _start_move(self) -> None:
        world = self.world
        world.scheduler.after(world.rng.randrange(*MOVE_EVERY_MS), "move", self._start_move)
        if self.scale_due or not self._may_start(USER_MOVE):
            return
        document = world.routing
        user = world.clients.users[world.rng.randrange(len(world.clients.users))]
        source = document.owner_of(user)
        active = [c.cluster_id for c in document.clusters if c.state == ClusterState.ACTIVE]
        others = [cluster for cluster in active if cluster != source]
        if source is None or not others:
            return
        destination = others[world.rng.randrange(len(others))]
        self._note(USER_MOVE, f"user {user} {source}→{destination} (epoch {document.epoch + 1})")
        self._run("move", self.move(user, destination))

    def _start_scale(self) -> None:
        world = self.world
        world.scheduler.after(world.rng.randrange(*SCALE_EVERY_MS), "scale", self._start_scale)
        self._scale()

    def _scale(self) -> None:
        """A scale-out or a scale-in, as the document allows; once the operation under
        way ends if there is one (user moves wait meanwhile)."""
        world = self.world
        self.scale_due = self.running is not None and self.alive and world.plan.on(SCALE)
        if not self._may_start(SCALE):
            return
        document = world.routing
        states = {c.cluster_id: c.state for c in document.clusters}
        outside = [shard for shard in world.shard_ids if shard not in states]
        active = [c for c, state in states.items() if state == ClusterState.ACTIVE]
        unfinished = [c for c, state in sorted(states.items()) if state != ClusterState.ACTIVE]
        if unfinished:  # a scale-in that was blocked, or a join not yet activated
            cluster = unfinished[0]
            removing = states[cluster] in (ClusterState.DRAINING, ClusterState.DEPARTING)
        else:
            # Out or in, as the seed says: a group outside joins, or an active one
            # leaves while at least one other stays.
            choices = [(c, False) for c in outside]
            choices += [(c, True) for c in active] if len(active) > 1 else []
            if not choices:
                return
            cluster, removing = choices[world.rng.randrange(len(choices))]
        what = "scale-in" if removing else "scale-out"
        self._note(SCALE, f"{what} {cluster} (epoch {document.epoch})")
        self._run(what, self.remove(cluster) if removing else self.activate(cluster))

    def _may_start(self, kind: str) -> bool:
        world = self.world
        return (
            self.alive
            and self.running is None
            and not world.clients.settling
            and world.plan.on(kind)
        )

    def _note(self, kind: str, what: str) -> None:
        self.world.faults.note(self.world.scheduler.now_ms, kind, what)

    def _run(self, name: str, steps: Steps) -> None:
        """Drive `steps` on simulated time until it ends, fails, or the process dies."""
        world = self.world
        incarnation = self.incarnation
        self.running = name

        def step() -> None:
            if incarnation != self.incarnation:
                return  # crashed: this incarnation's operation is gone
            try:
                delay = next(steps)
            except StopIteration:
                self._ended()
                return
            except (RoutingDocumentError, WaveStalled, WaveBlocked) as error:
                if isinstance(error, WaveStalled):
                    self.figures["wave_stalls"] += 1
                elif isinstance(error, WaveBlocked):
                    self.figures["scale_ins_blocked"] += 1
                else:
                    self.figures["wave_refusals"] += 1
                world.faults.trace.append(f"{world.scheduler.now_ms} waves {name}: {error}")
                self._ended()
                return
            world.scheduler.after(delay, "waves", step)

        step()

    def _ended(self) -> None:
        self.running = None
        if self.scale_due:
            self._scale()

    # --- operations (as `WaveController`'s) ----------------------------------------------

    def resume(self) -> Steps:
        document = self.world.routing
        if document.transit:
            yield from self._settle(list(document.transit))
        for cluster in self.world.routing.clusters:
            if cluster.state in (ClusterState.ARRIVING, ClusterState.DEPARTING):
                yield from self._finish_cut_over(cluster.cluster_id)

    def move(self, user_id: int, destination: str) -> Steps:
        yield from self.resume()
        if self.world.routing.owner_of(user_id) in (None, destination):
            return
        yield from self._transit({user_id: destination})

    def activate(self, cluster_id: str) -> Steps:
        yield from self.resume()
        document = self.world.routing
        cluster = document.cluster(cluster_id)
        if cluster is None:
            document = self._change(lambda d: with_cluster_joining(d, cluster_id))
        elif cluster.state == ClusterState.ACTIVE:
            return
        elif cluster.state != ClusterState.RECEIVING:
            raise RoutingDocumentError(f"cluster {cluster_id} is {cluster.state.value}")
        residents: dict[str, list[int]] = {}
        for owner in document.hash_owners:
            residents[owner] = yield from self._residents(owner)
        yield from self._waves(arrivals(document, residents, cluster_id))
        yield from self._cut_over(cluster_id)
        self.figures["scale_outs"] += 1

    def remove(self, cluster_id: str) -> Steps:
        yield from self.resume()
        document = self.world.routing
        cluster = document.cluster(cluster_id)
        if cluster is None:
            return
        if cluster.state == ClusterState.ACTIVE:
            # The users moved here go home first (the real `remove` refuses until an
            # operator has moved them: `with_cluster_draining` says so).
            moved_here = moved_to(document, cluster_id)
            yield from self._waves(homes_without(document, moved_here, cluster_id))
            document = self._change(lambda d: with_cluster_draining(d, cluster_id))
        residents = yield from self._residents(cluster_id)
        yield from self._waves(departures(document, residents, cluster_id))
        yield from self._cut_over(cluster_id)
        self.figures["scale_ins"] += 1

    # --- steps -------------------------------------------------------------------------

    def _waves(self, movers: Mapping[int, str]) -> Steps:
        for planned in waves_of(movers, WAVE_SIZE):
            wave = still_to_move(self.world.routing, planned, movers)
            if wave:
                self.figures["scale_waves"] += 1
                yield from self._transit({user: movers[user] for user in wave})

    def _transit(self, destinations: Mapping[int, str]) -> Steps:
        self._change(lambda d: with_in_transit(d, destinations))
        yield from self._settle(list(destinations))

    def _settle(self, users_in_transit: Sequence[int]) -> Steps:
        """Land every user its source has let go; return the rest once the quiesce time
        is up."""
        document = self.world.routing
        wanted = set(users_in_transit)
        users = [user for user in document.transit if user in wanted]
        by_source: dict[str, list[int]] = {}
        for user in users:
            by_source.setdefault(document.transit[user].source, []).append(user)
        yield from self._applied(by_source, document.epoch)
        deadline = self.world.scheduler.now_ms + QUIESCE_MS
        still: set[int] = set()
        while self.world.config.defect != LANDS_BEFORE_LETTING_GO:
            still = set()
            for source, waiting in sorted(by_source.items()):
                residents = yield from self._residents(source)
                still |= set(waiting).intersection(residents)
            if not still or self.world.scheduler.now_ms >= deadline:
                break
            yield POLL_MS
        landed = [user for user in users if user not in still]
        returned = sorted(still)
        self._change(
            lambda d: with_transit_ended(
                d,
                landed=[user for user in landed if user in d.transit],
                returned=[user for user in returned if user in d.transit],
            )
        )
        self.landed += len(landed)
        self.returned += len(returned)

    def _cut_over(self, cluster_id: str) -> Steps:
        cluster = self.world.routing.cluster(cluster_id)
        if cluster is not None and cluster.state not in (
            ClusterState.ARRIVING,
            ClusterState.DEPARTING,
        ):
            self._change(lambda d: with_cut_over(d, cluster_id))
        yield from self._finish_cut_over(cluster_id)

    def _finish_cut_over(self, cluster_id: str) -> Steps:
        """Wait until the old owners let go of every user in transit by the cut-over;
        hold (joining) or give up on (leaving) those that will not; then end it."""
        document = self.world.routing
        if self.world.config.defect == LANDS_BEFORE_LETTING_GO:
            self._change(lambda d: with_cut_over_done(d, cluster_id))
            return
        sources = document.hash_owners
        yield from self._applied(sources, document.epoch)
        deadline = self.world.scheduler.now_ms + QUIESCE_MS
        while True:
            leaving: dict[str, int] = {}
            for source in sources:
                state = yield from self._leader_state(source)
                leaving[source] = len(state.leaving)
            if not any(leaving.values()) or self.world.scheduler.now_ms >= deadline:
                break
            yield POLL_MS
        stuck: list[int] = []
        for source, count in leaving.items():
            if count:
                residents = yield from self._residents(source)
                stuck += stuck_at_cut_over(document, residents)
        cluster = document.cluster(cluster_id)
        if stuck and cluster is not None and cluster.state == ClusterState.DEPARTING:
            self._change(lambda d: with_cut_over_undone(d, cluster_id))
            raise WaveBlocked(f"{cluster_id} cannot leave: users {stuck[:8]} not flat")
        if stuck:
            self._change(lambda d: with_held(d, stuck))
            self.figures["scale_users_held"] += len(stuck)
        self._change(lambda d: with_cut_over_done(d, cluster_id))

    def _applied(self, clusters: Iterable[str], epoch: int) -> Steps:
        """Until every one of `clusters` has logged `epoch` (or a newer one)."""
        waiting = set(clusters)
        deadline = self.world.scheduler.now_ms + APPLY_MS
        while waiting:
            for cluster_id in sorted(waiting):
                leader = self.world.leading_replica(cluster_id)
                routing = leader.machine.state.routing if leader is not None else None
                if routing is not None and routing.epoch >= epoch:
                    waiting.discard(cluster_id)
            if not waiting:
                return
            if self.world.scheduler.now_ms >= deadline:
                raise WaveStalled(f"{sorted(waiting)} did not log epoch {epoch}")
            yield POLL_MS

    # --- the shards, as `ShardProbe` asks them -------------------------------------------

    def _leader_state(self, cluster_id: str) -> Steps:
        """The state of the group's leader, waiting for one (the probe retries)."""
        deadline = self.world.scheduler.now_ms + APPLY_MS
        while True:
            leader = self.world.leading_replica(cluster_id)
            if leader is not None:
                return leader.machine.state
            if self.world.scheduler.now_ms >= deadline:
                raise WaveStalled(f"{cluster_id} has no leader to ask")
            yield POLL_MS

    def _residents(self, cluster_id: str) -> Steps:
        state = yield from self._leader_state(cluster_id)
        return sorted(state.actors)

    # --- etcd ---------------------------------------------------------------------------

    def _change(self, decide: Callable[[RoutingDocument], RoutingDocument]) -> RoutingDocument:
        """The compare-and-swap of the next epoch (one writer here: it always lands)."""
        world = self.world
        world.routing = decide(world.routing)
        world.gateway.routing_changed(world.routing)
        return world.routing
