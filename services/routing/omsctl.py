"""`omsctl`: the operator's tool for the mesh's routing document in etcd.

    omsctl show                      the document: epoch, clusters, pins, moves
    omsctl owner USER_ID             which cluster owns a user under the current epoch
    omsctl init --clusters s1,s2     the first document (epoch 1, all active)
    omsctl join CLUSTER              add a cluster as receiving (moves nobody)
    omsctl drain CLUSTER             an active cluster starts draining (moves nobody)

etcd and the mesh come from OMS_ETCD_ENDPOINTS and OMS_MESH_ID (or --etcd, --mesh).
Every change is a compare-and-swap of the next epoch: when another writer got there
first, the change is decided again on what it wrote (a few times, then it gives up).
Changes that move users (activating a cluster, removing one, pins, tier changes) must
run as fenced waves, which are not built yet (issue 12): `omsctl` does not offer them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.routing.core.routing_changes import (
    first_document,
    with_cluster_draining,
    with_cluster_joining,
)
from services.routing.core.routing_document import RoutingDocument, RoutingDocumentError
from services.routing.routing_store import RoutingConflictError, RoutingStore, StoredRouting
from services.settings import load_settings, setting

SWAP_ATTEMPTS = 5


@dataclass(frozen=True)
class OmsctlSettings:
    etcd_endpoints: tuple[str, ...] = setting(env="OMS_ETCD_ENDPOINTS", default=())
    mesh_id: str = setting(env="OMS_MESH_ID", default=DEFAULT_MESH_ID)


class OmsctlError(RuntimeError):
    """What the operator asked cannot be done now (the message says why)."""


def describe(stored: StoredRouting | None) -> str:
    if stored is None:
        return "no routing document yet (omsctl init --clusters ...)"
    document = stored.document
    lines = [f"epoch {document.epoch} (etcd revision {stored.mod_revision})", "clusters:"]
    lines += [f"  {c.cluster_id:<20} {c.state.value}" for c in document.clusters]
    lines.append(f"pins: {len(document.pins)}")
    lines += [f"  user {user} -> {cluster}" for user, cluster in document.pins.items()]
    lines.append(f"moves: {len(document.moves)}")
    lines += [f"  user {user} -> {cluster}" for user, cluster in document.moves.items()]
    lines.append(f"in transit: {len(document.transit)}")
    lines += [
        f"  user {user} {t.source} -> {t.destination}" + (" (pin)" if t.pin else "")
        for user, t in document.transit.items()
    ]
    return "\n".join(lines)


async def change(
    store: RoutingStore, decide: Callable[[StoredRouting | None], RoutingDocument]
) -> StoredRouting:
    """Read, decide the next document from what was read, swap; again on a conflict."""
    for _ in range(SWAP_ATTEMPTS):
        current = await store.read()
        try:
            return await store.swap(current, decide(current))
        except RoutingConflictError:
            continue
    raise OmsctlError(f"the routing document kept changing: gave up after {SWAP_ATTEMPTS} tries")


def _current(stored: StoredRouting | None) -> RoutingDocument:
    if stored is None:
        raise OmsctlError("no routing document yet: omsctl init --clusters ...")
    return stored.document


async def run(arguments: argparse.Namespace, settings: OmsctlSettings) -> str:
    if not settings.etcd_endpoints:
        raise OmsctlError("no etcd: set OMS_ETCD_ENDPOINTS or --etcd")
    async with EtcdSession(settings.etcd_endpoints) as session:
        store = RoutingStore(session, settings.mesh_id)
        if arguments.action == "show":
            return describe(await store.read())
        if arguments.action == "owner":
            document = _current(await store.read())
            owner = document.owner_of(arguments.user_id) or "in transit (owned by none)"
            return f"user {arguments.user_id}: {owner} (epoch {document.epoch})"
        if arguments.action == "init":
            clusters = [c for c in arguments.clusters.split(",") if c]

            def first(stored: StoredRouting | None) -> RoutingDocument:
                if stored is not None:
                    raise OmsctlError(f"a routing document exists (epoch {stored.epoch})")
                return first_document(clusters)

            return describe(await change(store, first))
        if arguments.action == "join":
            stored = await change(
                store, lambda s: with_cluster_joining(_current(s), arguments.cluster)
            )
            return describe(stored)
        if arguments.action == "drain":
            stored = await change(
                store, lambda s: with_cluster_draining(_current(s), arguments.cluster)
            )
            return describe(stored)
    raise OmsctlError(f"unknown action {arguments.action}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="omsctl", description=__doc__.split("\n\n")[0])
    top.add_argument("--etcd", default=None, help="host:port,... (env OMS_ETCD_ENDPOINTS)")
    top.add_argument("--mesh", default=None, help="the mesh id (env OMS_MESH_ID)")
    actions = top.add_subparsers(dest="action", required=True)
    actions.add_parser("show", help="the routing document")
    owner = actions.add_parser("owner", help="the cluster that owns a user now")
    owner.add_argument("user_id", type=int)
    init = actions.add_parser("init", help="the first document: every cluster active")
    init.add_argument("--clusters", required=True, help="s1,s2,...")
    join = actions.add_parser("join", help="add a cluster as receiving")
    join.add_argument("cluster")
    drain = actions.add_parser("drain", help="an active cluster starts draining")
    drain.add_argument("cluster")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    settings = load_settings(
        OmsctlSettings,
        overrides={
            "etcd_endpoints": tuple(arguments.etcd.split(",")) if arguments.etcd else None,
            "mesh_id": arguments.mesh,
        },
    )
    try:
        print(asyncio.run(run(arguments, settings)))
    except (OmsctlError, RoutingDocumentError, CoordinationUnavailable) as error:
        print(f"omsctl: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
