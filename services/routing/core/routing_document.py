"""The routing document: every cluster with its state, the whale pins and the users a
scaling wave has moved, under one epoch.

It is stored as one value in etcd and changed only by compare-and-swap, so a reader
has all of epoch N or all of N+1, never half of one (seed invariant 5). Ownership of a
user under a document:

1. a whale goes to its pin;
2. a user a wave moved ahead of the membership goes where the wave put it;
3. everyone else goes by rendezvous hashing (`hrw.py`) over the clusters that own by
   hash: `active` and `draining` ones. A `receiving` cluster owns nobody by hash yet
   (only pins and moves), so joining does not move users by itself; a `draining` one
   still owns its users by hash until the waves have moved them and it is removed.

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
    DRAINING = "draining"  # leaving: owns its users by hash until waves move them


HASH_OWNERS = (ClusterState.ACTIVE, ClusterState.DRAINING)


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

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def build(
        cls,
        epoch: int,
        clusters: Iterable[Cluster],
        pins: Mapping[int, str] | None = None,
        moves: Mapping[int, str] | None = None,
    ) -> RoutingDocument:
        """A document in canonical order (clusters by id, users by number)."""
        return cls(
            epoch,
            tuple(sorted(clusters, key=lambda cluster: cluster.cluster_id)),
            dict(sorted((pins or {}).items())),
            dict(sorted((moves or {}).items())),
        )

    @property
    def hash_owners(self) -> tuple[str, ...]:
        return tuple(c.cluster_id for c in self.clusters if c.state in HASH_OWNERS)

    def cluster(self, cluster_id: str) -> Cluster | None:
        for cluster in self.clusters:
            if cluster.cluster_id == cluster_id:
                return cluster
        return None

    def owner_of(self, user_id: int) -> str:
        pinned = self.pins.get(user_id)
        if pinned is not None:
            return pinned
        moved = self.moves.get(user_id)
        if moved is not None:
            return moved
        return rendezvous_owner(user_id, self.hash_owners)

    # --- canonical encoding ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "clusters": [{"id": c.cluster_id, "state": c.state.value} for c in self.clusters],
            "pins": {str(user): cluster for user, cluster in self.pins.items()},
            "moves": {str(user): cluster for user, cluster in self.moves.items()},
        }

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
        unknown = sorted(set(data) - {"epoch", "clusters", "pins", "moves"})
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
            if state == ClusterState.DRAINING:
                raise RoutingDocumentError(
                    f"{name} of user {user_id} to {cluster_id}: a draining cluster takes no users"
                )
    both = sorted(set(document.pins) & set(document.moves))
    if both:
        raise RoutingDocumentError(
            f"user(s) both pinned and moved: {', '.join(map(str, both))} (a pin wins; "
            "drop the move)"
        )
