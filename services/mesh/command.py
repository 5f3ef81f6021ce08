"""`oms up`: embedded infrastructure, then every service, supervised; Ctrl-C stops all.

Servers that were already running (a previous `oms infra up`, or external
addresses from the environment) are left running on exit; the ones this
command started are stopped with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from services.coordination.addresses import FROM_ETCD
from services.coordination.errors import CoordinationError
from services.coordination.etcd_access import grant_mesh_access
from services.coordination.etcd_channel import credentials_of
from services.coordination.etcd_endpoints import EndpointError
from services.coordination.etcd_session import EtcdSession
from services.infra.command import format_status
from services.infra.errors import InfraError
from services.infra.local_infra import InfraEndpoints, LocalInfra, ServerState
from services.infra.settings import InfraSettings
from services.markets.catalog import load_catalog
from services.mesh.mesh_record import (
    ClusterRecord,
    MeshRecord,
    MeshRecordError,
    prepare_mesh_record,
    reuse_or_new_address,
    write_mesh_record,
)
from services.mesh.prometheus_targets import write_scrape_targets
from services.mesh.readiness import report_readiness
from services.mesh.supervisor import ChildSpec, MeshFailedError, Supervisor
from services.routing.core.routing_changes import first_document
from services.routing.core.routing_document import RoutingDocumentError
from services.routing.routing_store import RoutingStore
from services.settings import load_settings
from services.transport.development import OPERATOR, DevelopmentTls, adopt_mesh_transports


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "up", help="run the whole mesh locally on embedded defaults (Ctrl-C stops it)"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="default: ./state")
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="user-shard clusters s1..sN, each with its own persister, bridge and reconciler"
        " (more than 1: the gateway routes by the routing document in etcd)",
    )
    parser.add_argument(
        "--active",
        type=int,
        default=None,
        help="with --shards: how many clusters the first routing document makes active "
        "(s1..sK); the others run, joined as receiving, for a scale-out (omsctl activate)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="replicas of the shard and of each matcher group (1: file logs, the light"
        " default; 3: logs in etcd, a leader elected per group, failover)",
    )
    parser.add_argument(
        "--colocate",
        action="store_true",
        help="each shard cluster in one process: the shard with its persister, bridge and"
        " reconciler, their links to it in-process (`oms shard --colocate`); without it,"
        " each is a process of its own",
    )
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="no TLS (by default every link is TLS: mutual inside the mesh, the gateway's"
        " public port checked by the development authority under state_dir/tls)",
    )
    parser.set_defaults(handler=run_up)


def mesh_children(
    endpoints: InfraEndpoints,
    state_dir: Path,
    record: MeshRecord,
    *,
    tls: DevelopmentTls | None = None,
) -> list[ChildSpec]:
    """The services of the mesh, in start order; each is an `oms <service>` process.

    Every address comes from the mesh record; clients of a service that is not up
    yet retry with backoff, so start order is a courtesy, not a requirement. With
    replicas, the shard and each matcher group run that many replicas whose log is
    in etcd, and every other service finds each group's leader in etcd.

    With `tls`, each service gets its own certificate from the development authority
    (and the gateway its public one too); without, `OMS_TLS=off`.
    """
    replicated = record.replicated
    clusters = record.clusters()

    def shard_setting(cluster: ClusterRecord) -> str:
        return FROM_ETCD if replicated else cluster.shard

    environment = {
        "OMS_ETCD_ENDPOINTS": ",".join(endpoints.etcd_endpoints),
        "OMS_DATABASE_URL": endpoints.database_url,
        "OMS_MESH_ID": record.mesh_id,
        "OMS_SHARD_ID": record.shard_id,
        "OMS_SHARD_ADDRESS": shard_setting(clusters[0]),
        # Co-located and replicated, the active persister is beside the shard's leader:
        # the gateway finds it by its lease in etcd.
        "OMS_PERSISTER_ADDRESS": FROM_ETCD if replicated and record.colocated else record.persister,
        "OMS_MATCHERS": ",".join(f"{group}={FROM_ETCD}" for group in record.matchers)
        if replicated
        else record.matcher_setting(),
        "OMS_ADMIN_API_KEY": record.admin_api_key,
        "OMS_ADMIN_API_SECRET": record.admin_api_secret,
        "OMS_PERSISTER_MASTER_KEY": record.master_key,
    }
    if replicated:
        # Leader-only by their own leases (the persister's term is its fencing token
        # in PostgreSQL): a second instance started with the same settings waits as
        # a hot standby.
        environment["OMS_BRIDGE_LEADER_LEASE"] = "1"
        environment["OMS_RECONCILER_LEADER_LEASE"] = "1"
        environment["OMS_PERSISTER_LEADER_LEASE"] = "1"
    gateway: dict[str, str] = {}
    if record.sharded:
        gateway = {
            "OMS_GATEWAY_ROUTING": "etcd",
            "OMS_SHARDS": ",".join(f"{c.cluster_id}={shard_setting(c)}" for c in clusters),
            "OMS_PERSISTERS": ",".join(
                f"{c.cluster_id}={FROM_ETCD if replicated and record.colocated else c.persister}"
                for c in clusters
            ),
        }
    services: list[tuple[str, list[str], dict[str, str]]] = []
    for group in record.matchers:
        for index, address in enumerate(record.matcher_replicas(group)):
            name = f"matcher-{group}" + (f"-r{index + 1}" if replicated else "")
            argv = ["matcher", "--group", group, "--listen", address]
            argv += ["--data-dir", str(state_dir / name)]
            extra = {"OMS_MATCHER_LOG": "etcd", "OMS_MATCHER_ADVERTISE": address}
            services.append((name, argv, extra if replicated else {}))
    for cluster in clusters:
        # One cluster keeps the names of a one-shard mesh; more are named by cluster.
        suffix = f"-{cluster.cluster_id}" if record.sharded else ""
        own = {"OMS_SHARD_ID": cluster.cluster_id}
        if record.colocated:
            services += _colocated_cluster(
                state_dir, cluster, shard_setting(cluster), own, replicated=replicated
            )
            continue
        for index, address in enumerate(cluster.shard_replicas()):
            name = f"shard-{cluster.cluster_id}" + (f"-r{index + 1}" if replicated else "")
            argv = ["shard", "--shard-id", cluster.cluster_id, "--listen", address]
            argv += ["--data-dir", str(state_dir / name)]
            extra = {"OMS_SHARD_LOG": "etcd", "OMS_SHARD_ADVERTISE": address}
            services.append((name, argv, {**own, **(extra if replicated else {})}))
        shard_address = shard_setting(cluster)
        services += [
            (
                f"persister{suffix}",
                ["persister", "--listen", cluster.persister, "--shard-address", shard_address],
                own,
            ),
            (
                f"bridge{suffix}",
                ["bridge", "--listen", cluster.bridge, "--shard-address", shard_address],
                own,
            ),
            (
                f"reconciler{suffix}",
                ["reconciler", "--listen", cluster.reconciler, "--shard-address", shard_address],
                own,
            ),
        ]
    services.append(("gateway", ["gateway", "--listen", record.gateway], gateway))
    if record.market_data:
        market_data = {
            "OMS_MARKETDATA_PERSISTER": FROM_ETCD
            if replicated and record.colocated
            else clusters[0].persister,
            "OMS_MARKETDATA_PERSISTER_SHARD": clusters[0].cluster_id,
        }
        services.append(("marketdata", ["marketdata", "--listen", record.market_data], market_data))
    metrics = {name: reuse_or_new_address(record.metrics.get(name)) for name, _, _ in services}
    for name, argv, _ in services:
        listen = argv[argv.index("--listen") + 1]
        print(f"[mesh] {name:<15} will listen on {listen}, metrics on {metrics[name]}", flush=True)

    def transport(name: str) -> dict[str, str]:
        if tls is None:
            return {"OMS_TLS": "off"}
        own = tls.service_environment(name)
        public = name in ("gateway", "marketdata")  # the public port's certificate
        return {**own, **tls.gateway_environment()} if public else own

    return [
        ChildSpec(
            name,
            [sys.executable, "-m", "services.command_line", *argv],
            {**environment, **extra, **transport(name), "OMS_METRICS_LISTEN": metrics[name]},
            address=argv[argv.index("--listen") + 1],
        )
        for name, argv, extra in services
    ]


def _colocated_cluster(
    state_dir: Path,
    cluster: ClusterRecord,
    shard_address: str,
    own: dict[str, str],
    *,
    replicated: bool,
) -> list[tuple[str, list[str], dict[str, str]]]:
    """A process per shard replica: the replica with a persister, a bridge and a
    reconciler, each on the port the record gives it (`oms shard --colocate`). With
    replicas, each role holds its own lease and campaigns once its replica leads."""
    processes = []
    for index, address in enumerate(cluster.shard_replicas()):
        name = f"shard-{cluster.cluster_id}" + (f"-r{index + 1}" if replicated else "")
        argv = ["shard", "--colocate", "--shard-id", cluster.cluster_id, "--listen", address]
        argv += ["--data-dir", str(state_dir / name)]
        persister, bridge, reconciler = cluster.roles_of_replica(index)
        roles = {
            "OMS_SHARD_ADDRESS": shard_address,
            "OMS_PERSISTER_LISTEN": persister,
            "OMS_BRIDGE_LISTEN": bridge,
            "OMS_RECONCILER_LISTEN": reconciler,
        }
        if replicated:
            roles |= {"OMS_SHARD_LOG": "etcd", "OMS_SHARD_ADVERTISE": address}
        processes.append((name, argv, {**own, **roles}))
    return processes


def run_up(arguments: argparse.Namespace) -> int:
    settings = load_settings(InfraSettings, overrides={"state_dir": arguments.state_dir})
    tls = None if arguments.plaintext else DevelopmentTls.under(settings.state_dir.resolve())
    # With TLS, the embedded etcd's client port is mutual TLS too, its auth on.
    infra = LocalInfra.from_settings(
        settings, etcd_tls=tls.etcd_server_tls() if tls is not None else None
    )
    already_running = {
        status.name
        for status in infra.status()
        if status.state in (ServerState.RUNNING, ServerState.EXTERNAL)
    }
    try:
        endpoints = infra.up()
    except InfraError as error:
        print(f"oms up: {error}", file=sys.stderr)
        return 1
    for status in infra.status():
        print(format_status(status), flush=True)
    started_here = {status.name for status in infra.status()} - already_running
    # This process checks the services' readiness, and writes the first routing
    # document, over the mesh's own transport (with TLS, as the local tools' identity).
    adopt_mesh_transports(infra.state_dir, tls=tls is not None)
    try:
        record = prepare_mesh_record(
            infra.state_dir,
            load_catalog().groups(),
            replicas=arguments.replicas,
            shards=arguments.shards,
            colocated=arguments.colocate,
        )
        children = mesh_children(endpoints, infra.state_dir, record, tls=tls)
        if tls is not None and not infra.external_etcd:
            print(asyncio.run(etcd_access(endpoints, record, children, tls)), flush=True)
        if record.sharded:
            active = arguments.shards if arguments.active is None else arguments.active
            if not 1 <= active <= arguments.shards:
                raise MeshRecordError(f"--active {active}: from 1 to --shards {arguments.shards}")
            print(asyncio.run(first_routing(endpoints, record, active)), flush=True)
    except (MeshRecordError, CoordinationError, EndpointError, RoutingDocumentError) as error:
        print(f"oms up: {error}", file=sys.stderr)
        if started_here:
            infra.down()
        return 1
    # Where each child serves its metrics, for Prometheus, `oms bench` and tests to find;
    # whether the mesh speaks TLS, for the tools reading the record.
    record = replace(
        record,
        metrics={child.name: child.environment["OMS_METRICS_LISTEN"] for child in children},
        tls=tls is not None,
    )
    write_mesh_record(infra.state_dir, record)
    targets = write_scrape_targets(infra.state_dir, record)
    print(f"[mesh] Prometheus targets (file_sd_configs): {targets}", flush=True)
    print(f"[mesh] gateway {record.gateway}", flush=True)
    print(f"[mesh] market data {record.market_data}", flush=True)
    if tls is not None:
        for who, variables in (
            ("`oms client`", tls.client_environment()),
            ("`omsctl`", tls.operator_environment()),
        ):
            line = " ".join(f"{key}={value}" for key, value in variables.items())
            print(f"[mesh] TLS on; {who} from a shell: export {line}", flush=True)
    try:
        asyncio.run(_supervise(children))
    except MeshFailedError as error:
        print(f"[mesh] {error}", file=sys.stderr)
        return 1
    finally:
        if started_here:
            for status in infra.down():
                print(format_status(status), flush=True)
    print("[mesh] stopped", flush=True)
    return 0


async def etcd_access(
    endpoints: InfraEndpoints,
    record: MeshRecord,
    children: Sequence[ChildSpec],
    tls: DevelopmentTls,
) -> str:
    """As etcd's root: each service (by its certificate's name) and the local tools
    (`operator`) get the mesh's role over its own keys; auth on (`etcd_access`)."""
    root = credentials_of(tls.authority().certificate_pem, tls.etcd_root_identity())
    users = [child.name for child in children] + [OPERATOR]
    async with EtcdSession(endpoints.etcd_endpoints, credentials=root) as session:
        report = await grant_mesh_access(session, record.mesh_id, users)
    added = f"{len(report.users_added)} users added" if report.users_added else "users kept"
    return f"[mesh] etcd: TLS, auth on; role {report.role} over the mesh's keys, {added}"


async def first_routing(endpoints: InfraEndpoints, record: MeshRecord, active: int) -> str:
    """The mesh's routing document: written as epoch 1 (the first `active` clusters
    active, the others receiving) the first time, kept as it is afterwards (waves may
    have changed it since)."""
    async with EtcdSession(endpoints.etcd_endpoints) as session:
        store = RoutingStore(session, record.mesh_id)
        stored = await store.read()
        origin = "from etcd"
        if stored is None:
            ids = [cluster.cluster_id for cluster in record.clusters()]
            first = first_document(ids[:active], receiving=ids[active:])
            stored, origin = await store.swap(None, first), "written"
        clusters = ", ".join(f"{c.cluster_id} ({c.state.value})" for c in stored.document.clusters)
        return f"[mesh] routing: epoch {stored.epoch} {origin}, clusters {clusters}"


async def _supervise(children: list[ChildSpec]) -> None:
    supervisor = Supervisor(children)
    readiness = asyncio.create_task(
        report_readiness({child.name: child.address for child in children if child.address})
    )

    def stop() -> None:
        readiness.cancel()  # services going down on purpose are not news
        supervisor.stop()

    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop)
    # Only now does Ctrl-C mean "stop cleanly", so only now is it announced.
    print("[mesh] running; press Ctrl-C to stop", flush=True)
    try:
        await supervisor.run()
    finally:
        readiness.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await readiness
