"""`oms bridge --shard-address HOST:PORT --listen HOST:PORT`: the matcher client of one shard."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvloop

from bridge.service import BridgeService
from bridge.settings import BridgeSettings
from services.clients.matcher_directory import MatcherDirectory
from services.coordination.writer_tokens import WriterCredential
from services.manual.settings_help import SERVICE_SHARED, list_settings
from services.markets.catalog import load_catalog
from services.observability.logs import configure_logging
from services.observability.tracing import configure_tracing, tracing_enabled
from services.serving.leader_only import LeaderOnly, LeadingReplica
from services.serving.service_host import ServiceHost
from services.settings import load_settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bridge",
        help="run the bridge of one user shard (sagas to the matchers, events back)",
        description="Matcher addresses come from OMS_MATCHERS (g1=host:port,g2=host:port), "
        "the shard id from OMS_SHARD_ID (default s1).",
    )
    parser.add_argument("--shard-address", default=None, dest="shard_address")
    parser.add_argument("--listen", default=None, help="host:port (env OMS_BRIDGE_LISTEN)")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")
    # Accepted so every service takes the same flags; the bridge keeps no state of its own
    # (its positions live in the shard), so the folder is not used.
    parser.add_argument("--data-dir", type=Path, default=None, help=argparse.SUPPRESS)
    list_settings(parser, BridgeSettings, shared=SERVICE_SHARED)
    parser.set_defaults(handler=run)


async def serve(
    settings: BridgeSettings, *, traced: bool, beside: LeadingReplica | None = None
) -> None:
    """`beside`: the shard replica this bridge shares a process with (it campaigns only
    once that leads)."""
    directory = MatcherDirectory.parse(settings.matchers, load_catalog(settings.markets_file))
    credential = WriterCredential()
    service = BridgeService(settings, directory, traced=traced, credential=credential)
    host = ServiceHost(settings.listen)
    host.install_signal_handlers()
    plan = service.plan()
    if settings.leader_lease:
        role = LeaderOnly(
            settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
            role="bridge",
            shard_id=settings.shard_id,
            holder=settings.listen,
            credential=credential,
            beside=beside,
        )
        plan = role.wrap(plan)
    await host.run(plan)


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        BridgeSettings,
        overrides={
            "shard_address": arguments.shard_address,
            "listen": arguments.listen,
            "markets_file": arguments.markets_file,
        },
    )
    configure_logging(f"bridge-{settings.shard_id}", settings.log_level)
    configure_tracing("oms-bridge")
    uvloop.run(serve(settings, traced=tracing_enabled()))
    return 0
