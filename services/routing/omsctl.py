"""`omsctl`: the operator's tool for the mesh's routing document in etcd.

    omsctl show                      the document: epoch, clusters, pins, moves
    omsctl owner USER_ID             which cluster owns a user under the current epoch
    omsctl init --clusters s1,s2     the first document (epoch 1, all active)
    omsctl join CLUSTER              add a cluster as receiving (moves nobody)
    omsctl drain CLUSTER             an active cluster starts draining (moves nobody)
    omsctl residents [CLUSTER ...]   each cluster's resident users (count and first ids)

Changes that move users run as fenced waves (`wave_controller.py`), printing their
progress; each first settles whatever a previous, interrupted run left in transit:

    omsctl activate CLUSTER          scale out: the cluster (joined if need be) owns by hash
    omsctl remove CLUSTER            scale in: its users go to the others, then it leaves
    omsctl pin USER_ID CLUSTER       a whale, pinned (moved if its owner changes)
    omsctl unpin USER_ID             back to where the hash (or a wave) puts it
    omsctl tier USER_ID whale --cluster CLUSTER | normal    the same, as a tier change
    omsctl resume                    settle transits and finish a cut-over under way

And the state-machine versions of the shard and matcher groups (`oms upgrade`):

    omsctl upgrade status            each group's version, each replica's build
    omsctl upgrade activate GROUP N  the group's leader logs the switch to version N

A mesh of one shard cluster (`oms up` without `--shards`) routes every user to it
statically and has no routing document: `show` and `owner` say so, and `residents`
asks that one cluster.

etcd and the mesh come from OMS_ETCD_ENDPOINTS and OMS_MESH_ID (or --etcd, --mesh),
else from the local mesh's state folder (`--state-dir`, OMS_STATE_DIR or `state/`,
whose TLS identity it then uses too); the shards from OMS_SHARDS (`s1=host:port,...`,
or --shards), else the folder's (one replica each), else their leaders' keys in etcd.
A question to a shard waits through an election (at most 20 s, saying "waiting for
a leader of s2" on stderr).

Every change is a compare-and-swap of the next epoch: when another writer got
there first, the change is decided again on what it wrote (a few times, then it gives
up). What cannot be done is refused with why, and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.manual.settings_help import TRANSPORT, list_settings
from services.mesh import upgrade_command
from services.mesh.local_mesh import LocalMesh, state_dir_of
from services.routing.core.routing_changes import (
    first_document,
    with_cluster_draining,
    with_cluster_joining,
)
from services.routing.core.routing_document import RoutingDocument, RoutingDocumentError
from services.routing.routing_store import RoutingConflictError, RoutingStore, StoredRouting
from services.routing.shard_probe import LEADER_WAIT_S, ShardProbe, ShardUnreachableError
from services.routing.wave_controller import (
    WaveBlockedError,
    WaveController,
    WaveProgress,
    WaveSettings,
    WaveStalledError,
)
from services.settings import load_settings, setting


@dataclass(frozen=True)
class OmsctlSettings:
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: the routing document and the leaders' keys",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    shards: str = setting(
        env="OMS_SHARDS",
        default="",
        help="id=host:port,... of each cluster's shard; unlisted: its leader's key in etcd",
    )


RESIDENTS_SHOWN = 10


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


def no_document(mesh_id: str, static_cluster: str = "") -> str:
    """Why the mesh has no routing document, and what makes one. `static_cluster`: the
    one shard cluster of a local mesh that routes every user to it (none has a document)."""
    if static_cluster:
        return (
            f"mesh {mesh_id} routes every user to its one shard cluster, {static_cluster}"
            " (static routing): it has no routing document. A mesh of several shard"
            " clusters routes by one: `oms up --shards N` (in a new state folder)"
        )
    return (
        f"no routing document yet for mesh {mesh_id}. A mesh of one shard cluster routes"
        " every user to it statically and has none; for several clusters,"
        " `omsctl init --clusters s1,s2,...` writes the first"
    )


def _current(stored: StoredRouting | None, why: str = "") -> RoutingDocument:
    if stored is None:
        raise OmsctlError(why or "no routing document yet: omsctl init --clusters ...")
    return stored.document


async def run(
    arguments: argparse.Namespace, settings: OmsctlSettings, static_cluster: str = ""
) -> str:
    """What the action prints. `static_cluster`: the local mesh's one shard cluster,
    when it routes statically (it has no routing document)."""
    if not settings.etcd_endpoints:
        raise OmsctlError("no etcd: set OMS_ETCD_ENDPOINTS or --etcd, or run `oms up` here")
    none_yet = no_document(settings.mesh_id, static_cluster)
    async with EtcdSession(settings.etcd_endpoints) as session:
        store = RoutingStore(session, settings.mesh_id)
        if arguments.action == "show":
            stored = await store.read()
            return none_yet if stored is None else describe(stored)
        if arguments.action == "owner":
            stored = await store.read()
            if stored is None and static_cluster:
                return (
                    f"user {arguments.user_id}: {static_cluster} (static routing: every user"
                    " is on the mesh's one shard cluster)"
                )
            document = _current(stored, none_yet)
            owner = document.owner_of(arguments.user_id) or "in transit (owned by none)"
            return f"user {arguments.user_id}: {owner} (epoch {document.epoch})"
        if arguments.action == "init":
            clusters = [c for c in arguments.clusters.split(",") if c]

            def first(stored: StoredRouting | None) -> RoutingDocument:
                if stored is not None:
                    raise OmsctlError(f"a routing document exists (epoch {stored.epoch})")
                return first_document(clusters)

            return describe(await store.change(first))
        if arguments.action == "join":
            stored = await store.change(
                lambda s: with_cluster_joining(_current(s, none_yet), arguments.cluster)
            )
            return describe(stored)
        if arguments.action == "drain":
            stored = await store.change(
                lambda s: with_cluster_draining(_current(s, none_yet), arguments.cluster)
            )
            return describe(stored)
        probe = ShardProbe(
            shard_addresses(settings.shards),
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
            leader_wait_s=LEADER_WAIT_S,
            on_wait=lambda line: print(f"omsctl: {line}", file=sys.stderr, flush=True),
        )
        try:
            if arguments.action == "residents":
                return await residents(
                    store, probe, arguments.clusters, static_cluster, settings.mesh_id
                )
            return await run_wave(arguments, store, probe)
        finally:
            await probe.close()
    raise OmsctlError(f"unknown action {arguments.action}")


def residents_heading(
    stored: StoredRouting | None, clusters: Sequence[str], static_cluster: str, mesh_id: str
) -> tuple[str, list[str]]:
    """The first line of `omsctl residents`, and the clusters to ask: those named, else
    the document's, else the one cluster of a mesh that routes statically."""
    if stored is not None:
        known = [c.cluster_id for c in stored.document.clusters]
        unknown = [cluster for cluster in clusters if cluster not in known]
        if unknown:
            raise OmsctlError(
                f"no cluster {', '.join(unknown)} in epoch {stored.epoch}"
                f" (its clusters: {', '.join(known)})"
            )
        return f"epoch {stored.epoch}", list(clusters) or known
    if static_cluster:
        others = [cluster for cluster in clusters if cluster != static_cluster]
        if others:
            raise OmsctlError(
                f"mesh {mesh_id} has one shard cluster, {static_cluster}: no {', '.join(others)}"
            )
        heading = f"static routing (no routing document): every user is on {static_cluster}"
        return heading, [static_cluster]
    if not clusters:
        raise OmsctlError(
            f"{no_document(mesh_id)}. To ask a cluster's shard anyway, name it:"
            " `omsctl residents s1`"
        )
    return "no routing document", list(clusters)


def residents_line(cluster_id: str, users: Sequence[int], leaving: int, epoch: int) -> str:
    """One cluster's line: how many residents, leaving, its epoch, the first few ids."""
    line = f"  {cluster_id:<12} {len(users)} resident, {leaving} leaving, at epoch {epoch}"
    if not users:
        return line
    shown = ", ".join(map(str, users[:RESIDENTS_SHOWN]))
    more = f", ... ({len(users) - RESIDENTS_SHOWN} more)" if len(users) > RESIDENTS_SHOWN else ""
    return f"{line}: {shown}{more}"


async def residents(
    store: RoutingStore,
    probe: ShardProbe,
    clusters: Sequence[str],
    static_cluster: str = "",
    mesh_id: str = "",
) -> str:
    """Each cluster's residents: those named, else the document's, else (a mesh of one
    shard cluster, routed statically: no document) its one cluster's."""
    heading, named = residents_heading(await store.read(), clusters, static_cluster, mesh_id)
    lines = [heading]
    for cluster_id in named:
        users = await probe.residents(cluster_id)
        epoch, leaving = await probe.routing_state(cluster_id)
        lines.append(residents_line(cluster_id, users, leaving, epoch))
    return "\n".join(lines)


async def run_wave(arguments: argparse.Namespace, store: RoutingStore, probe: ShardProbe) -> str:
    def report(progress: WaveProgress) -> None:
        print(progress.line(), flush=True)

    waves = WaveSettings(wave_size=arguments.wave_size, quiesce_s=arguments.quiesce_s)
    controller = WaveController(store, probe, waves, report)
    action = arguments.action
    if action == "activate":
        progress = await controller.activate(arguments.cluster)
    elif action == "remove":
        progress = await controller.remove(arguments.cluster)
    elif action == "pin":
        progress = await controller.move(arguments.user_id, arguments.cluster, pin=True)
    elif action == "unpin":
        progress = await controller.move(arguments.user_id, None, pin=False)
    elif action == "tier":
        whale = arguments.tier == "whale"
        if whale and not arguments.cluster:
            raise OmsctlError("a whale is pinned to a cluster: --cluster CLUSTER")
        cluster = arguments.cluster if whale else None
        progress = await controller.move(arguments.user_id, cluster, pin=whale)
    elif action == "resume":
        progress = await controller.resume()
    else:
        raise OmsctlError(f"unknown action {action}")
    summary = (
        f"{progress.operation}: done in {progress.seconds:.2f} s at epoch {progress.epoch}, "
        f"{progress.moved} resident user(s) moved in {progress.waves} wave(s)"
    )
    if progress.returned:
        summary += f"; returned (not flat in time): {_ids(progress.returned)}"
    if progress.held:
        summary += f"; held on their old cluster: {_ids(progress.held)}"
    return summary + "\n" + describe(await store.read())


def _ids(users: Sequence[int]) -> str:
    return ", ".join(map(str, users[:RESIDENTS_SHOWN])) + (
        " ..." if len(users) > RESIDENTS_SHOWN else ""
    )


def shard_addresses(text: str) -> dict[str, str]:
    addresses: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        cluster_id, separator, address = part.partition("=")
        if not separator or not cluster_id or not address:
            raise OmsctlError(f"shards: expected id=host:port, got {part!r}")
        addresses[cluster_id] = address
    return addresses


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="omsctl", description=__doc__.split("\n\n")[0])
    top.add_argument("--etcd", default=None, help="host:port,... (env OMS_ETCD_ENDPOINTS)")
    top.add_argument("--mesh", default=None, help="the mesh id (env OMS_MESH_ID)")
    top.add_argument("--shards", default=None, help="s1=host:port,... (env OMS_SHARDS)")
    top.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="a local mesh's folder: etcd, mesh id and TLS when not given otherwise",
    )
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
    shown = actions.add_parser("residents", help="each cluster's resident users")
    shown.add_argument("clusters", nargs="*")
    waves = [
        actions.add_parser("activate", help="scale out: the cluster owns users by hash"),
        actions.add_parser("remove", help="scale in: move the cluster's users off, remove it"),
        actions.add_parser("pin", help="pin a whale to a cluster"),
        actions.add_parser("unpin", help="unpin a whale"),
        actions.add_parser("tier", help="change a user's tier (whale: pinned)"),
        actions.add_parser("resume", help="settle transits, finish a cut-over under way"),
    ]
    waves[0].add_argument("cluster")
    waves[1].add_argument("cluster")
    waves[2].add_argument("user_id", type=int)
    waves[2].add_argument("cluster")
    waves[3].add_argument("user_id", type=int)
    waves[4].add_argument("user_id", type=int)
    waves[4].add_argument("tier", choices=("whale", "normal"))
    waves[4].add_argument("--cluster", default=None)
    upgrade = actions.add_parser(
        "upgrade", help="state-machine versions of the replicated groups (as `oms upgrade`)"
    )
    upgrade_verbs = upgrade.add_subparsers(dest="upgrade_verb", required=True)
    upgrade_status = upgrade_verbs.add_parser("status", help="each group's version and builds")
    upgrade_status.add_argument("--json", action="store_true")
    upgrade_activate = upgrade_verbs.add_parser("activate", help="switch GROUP to VERSION")
    upgrade_activate.add_argument("group", help="shard/<cluster> or matcher/<group>")
    upgrade_activate.add_argument("version", type=int)
    upgrade_activate.add_argument("--replicas", type=int, default=None)
    for wave in waves:
        wave.add_argument("--wave-size", type=int, default=64, help="users in transit at once")
        wave.add_argument(
            "--quiesce-s",
            type=float,
            default=10.0,
            help="how long a user may take to go flat; past it, it stays where it was",
        )
    list_settings(top, OmsctlSettings, shared=(TRANSPORT,))
    return top


def upgrade(arguments: argparse.Namespace) -> int:
    """`omsctl upgrade ...` is `oms upgrade ...` (`services/mesh/upgrade_command.py`), the
    mesh found in etcd when one is named (here or by OMS_ETCD_ENDPOINTS), else locally."""
    etcd = arguments.etcd
    if etcd is None and os.environ.get("OMS_ETCD_ENDPOINTS"):
        etcd = ""
    shared = argparse.Namespace(
        state_dir=arguments.state_dir, etcd=etcd, mesh_id=arguments.mesh, gateway=[]
    )
    if arguments.upgrade_verb == "status":
        shared.json = arguments.json
        return upgrade_command.run_status(shared)
    shared.group, shared.version = arguments.group, arguments.version
    shared.replicas = arguments.replicas
    return upgrade_command.run_activate(shared)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if arguments.action == "upgrade":
        return upgrade(arguments)
    etcd_endpoints = tuple(arguments.etcd.split(",")) if arguments.etcd else None
    mesh_id = arguments.mesh
    shards = arguments.shards
    local = None
    if not etcd_endpoints and not os.environ.get("OMS_ETCD_ENDPOINTS"):
        local = LocalMesh.find(state_dir_of(arguments.state_dir))
        if local is not None:
            local.adopt()
            etcd_endpoints = local.etcd_endpoints or None
            if not mesh_id and not os.environ.get("OMS_MESH_ID"):
                mesh_id = local.record.mesh_id or None
            if not shards and not os.environ.get("OMS_SHARDS") and not local.record.replicated:
                # One replica per shard: no leader key in etcd to find it by.
                shards = ",".join(f"{c.cluster_id}={c.shard}" for c in local.record.clusters())
    settings = load_settings(
        OmsctlSettings,
        overrides={"etcd_endpoints": etcd_endpoints, "mesh_id": mesh_id, "shards": shards},
    )
    static_cluster = ""
    if local is not None and not local.record.sharded and local.record.mesh_id == settings.mesh_id:
        static_cluster = local.record.shard_id  # its gateway routes every user there
    try:
        print(asyncio.run(run(arguments, settings, static_cluster)))
    except (
        OmsctlError,
        RoutingDocumentError,
        RoutingConflictError,
        CoordinationUnavailable,
        ShardUnreachableError,
        WaveBlockedError,
        WaveStalledError,
    ) as error:
        print(f"omsctl: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
