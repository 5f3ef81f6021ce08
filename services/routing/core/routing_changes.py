"""Changes to a routing document: each returns the next epoch's document, or refuses
with `RoutingDocumentError` saying why.

Changes that move nobody: a first document, a cluster joining as `receiving` (it owns
nobody by hash until it is made active), and an `active` cluster starting to drain (it
keeps owning its users by hash until the waves have moved them).

A user moves in two epochs, never one, so no epoch has it owned twice:
1. `with_in_transit`: owned by nobody; its old owner refuses it and lets it go once
   flat (quiesce, flush with the versioned CAS, evict);
2. once the old owner has let go (the wave controller checks), `with_landed` gives
   it to its new owner (a move or a pin), which hydrates it from PostgreSQL on its
   next command; `with_returned` gives it back instead (a user that would not go flat).
A membership change does the same for every user the hash moves, without listing
them: `with_cut_over` (receiving -> arriving, draining -> departing) puts them all in
transit for one epoch, `with_cut_over_done` (arriving -> active, departing -> gone)
lands them. Resident users go ahead of that in waves, each a transit of a few.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_document import (
    LEAVING,
    Cluster,
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
    Transit,
)


def first_document(cluster_ids: Sequence[str], receiving: Sequence[str] = ()) -> RoutingDocument:
    """Epoch 1: the given clusters, all active, no pins; those of `receiving` joined
    as receiving instead (they own nobody until a scale-out activates them)."""
    if not cluster_ids:
        raise RoutingDocumentError("a first document names at least one cluster")
    clusters = [Cluster(c, ClusterState.ACTIVE) for c in cluster_ids]
    clusters += [Cluster(c, ClusterState.RECEIVING) for c in receiving]
    return RoutingDocument.build(1, clusters)


def with_cluster_joining(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """`cluster_id` added as receiving: nobody's owner changes."""
    if document.cluster(cluster_id) is not None:
        raise RoutingDocumentError(f"cluster {cluster_id} is already in epoch {document.epoch}")
    return RoutingDocument.build(
        document.epoch + 1,
        [*document.clusters, Cluster(cluster_id, ClusterState.RECEIVING)],
        document.pins,
        document.moves,
    )


def with_cluster_draining(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """`cluster_id` (active) starts draining: it still owns its users by hash, takes no
    new pins or moves; nobody's owner changes."""
    cluster = document.cluster(cluster_id)
    if cluster is None:
        raise RoutingDocumentError(f"no cluster {cluster_id} in epoch {document.epoch}")
    if cluster.state != ClusterState.ACTIVE:
        raise RoutingDocumentError(
            f"cluster {cluster_id} is {cluster.state.value}: only an active cluster drains"
        )
    held = _pinned_or_moved_to(document, cluster_id)
    if held:
        raise RoutingDocumentError(
            f"cluster {cluster_id} holds pinned or moved users ({', '.join(map(str, held))}): "
            "move them first"
        )
    clusters = [
        Cluster(c.cluster_id, ClusterState.DRAINING) if c.cluster_id == cluster_id else c
        for c in document.clusters
    ]
    return RoutingDocument.build(document.epoch + 1, clusters, document.pins, document.moves)


def with_drain_cancelled(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """`cluster_id` (draining) active again: it owned its users by hash all along, so
    nobody's owner changes (a scale-in taken back before its cut-over)."""
    if _state(document, cluster_id) != ClusterState.DRAINING:
        raise RoutingDocumentError(f"cluster {cluster_id} is not draining")
    return _with_state(document, cluster_id, ClusterState.ACTIVE)


# --- moving users: transit, then landed or returned -------------------------------------


def with_in_transit(
    document: RoutingDocument, destinations: Mapping[int, str], *, pin: bool = False
) -> RoutingDocument:
    """Each user of `destinations` in transit from its owner now to its destination
    (landing as a pin when `pin`). A user already in transit keeps its source and gets
    the new destination: rapid changes of one user coalesce into the last. A user whose
    owner is already the destination, or in transit by a cut-over, is refused."""
    pins, moves, transit = dict(document.pins), dict(document.moves), dict(document.transit)
    for user_id, destination in sorted(destinations.items()):
        moving = transit.get(user_id)
        if moving is not None:
            if moving.source == destination:
                raise RoutingDocumentError(
                    f"user {user_id} would go back to {destination}: return it instead"
                )
            transit[user_id] = Transit(moving.source, destination, moving.pinned, pin)
            continue
        source = document.owner_of(user_id)
        if source is None:
            raise RoutingDocumentError(f"user {user_id} is in transit by the cut-over")
        if source == destination:
            raise RoutingDocumentError(f"user {user_id} is on {destination} already")
        pinned = pins.pop(user_id, None) is not None
        moves.pop(user_id, None)
        transit[user_id] = Transit(source, destination, pinned, pin)
    return RoutingDocument.build(document.epoch + 1, document.clusters, pins, moves, transit)


def with_landed(document: RoutingDocument, users: Iterable[int]) -> RoutingDocument:
    """Each user of `users` (in transit) owned by its destination: a pin if it lands as
    one, else a move, or nothing when the hash already gives it there."""
    return with_transit_ended(document, landed=users, returned=())


def with_returned(document: RoutingDocument, users: Iterable[int]) -> RoutingDocument:
    """Each user of `users` (in transit) owned by its source again, as it was (pinned
    there if it was): for a user that did not go flat in time."""
    return with_transit_ended(document, landed=(), returned=users)


def with_transit_ended(
    document: RoutingDocument, *, landed: Iterable[int], returned: Iterable[int]
) -> RoutingDocument:
    """`landed` users owned by their destinations and `returned` ones by their sources,
    in one epoch."""
    pins, moves, transit = dict(document.pins), dict(document.moves), dict(document.transit)
    ends = [(user, True) for user in sorted(set(landed))]
    ends += [(user, False) for user in sorted(set(returned))]
    for user_id, forward in ends:
        entry = transit.pop(user_id, None)
        if entry is None:
            raise RoutingDocumentError(f"user {user_id} is not in transit")
        owner = entry.destination if forward else entry.source
        as_pin = entry.pin if forward else entry.pinned
        if as_pin:
            pins[user_id] = owner
        elif _owner_by_hash(document, user_id) != owner:
            state = _state(document, owner)
            if state in LEAVING:
                raise RoutingDocumentError(
                    f"user {user_id} cannot go back to {owner}: it is {state.value}"
                )
            moves[user_id] = owner
    return RoutingDocument.build(document.epoch + 1, document.clusters, pins, moves, transit)


def with_pin_in_place(
    document: RoutingDocument, user_id: int, cluster_id: str | None
) -> RoutingDocument:
    """Pin `user_id` to the cluster that owns it now (`cluster_id`), or unpin it (None)
    where its owner without the pin is the same: a tier change that moves nobody."""
    owner = document.owner_of(user_id)
    pins, moves = dict(document.pins), dict(document.moves)
    if cluster_id is not None:
        if owner != cluster_id:
            raise RoutingDocumentError(
                f"user {user_id} is owned by {owner or 'nobody (in transit)'}, not "
                f"{cluster_id}: pinning it there moves it"
            )
        moves.pop(user_id, None)
        pins[user_id] = cluster_id
    else:
        if user_id not in pins:
            raise RoutingDocumentError(f"user {user_id} is not pinned")
        del pins[user_id]
        if _owner_by_hash(document, user_id) != owner:
            raise RoutingDocumentError(
                f"user {user_id}: unpinned it would leave {owner}: that is a move"
            )
    return RoutingDocument.build(
        document.epoch + 1, document.clusters, pins, moves, document.transit
    )


def without_receiving_cluster(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """Remove a receiving cluster that holds nobody (a join taken back): moves nobody."""
    if _state(document, cluster_id) != ClusterState.RECEIVING:
        raise RoutingDocumentError(f"cluster {cluster_id} is not receiving")
    held = _pinned_or_moved_to(document, cluster_id) + sorted(
        user for user, t in document.transit.items() if cluster_id in (t.source, t.destination)
    )
    if held:
        raise RoutingDocumentError(
            f"cluster {cluster_id} still holds user(s) {', '.join(map(str, held))}"
        )
    clusters = [c for c in document.clusters if c.cluster_id != cluster_id]
    return RoutingDocument.build(
        document.epoch + 1, clusters, document.pins, document.moves, document.transit
    )


# --- membership: the cut-over epoch ---------------------------------------------------


def with_cut_over(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """The cut-over of `cluster_id`: receiving -> arriving (the users the hash gives it
    are in transit), or draining -> departing (the users it owns by hash are). One
    membership change at a time."""
    state = _state(document, cluster_id)
    if document.cutting_over:
        raise RoutingDocumentError(f"a cut-over is already under way in epoch {document.epoch}")
    following = {ClusterState.RECEIVING: ClusterState.ARRIVING}
    following[ClusterState.DRAINING] = ClusterState.DEPARTING
    if state not in following:
        raise RoutingDocumentError(
            f"cluster {cluster_id} is {state.value}: only a receiving or a draining one cuts over"
        )
    return _with_state(document, cluster_id, following[state])


def with_cut_over_done(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """End the cut-over: arriving -> active, departing -> removed. Moves the hash now
    makes redundant are dropped; a departing cluster must be left by every pin, move
    and transit first."""
    state = _state(document, cluster_id)
    if state == ClusterState.ARRIVING:
        clusters = [
            Cluster(c.cluster_id, ClusterState.ACTIVE) if c.cluster_id == cluster_id else c
            for c in document.clusters
        ]
    elif state == ClusterState.DEPARTING:
        held = _pinned_or_moved_to(document, cluster_id) + sorted(
            user for user, t in document.transit.items() if t.source == cluster_id
        )
        if held:
            raise RoutingDocumentError(
                f"cluster {cluster_id} still holds user(s) {', '.join(map(str, held))}"
            )
        clusters = [c for c in document.clusters if c.cluster_id != cluster_id]
    else:
        raise RoutingDocumentError(
            f"cluster {cluster_id} is {state.value}: no cut-over of it is under way"
        )
    after = RoutingDocument.build(document.epoch + 1, clusters, document.pins, {}, document.transit)
    moves = {
        user: owner
        for user, owner in document.moves.items()
        if _owner_by_hash(after, user) != owner
    }
    return RoutingDocument.build(after.epoch, clusters, document.pins, moves, document.transit)


def with_cut_over_undone(document: RoutingDocument, cluster_id: str) -> RoutingDocument:
    """Back out of a cut-over: arriving -> receiving, departing -> draining. Every user
    in transit by the cut-over goes back to its owner before it, which still holds it
    or, having let go, hydrates it again from PostgreSQL."""
    state = _state(document, cluster_id)
    before = {ClusterState.ARRIVING: ClusterState.RECEIVING}
    before[ClusterState.DEPARTING] = ClusterState.DRAINING
    if state not in before:
        raise RoutingDocumentError(
            f"cluster {cluster_id} is {state.value}: no cut-over of it is under way"
        )
    return _with_state(document, cluster_id, before[state])


def with_held(document: RoutingDocument, users: Iterable[int]) -> RoutingDocument:
    """Each user of `users`, in transit by the cut-over, kept on its owner before it
    (a move there): a user that would not go flat does not hold up a scale-out. A
    later wave may move it once it is flat."""
    moves = dict(document.moves)
    for user_id in sorted(set(users)):
        if document.owner_of(user_id) is not None or user_id in document.transit:
            raise RoutingDocumentError(f"user {user_id} is not in transit by the cut-over")
        source = rendezvous_owner(user_id, document.hash_owners)
        state = _state(document, source)
        if state in LEAVING:
            raise RoutingDocumentError(
                f"user {user_id} cannot stay on {source}: it is {state.value}"
            )
        moves[user_id] = source
    return RoutingDocument.build(
        document.epoch + 1, document.clusters, document.pins, moves, document.transit
    )


def _pinned_or_moved_to(document: RoutingDocument, cluster_id: str) -> list[int]:
    """The users a pin or a move gives to `cluster_id`, by id."""
    return sorted(
        user
        for user, owner in (*document.pins.items(), *document.moves.items())
        if owner == cluster_id
    )


def _owner_by_hash(document: RoutingDocument, user_id: int) -> str | None:
    """The owner the hash alone gives (None: in transit by the cut-over)."""
    bare = RoutingDocument.build(document.epoch, document.clusters)
    return bare.owner_of(user_id)


def _state(document: RoutingDocument, cluster_id: str) -> ClusterState:
    cluster = document.cluster(cluster_id)
    if cluster is None:
        raise RoutingDocumentError(f"no cluster {cluster_id} in epoch {document.epoch}")
    return cluster.state


def _with_state(document: RoutingDocument, cluster_id: str, state: ClusterState) -> RoutingDocument:
    clusters = [
        Cluster(c.cluster_id, state) if c.cluster_id == cluster_id else c for c in document.clusters
    ]
    return RoutingDocument.build(
        document.epoch + 1, clusters, document.pins, document.moves, document.transit
    )
