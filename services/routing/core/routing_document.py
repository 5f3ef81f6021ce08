"""The routing document: every cluster with its state, the whale pins, the users a
scaling wave has moved and the users in transit, under one epoch.

It is stored as one value in etcd and changed only by compare-and-swap, so a reader
has all of epoch N or all of N+1, never half of one (seed invariant 5). Ownership of a
user under a document:

1. a whale goes to its pin;
2. a user in transit (a wave or a pin is moving it: its old owner is evicting it) is
   owned by nobody: every shard refuses it and a gateway waits for the next epoch;
3. a user a wave moved ahead of the membership goes where the wave put it;
4. everyone else goes by rendezvous hashing (`hrw.py`) over the clusters that own by
   hash. A `receiving` cluster owns nobody by hash yet (only pins and moves), so
   joining does not move users by itself; a `draining` one still owns its users by
   hash until the waves have moved them. The cut-over of a membership change is one
   epoch in which the hash is taken both ways, before (over `active`, `draining` and
   `departing`) and after (over `active`, `draining` and `arriving`): a user whose two
   owners differ is in transit, so idle users move lazily yet are never owned twice.

The encoding is canonical JSON (sorted keys, no spaces, clusters by id, users by
number), so one document has one byte string, and its digest names it everywhere.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.routing.core.hrw import rendezvous_owner

_CLUSTER_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class RoutingDocumentError(ValueError):
    """A routing document that is malformed or inconsistent (the message says how)."""


class ClusterState(enum.StrEnum):
    ACTIVE = "active"  # owns its users by hash, takes new ones
    RECEIVING = "receiving"  # joining: owns only users pinned or moved to it
    ARRIVING = "arriving"  # joining, cut-over: the users hashing to it are in transit
    DRAINING = "draining"  # leaving: owns its users by hash until waves move them
    DEPARTING = "departing"  # leaving, cut-over: the users hashing to it are in transit


HASH_OWNERS_BEFORE = (ClusterState.ACTIVE, ClusterState.DRAINING, ClusterState.DEPARTING)
HASH_OWNERS_AFTER = (ClusterState.ACTIVE, ClusterState.DRAINING, ClusterState.ARRIVING)
LEAVING = (ClusterState.DRAINING, ClusterState.DEPARTING)  # take no pins, moves, transits
CUT_OVER = (ClusterState.ARRIVING, ClusterState.DEPARTING)


@dataclass(frozen=True, slots=True)
class Transit:
    """A user on its way from `source` (evicting it) to `destination`. `pinned` says
    whether it was pinned at the source and `pin` whether it lands as a pin, so either
    way, forward or back, leaves the user with the entry it should have."""

    source: str
    destination: str
    pinned: bool = False
    pin: bool = False


@dataclass(frozen=True, slots=True)
class Cluster:
    cluster_id: str
    state: ClusterState


@dataclass(frozen=True, slots=True)
class RoutingDocument:
    epoch: int
    clusters: tuple[Cluster, ...]  # by cluster id
    pins: Mapping[int, str] = field(default_factory=dict)  # whale -> cluster, by user id
    moves: Mapping[int, str] = field(default_factory=dict)  # moved user -> cluster
    transit: Mapping[int, Transit] = field(default_factory=dict)  # user on its way

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def build(
        cls,
        epoch: int,
        clusters: Iterable[Cluster],
        pins: Mapping[int, str] | None = None,
        moves: Mapping[int, str] | None = None,
        transit: Mapping[int, Transit] | None = None,
    ) -> RoutingDocument:
        """A document in canonical order (clusters by id, users by number)."""
        return cls(
            epoch,
            tuple(sorted(clusters, key=lambda cluster: cluster.cluster_id)),
            dict(sorted((pins or {}).items())),
            dict(sorted((moves or {}).items())),
            dict(sorted((transit or {}).items())),
        )

    @property
    def hash_owners(self) -> tuple[str, ...]:
        """The clusters owning by hash (before the cut-over, when one is under way)."""
        return tuple(c.cluster_id for c in self.clusters if c.state in HASH_OWNERS_BEFORE)

    @property
    def hash_owners_after(self) -> tuple[str, ...]:
        """The clusters that will own by hash once the cut-over under way is done."""
        return tuple(c.cluster_id for c in self.clusters if c.state in HASH_OWNERS_AFTER)

    @property
    def cutting_over(self) -> bool:
        return any(cluster.state in CUT_OVER for cluster in self.clusters)

    def cluster(self, cluster_id: str) -> Cluster | None:
        for cluster in self.clusters:
            if cluster.cluster_id == cluster_id:
                return cluster
        return None

    def owner_of(self, user_id: int) -> str | None:
        """The cluster that owns `user_id` under this epoch; None while it is in transit."""
        pinned = self.pins.get(user_id)
        if pinned is not None:
            return pinned
        if user_id in self.transit:
            return None
        moved = self.moves.get(user_id)
        if moved is not None:
            return moved
        before = rendezvous_owner(user_id, self.hash_owners)
        if not self.cutting_over:
            return before
        return before if rendezvous_owner(user_id, self.hash_owners_after) == before else None

    def hash_owner_after(self, user_id: int) -> str:
        """Where hashing puts `user_id` once the cut-over under way (if any) is done."""
        return rendezvous_owner(user_id, self.hash_owners_after)

    # --- canonical encoding ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "epoch": self.epoch,
            "clusters": [{"id": c.cluster_id, "state": c.state.value} for c in self.clusters],
            "pins": {str(user): cluster for user, cluster in self.pins.items()},
            "moves": {str(user): cluster for user, cluster in self.moves.items()},
        }
        if self.transit:  # absent when empty: documents without transit encode as before
            data["transit"] = {
                str(user): {
                    "from": t.source,
                    "to": t.destination,
                    "pinned": t.pinned,
                    "pin": t.pin,
                }
                for user, t in self.transit.items()
            }
        return data

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RoutingDocument:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RoutingDocumentError(f"not JSON: {error}") from error
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: object) -> RoutingDocument:
        if not isinstance(data, dict):
            raise RoutingDocumentError("a routing document is a JSON object")
        unknown = sorted(set(data) - {"epoch", "clusters", "pins", "moves", "transit"})
        if unknown:
            raise RoutingDocumentError(f"unknown field(s): {', '.join(unknown)}")
        epoch = data.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise RoutingDocumentError("epoch: an integer")
        raw_clusters = data.get("clusters")
        if not isinstance(raw_clusters, list):
            raise RoutingDocumentError("clusters: a list of {id, state}")
        clusters = []
        for entry in raw_clusters:
            if not isinstance(entry, dict) or set(entry) != {"id", "state"}:
                raise RoutingDocumentError(f"clusters: each is {{id, state}}, not {entry!r}")
            cluster_id, state = entry["id"], entry["state"]
            if not isinstance(cluster_id, str):
                raise RoutingDocumentError(f"clusters: id {cluster_id!r} is not a string")
            try:
                clusters.append(Cluster(cluster_id, ClusterState(state)))
            except ValueError as error:
                states = ", ".join(state.value for state in ClusterState)
                raise RoutingDocumentError(
                    f"cluster {cluster_id}: state {state!r} is not one of {states}"
                ) from error
        return cls.build(
            epoch,
            clusters,
            _user_map(data.get("pins", {}), "pins"),
            _user_map(data.get("moves", {}), "moves"),
            _transit_map(data.get("transit", {})),
        )


def _user_map(raw: object, name: str) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise RoutingDocumentError(f"{name}: an object of user id -> cluster id")
    users: dict[int, str] = {}
    for key, cluster_id in raw.items():
        if not isinstance(key, str) or not key.isdigit() or not isinstance(cluster_id, str):
            raise RoutingDocumentError(f"{name}: {key!r} -> {cluster_id!r} is not user -> cluster")
        users[int(key)] = cluster_id
    return users


def _transit_map(raw: object) -> dict[int, Transit]:
    if not isinstance(raw, dict):
        raise RoutingDocumentError("transit: an object of user id -> {from, to, pinned, pin}")
    users: dict[int, Transit] = {}
    for key, entry in raw.items():
        if (
            not isinstance(key, str)
            or not key.isdigit()
            or not isinstance(entry, dict)
            or set(entry) != {"from", "to", "pinned", "pin"}
            or not isinstance(entry["from"], str)
            or not isinstance(entry["to"], str)
            or not isinstance(entry["pinned"], bool)
            or not isinstance(entry["pin"], bool)
        ):
            raise RoutingDocumentError(
                f"transit: {key!r} -> {entry!r} is not user -> {{from, to, pinned, pin}}"
            )
        users[int(key)] = Transit(entry["from"], entry["to"], entry["pinned"], entry["pin"])
    return users


def _check(document: RoutingDocument) -> None:
    if document.epoch < 1:
        raise RoutingDocumentError(f"epoch {document.epoch}: epochs start at 1")
    ids = [cluster.cluster_id for cluster in document.clusters]
    for cluster_id in ids:
        if not _CLUSTER_ID.fullmatch(cluster_id):
            raise RoutingDocumentError(
                f"cluster id {cluster_id!r}: a DNS label (lower-case letters, digits, '-')"
            )
    if ids != sorted(set(ids)):
        duplicates = sorted({cluster_id for cluster_id in ids if ids.count(cluster_id) > 1})
        if duplicates:
            raise RoutingDocumentError(f"cluster(s) listed twice: {', '.join(duplicates)}")
        raise RoutingDocumentError("clusters out of order: build documents with build()")
    if not any(cluster.state == ClusterState.ACTIVE for cluster in document.clusters):
        raise RoutingDocumentError("no active cluster: new users would have nowhere to go")
    states = {cluster.cluster_id: cluster.state for cluster in document.clusters}
    for name, users in (("pin", document.pins), ("move", document.moves)):
        if list(users) != sorted(users):
            raise RoutingDocumentError(f"{name}s out of order: build documents with build()")
        for user_id, cluster_id in users.items():
            if user_id < 1:
                raise RoutingDocumentError(f"{name} of user {user_id}: user ids start at 1")
            state = states.get(cluster_id)
            if state is None:
                raise RoutingDocumentError(
                    f"{name} of user {user_id}: no cluster {cluster_id!r} in the document"
                )
            if state in LEAVING:
                raise RoutingDocumentError(
                    f"{name} of user {user_id} to {cluster_id}: a {state.value} cluster "
                    "takes no users"
                )
    if list(document.transit) != sorted(document.transit):
        raise RoutingDocumentError("transit out of order: build documents with build()")
    for user_id, transit in document.transit.items():
        if user_id < 1:
            raise RoutingDocumentError(f"transit of user {user_id}: user ids start at 1")
        for end, cluster_id in (("from", transit.source), ("to", transit.destination)):
            if cluster_id not in states:
                raise RoutingDocumentError(
                    f"transit of user {user_id}: no cluster {cluster_id!r} ({end}) in the document"
                )
        if transit.source == transit.destination:
            raise RoutingDocumentError(
                f"transit of user {user_id}: from and to are both {transit.source}"
            )
        if states[transit.destination] in LEAVING:
            raise RoutingDocumentError(
                f"transit of user {user_id} to {transit.destination}: a "
                f"{states[transit.destination].value} cluster takes no users"
            )
    for first, second in (("pins", "moves"), ("pins", "transit"), ("moves", "transit")):
        both = sorted(set(getattr(document, first)) & set(getattr(document, second)))
        if both:
            raise RoutingDocumentError(
                f"user(s) in both {first} and {second}: {', '.join(map(str, both))} "
                "(a user has at most one entry)"
            )
