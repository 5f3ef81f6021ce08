"""Which users a scaling operation moves, and where: the wave controller's decisions.

Pure functions of a routing document and of the users the shards report resident,
used by the real controller (`services/routing/wave_controller.py`, which asks the
shards over gRPC and changes the document in etcd) and by the simulation's
(`simulation/core/routing_model.py`, which asks simulated shards), so both decide
alike. Each mover maps a user to its destination cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_document import RoutingDocument


def owned_by_hash(document: RoutingDocument, user_id: int) -> bool:
    """Whether the user is owned by the hash (not pinned, moved or in transit)."""
    return (
        user_id not in document.pins
        and user_id not in document.moves
        and user_id not in document.transit
    )


def arrivals(
    document: RoutingDocument, residents: Mapping[str, Iterable[int]], cluster_id: str
) -> dict[int, str]:
    """Scale-out: the resident users (`residents`, by owner) that the hash gives to
    `cluster_id` once it owns by hash beside today's owners."""
    after = (*document.hash_owners, cluster_id)
    return {
        user: cluster_id
        for owner in document.hash_owners
        for user in residents.get(owner, ())
        if owned_by_hash(document, user) and rendezvous_owner(user, after) == cluster_id
    }


def homes_without(document: RoutingDocument, users: Iterable[int], leaving: str) -> dict[int, str]:
    """Where each of `users` goes once `leaving` is gone: the hash over the others."""
    others = [c for c in document.hash_owners if c != leaving]
    return {user: rendezvous_owner(user, others) for user in users}


def departures(
    document: RoutingDocument, residents: Iterable[int], cluster_id: str
) -> dict[int, str]:
    """Scale-in: the users resident on `cluster_id` that it owns now, to their homes
    without it."""
    leaving = [user for user in residents if document.owner_of(user) == cluster_id]
    return homes_without(document, leaving, cluster_id)


def moved_to(document: RoutingDocument, cluster_id: str) -> list[int]:
    """The users a move (not the hash) gives to `cluster_id`, by id."""
    return sorted(user for user, owner in document.moves.items() if owner == cluster_id)


def waves_of(movers: Mapping[int, str], size: int) -> list[list[int]]:
    """The movers in waves of at most `size` users, by id."""
    users = sorted(movers)
    return [users[start : start + size] for start in range(0, len(users), size)]


def still_to_move(
    document: RoutingDocument, wave: Sequence[int], movers: Mapping[int, str]
) -> list[int]:
    """The users of `wave` the document still gives elsewhere than their destination: a
    user pinned, moved or in transit meanwhile is left alone (the wave is re-decided on
    what the document says now)."""
    return [user for user in wave if document.owner_of(user) not in (None, movers[user])]


def stuck_at_cut_over(document: RoutingDocument, residents: Iterable[int]) -> list[int]:
    """Of a source's resident users, those in transit by the cut-over under way (not by
    a wave): still held after the quiesce time, they would not go flat."""
    return [
        user
        for user in residents
        if document.owner_of(user) is None and user not in document.transit
    ]
