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
from pathlib import Path
from typing import Any

from services.infra.command import format_status
from services.infra.errors import InfraError
from services.infra.local_infra import InfraEndpoints, LocalInfra, ServerState
from services.infra.settings import InfraSettings
from services.markets.catalog import load_catalog
from services.mesh.mesh_record import MeshRecord, prepare_mesh_record
from services.mesh.readiness import report_readiness
from services.mesh.supervisor import ChildSpec, MeshFailedError, Supervisor
from services.settings import load_settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "up", help="run the whole mesh locally on embedded defaults (Ctrl-C stops it)"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="default: ./state")
    parser.set_defaults(handler=run_up)


def mesh_children(
    endpoints: InfraEndpoints, state_dir: Path, record: MeshRecord
) -> list[ChildSpec]:
    """The services of the mesh, in start order; each is an `oms <service>` process.

    Every address comes from the mesh record; clients of a service that is not up
    yet retry with backoff, so start order is a courtesy, not a requirement.
    """
    environment = {
        "OMS_ETCD_ENDPOINTS": ",".join(endpoints.etcd_endpoints),
        "OMS_DATABASE_URL": endpoints.database_url,
        "OMS_SHARD_ID": record.shard_id,
        "OMS_SHARD_ADDRESS": record.shard,
        "OMS_PERSISTER_ADDRESS": record.persister,
        "OMS_MATCHERS": record.matcher_setting(),
        "OMS_ADMIN_API_KEY": record.admin_api_key,
        "OMS_ADMIN_API_SECRET": record.admin_api_secret,
    }
    services: list[tuple[str, list[str]]] = [
        (
            f"matcher-{group}",
            [
                "matcher",
                "--group",
                group,
                "--listen",
                address,
                "--data-dir",
                str(state_dir / f"matcher-{group}"),
            ],
        )
        for group, address in record.matchers.items()
    ]
    services += [
        (
            f"shard-{record.shard_id}",
            [
                "shard",
                "--shard-id",
                record.shard_id,
                "--listen",
                record.shard,
                "--data-dir",
                str(state_dir / f"shard-{record.shard_id}"),
            ],
        ),
        ("persister", ["persister", "--listen", record.persister, "--shard-address", record.shard]),
        ("bridge", ["bridge", "--listen", record.bridge, "--shard-address", record.shard]),
        (
            "reconciler",
            ["reconciler", "--listen", record.reconciler, "--shard-address", record.shard],
        ),
        ("gateway", ["gateway", "--listen", record.gateway]),
    ]
    for name, argv in services:
        print(f"[mesh] {name:<11} will listen on {argv[argv.index('--listen') + 1]}", flush=True)
    return [
        ChildSpec(
            name,
            [sys.executable, "-m", "services.command_line", *argv],
            environment,
            address=argv[argv.index("--listen") + 1],
        )
        for name, argv in services
    ]


def run_up(arguments: argparse.Namespace) -> int:
    settings = load_settings(InfraSettings, overrides={"state_dir": arguments.state_dir})
    infra = LocalInfra.from_settings(settings)
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
    record = prepare_mesh_record(infra.state_dir, load_catalog().groups())
    children = mesh_children(endpoints, infra.state_dir, record)
    print(f"[mesh] gateway {record.gateway}; try `oms demo` in another terminal", flush=True)
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
