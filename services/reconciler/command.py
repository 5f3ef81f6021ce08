"""`oms reconciler --shard-address HOST:PORT --listen HOST:PORT`: drift sweeps of one shard."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvloop

from services.clients.matcher_directory import MatcherDirectory
from services.coordination.writer_tokens import WriterCredential
from services.manual.settings_help import (
    CHANNELZ,
    HEALTH_PROBE,
    METRICS,
    TRANSPORT,
    list_settings,
)
from services.markets.catalog import load_catalog
from services.observability.logs import configure_logging
from services.reconciler.service import ReconcilerService
from services.reconciler.settings import ReconcilerSettings
from services.serving.leader_only import LeaderOnly, LeadingReplica
from services.serving.service_host import ServiceHost
from services.settings import load_settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconciler",
        help="run the reconciler of one user shard (matcher open orders vs the shard's index)",
        description="Matcher addresses come from OMS_MATCHERS (g1=host:port,g2=host:port), "
        "the shard id from OMS_SHARD_ID (default s1).",
    )
    parser.add_argument("--shard-address", default=None, dest="shard_address")
    parser.add_argument("--listen", default=None, help="host:port (env OMS_RECONCILER_LISTEN)")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")
    # Accepted so every service takes the same flags; the reconciler keeps no state.
    parser.add_argument("--data-dir", type=Path, default=None, help=argparse.SUPPRESS)
    # No tracing: the reconciler's calls belong to no order.
    list_settings(parser, ReconcilerSettings, shared=(TRANSPORT, METRICS, HEALTH_PROBE, CHANNELZ))
    parser.set_defaults(handler=run)


async def serve(settings: ReconcilerSettings, *, beside: LeadingReplica | None = None) -> None:
    """`beside`: the shard replica this reconciler shares a process with (it campaigns
    only once that leads)."""
    directory = MatcherDirectory.parse(settings.matchers, load_catalog(settings.markets_file))
    credential = WriterCredential()
    service = ReconcilerService(settings, directory, credential=credential)
    host = ServiceHost(settings.listen)
    host.install_signal_handlers()
    plan = service.plan()
    if settings.leader_lease:
        role = LeaderOnly(
            settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
            role="reconciler",
            shard_id=settings.shard_id,
            holder=settings.listen,
            credential=credential,
            beside=beside,
        )
        plan = role.wrap(plan)
    await host.run(plan)


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        ReconcilerSettings,
        overrides={
            "shard_address": arguments.shard_address,
            "listen": arguments.listen,
            "markets_file": arguments.markets_file,
        },
    )
    configure_logging(f"reconciler-{settings.shard_id}", settings.log_level)
    uvloop.run(serve(settings))
    return 0
