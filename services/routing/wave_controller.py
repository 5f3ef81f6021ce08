"""The wave controller: moves users between clusters by fenced epoch steps, resumable.

Every move is the seed's one primitive: quiesce the user on its old owner, flush its
state with the versioned CAS, evict, flip ownership, cold-hydrate on the new owner on
its next command. Here that is two epochs per user (`core/routing_changes.py`):

1. in transit (compare-and-swap of the next epoch): nobody owns it; the old owner
   logs the epoch, refuses the user's commands and lets it go once flat;
2. once the old owner has logged that epoch and no longer holds the user (its flush
   committed, `ShardProbe.holds`), it lands on its new owner; a user still held when
   the quiesce time is up (an open order keeps it from going flat) goes back instead.

A scale-out (`activate`) moves the resident users the hash gives the new cluster in
waves of at most `wave_size`, one wave at a time, then cuts over: one epoch puts in
transit every user the hash moves (idle users move lazily: their state is already in
PostgreSQL), the old owners let go of the few that became resident meanwhile, and the
next epoch makes the cluster active. A user that will not go flat is held on its old
owner (a move there) rather than hold up the cut-over. A scale-in (`remove`) is the
same towards the remaining clusters; a user it cannot move undoes the cut-over and
the removal stops, saying who. A pin or a tier change is one user's move.

Everything the controller knows is in etcd and in the shards, so a controller that
dies at any point is resumed by the next one (`resume`, which every operation runs
first): transits are settled, a cut-over under way is finished. A user is never owned
by two clusters in consecutive epochs; between a crash and the next run the users
in transit are owned by none (their commands wait and are retried), never by two.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_changes import (
    with_cluster_draining,
    with_cluster_joining,
    with_cut_over,
    with_cut_over_done,
    with_cut_over_undone,
    with_held,
    with_in_transit,
    with_pin_in_place,
    with_transit_ended,
    without_receiving_cluster,
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
from services.routing.routing_store import RoutingStore, StoredRouting
from services.routing.shard_probe import ShardProbe

log = structlog.get_logger(__name__)


class WaveStalledError(RuntimeError):
    """A shard did not log an epoch, or answer, within the time allowed."""


class WaveBlockedError(RuntimeError):
    """Users that would not go flat kept a cluster from being removed; the cut-over was
    undone, and they stay where they were (the message names them)."""

    def __init__(self, message: str, users: Sequence[int]) -> None:
        super().__init__(message)
        self.users = list(users)


@dataclass(frozen=True)
class WaveSettings:
    wave_size: int = 64  # users in transit at once
    quiesce_s: float = 10.0  # how long a user may take to go flat and be flushed
    apply_s: float = 10.0  # how long a shard may take to log a new epoch
    poll_s: float = 0.02


@dataclass
class WaveProgress:
    """What the controller did; printed by omsctl, the status of the operator's resource."""

    operation: str
    epoch: int = 0
    phase: str = "starting"
    to_move: int = 0  # resident users the operation moves in waves
    moved: int = 0
    waves: int = 0
    returned: list[int] = field(default_factory=list)  # went back: not flat in time
    held: list[int] = field(default_factory=list)  # kept on their old owner at a cut-over
    started_at: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"{self.operation}: {self.phase}, epoch {self.epoch}, waves {self.waves}, moved "
            f"{self.moved}/{self.to_move}, returned {len(self.returned)}, held {len(self.held)}"
        )


Report = Callable[[WaveProgress], None]


class WaveController:
    def __init__(
        self,
        store: RoutingStore,
        shards: ShardProbe,
        settings: WaveSettings | None = None,
        report: Report | None = None,
    ) -> None:
        self.store = store
        self.shards = shards
        self.settings = settings or WaveSettings()
        self.report = report or (lambda progress: None)

    # --- operations -------------------------------------------------------------------

    async def resume(self, progress: WaveProgress | None = None) -> WaveProgress:
        """Settle every transit and finish a cut-over under way (a previous controller's);
        as the first step of another operation when given its `progress`."""
        own = progress is None
        progress = progress or WaveProgress("resume")
        document = await self._document()
        if document.transit:
            await self._settle(list(document.transit), progress)
        document = await self._document()
        for cluster in document.clusters:
            if cluster.state in (ClusterState.ARRIVING, ClusterState.DEPARTING):
                await self._finish_cut_over(cluster.cluster_id, progress)
        return self._done(progress) if own else progress

    async def activate(self, cluster_id: str) -> WaveProgress:
        """Scale out: `cluster_id` (joined as receiving, or joined now) owns by hash."""
        progress = WaveProgress(f"activate {cluster_id}")
        await self.resume(progress)
        document = await self._document()
        cluster = document.cluster(cluster_id)
        if cluster is None:
            document = await self._change(progress, lambda d: with_cluster_joining(d, cluster_id))
        elif cluster.state == ClusterState.ACTIVE:
            return self._done(progress)
        elif cluster.state != ClusterState.RECEIVING:
            raise RoutingDocumentError(f"cluster {cluster_id} is {cluster.state.value}")
        residents = {owner: await self.shards.residents(owner) for owner in document.hash_owners}
        await self._waves(arrivals(document, residents, cluster_id), progress)
        await self._cut_over(cluster_id, progress)
        return self._done(progress)

    async def remove(self, cluster_id: str) -> WaveProgress:
        """Scale in: every user of `cluster_id` goes where the hash puts it without it,
        then the cluster leaves the document."""
        progress = WaveProgress(f"remove {cluster_id}")
        await self.resume(progress)
        document = await self._document()
        cluster = document.cluster(cluster_id)
        if cluster is None:
            return self._done(progress)
        pinned = sorted(user for user, owner in document.pins.items() if owner == cluster_id)
        if pinned:
            raise RoutingDocumentError(
                f"cluster {cluster_id} has pinned users {', '.join(map(str, pinned))}: "
                "pin them elsewhere (or unpin them) first"
            )
        if cluster.state == ClusterState.RECEIVING:
            moved_here = moved_to(document, cluster_id)
            await self._waves(homes_without(document, moved_here, cluster_id), progress)
            await self._change(progress, lambda d: without_receiving_cluster(d, cluster_id))
            return self._done(progress)
        if cluster.state == ClusterState.ACTIVE:
            document = await self._change(progress, lambda d: with_cluster_draining(d, cluster_id))
        residents_here = await self.shards.residents(cluster_id)
        await self._waves(departures(document, residents_here, cluster_id), progress)
        await self._cut_over(cluster_id, progress)
        return self._done(progress)

    async def move(self, user_id: int, cluster_id: str | None, *, pin: bool) -> WaveProgress:
        """One user: pinned to `cluster_id` (a whale), or unpinned (None: back to where
        the hash puts it). Moves it only if its owner changes."""
        what = f"pin {user_id} to {cluster_id}" if pin else f"unpin {user_id}"
        progress = WaveProgress(what)
        await self.resume(progress)
        document = await self._document()
        if cluster_id is None:
            target = rendezvous_owner(user_id, document.hash_owners)
            moved = document.moves.get(user_id)
            target = moved or target
        else:
            target = cluster_id
        owner = document.owner_of(user_id)
        if owner == target:
            if (user_id in document.pins) != pin:
                await self._change(
                    progress, lambda d: with_pin_in_place(d, user_id, target if pin else None)
                )
            return self._done(progress)
        progress.to_move = 1
        await self._transit({user_id: target}, progress, pin=pin)
        return self._done(progress)

    # --- steps ------------------------------------------------------------------------

    async def _waves(self, movers: dict[int, str], progress: WaveProgress) -> None:
        progress.to_move += len(movers)
        for planned in waves_of(movers, self.settings.wave_size):
            wave = still_to_move(await self._document(), planned, movers)
            if wave:
                await self._transit({u: movers[u] for u in wave}, progress, pin=False)

    async def _transit(
        self, destinations: dict[int, str], progress: WaveProgress, *, pin: bool
    ) -> None:
        progress.phase = "in transit"
        await self._change(progress, lambda d: with_in_transit(d, destinations, pin=pin))
        progress.waves += 1
        await self._settle(list(destinations), progress)

    async def _settle(self, users_in_transit: Sequence[int], progress: WaveProgress) -> None:
        """Land every user of `users_in_transit` its source has let go; return the rest
        once the quiesce time is up."""
        document = await self._document()
        wanted = set(users_in_transit)
        users = [u for u in document.transit if u in wanted]
        by_source: dict[str, list[int]] = {}
        for user in users:
            by_source.setdefault(document.transit[user].source, []).append(user)
        await self._applied(by_source, document.epoch)
        progress.phase = "letting go"
        deadline = time.monotonic() + self.settings.quiesce_s
        while True:
            still: set[int] = set()
            for source, waiting in by_source.items():
                still |= await self.shards.holds(source, waiting)
            if not still or time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.settings.poll_s)
        landed = [u for u in users if u not in still]
        returned = sorted(still)
        await self._change(
            progress,
            lambda d: with_transit_ended(
                d,
                landed=[u for u in landed if u in d.transit],
                returned=[u for u in returned if u in d.transit],
            ),
        )
        progress.moved += len(landed)
        progress.returned += returned
        if returned:
            log.warning("routing.users_returned", users=returned[:20], count=len(returned))

    async def _cut_over(self, cluster_id: str, progress: WaveProgress) -> None:
        document = await self._document()
        cluster = document.cluster(cluster_id)
        if cluster is not None and cluster.state not in (
            ClusterState.ARRIVING,
            ClusterState.DEPARTING,
        ):
            await self._change(progress, lambda d: with_cut_over(d, cluster_id))
        await self._finish_cut_over(cluster_id, progress)

    async def _finish_cut_over(self, cluster_id: str, progress: WaveProgress) -> None:
        """Wait until the old owners let go of every user in transit by the cut-over; hold
        (joining) or give up on (leaving) those that will not; then end it."""
        progress.phase = "cutting over"
        document = await self._document()
        sources = document.hash_owners
        await self._applied(sources, document.epoch)
        deadline = time.monotonic() + self.settings.quiesce_s
        while True:
            leaving = {c: (await self.shards.routing_state(c))[1] for c in sources}
            if not any(leaving.values()) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.settings.poll_s)
        stuck = [
            user
            for source, count in leaving.items()
            if count
            for user in stuck_at_cut_over(document, await self.shards.residents(source))
        ]
        state = document.cluster(cluster_id)
        if stuck and state is not None and state.state == ClusterState.DEPARTING:
            await self._change(progress, lambda d: with_cut_over_undone(d, cluster_id))
            raise WaveBlockedError(
                f"cluster {cluster_id} cannot leave: user(s) {', '.join(map(str, stuck[:20]))} "
                f"did not go flat in {self.settings.quiesce_s:g} s (open orders?); the "
                "cut-over is undone, run it again once they are flat",
                stuck,
            )
        if stuck:
            await self._change(progress, lambda d: with_held(d, stuck))
            progress.held += stuck
            log.warning("routing.users_held", users=stuck[:20], count=len(stuck))
        await self._change(progress, lambda d: with_cut_over_done(d, cluster_id))

    async def _applied(self, clusters: Iterable[str], epoch: int) -> None:
        """Until every one of `clusters` has logged `epoch` (or a newer one)."""
        waiting = set(clusters)
        deadline = time.monotonic() + self.settings.apply_s
        while waiting:
            for cluster_id in sorted(waiting):
                logged, _ = await self.shards.routing_state(cluster_id)
                if logged >= epoch:
                    waiting.discard(cluster_id)
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise WaveStalledError(
                    f"cluster(s) {', '.join(sorted(waiting))} did not log epoch {epoch} "
                    f"within {self.settings.apply_s:g} s"
                )
            await asyncio.sleep(self.settings.poll_s)

    # --- etcd ---------------------------------------------------------------------------

    async def _document(self) -> RoutingDocument:
        stored = await self.store.read()
        if stored is None:
            raise RoutingDocumentError("no routing document yet: omsctl init --clusters ...")
        return stored.document

    async def _change(
        self, progress: WaveProgress, decide: Callable[[RoutingDocument], RoutingDocument]
    ) -> RoutingDocument:
        def next_document(stored: StoredRouting | None) -> RoutingDocument:
            if stored is None:
                raise RoutingDocumentError("no routing document yet: omsctl init --clusters ...")
            return decide(stored.document)

        stored = await self.store.change(next_document)
        progress.epoch = stored.epoch
        self.report(progress)
        return stored.document

    def _done(self, progress: WaveProgress) -> WaveProgress:
        progress.phase = "done"
        progress.seconds = time.monotonic() - progress.started_at
        self.report(progress)
        return progress
