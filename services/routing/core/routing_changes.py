"""Changes to a routing document that move no user: each returns the next epoch's
document, or refuses with `RoutingDocumentError` saying why.

Only changes that leave every user's owner where it was live here: a first document,
a cluster joining as `receiving` (it owns nobody by hash until it is made active), and
an `active` cluster starting to drain (it keeps owning its users by hash until the
waves have moved them). Changes that move users (making a cluster active, removing a
drained one, pins, tier changes) must run as fenced waves: quiesce, flush, evict,
flip; they are not built yet (issue 12).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.routing.core.routing_document import (
    Cluster,
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
)


def first_document(cluster_ids: Sequence[str]) -> RoutingDocument:
    """Epoch 1: the given clusters, all active, no pins."""
    if not cluster_ids:
        raise RoutingDocumentError("a first document names at least one cluster")
    return RoutingDocument.build(1, [Cluster(c, ClusterState.ACTIVE) for c in cluster_ids])


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
    held = sorted(
        user
        for user, owner in (*document.pins.items(), *document.moves.items())
        if owner == cluster_id
    )
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
