"""`oms up`: embedded infrastructure, then every service, supervised; Ctrl-C stops all.

Servers that were already running (a previous `oms infra up`, or external
addresses from the environment) are left running on exit; the ones this
command started are stopped with it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from services.infra.command import format_status
from services.infra.errors import InfraError
from services.infra.local_infra import InfraEndpoints, LocalInfra, ServerState
from services.infra.ports import free_port
from services.infra.settings import InfraSettings
from services.markets.catalog import load_catalog
from services.mesh.supervisor import ChildSpec, MeshFailedError, Supervisor
from services.settings import load_settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "up", help="run the whole mesh locally on embedded defaults (Ctrl-C stops it)"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="default: ./state")
    parser.set_defaults(handler=run_up)


def mesh_children(endpoints: InfraEndpoints, state_dir: Path) -> list[ChildSpec]:
    """The services of the mesh, in start order; each is an `oms <service>` process."""
    environment = {
        "OMS_ETCD_ENDPOINTS": ",".join(endpoints.etcd_endpoints),
        "OMS_DATABASE_URL": endpoints.database_url,
    }
    services: list[tuple[str, list[str]]] = []
    for group in load_catalog().groups():
        port = free_port()
        print(f"matcher-{group:<3} will listen on 127.0.0.1:{port}", flush=True)
        services.append(
            (
                f"matcher-{group}",
                [
                    "matcher",
                    "--group",
                    group,
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--data-dir",
                    str(state_dir / f"matcher-{group}"),
                ],
            )
        )
    return [
        ChildSpec(name, [sys.executable, "-m", "services.command_line", *argv], environment)
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
    children = mesh_children(endpoints, infra.state_dir)
    if not children:
        print("[mesh] infrastructure is up; no services are configured yet", flush=True)
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
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, supervisor.stop)
    # Only now does Ctrl-C mean "stop cleanly", so only now is it announced.
    print("[mesh] running; press Ctrl-C to stop", flush=True)
    await supervisor.run()
