"""`oms gateway --listen HOST:PORT`: the public and admin API of the OMS."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvloop

from gateway.service import Gateway
from gateway.settings import GatewaySettings
from services.clients.matcher_directory import MatcherDirectoryError
from services.manual.settings_help import SERVICE_SHARED, list_settings
from services.markets.catalog import MarketCatalogError
from services.observability.logs import configure_logging
from services.observability.tracing import configure_tracing
from services.runtime.collector import settle_long_lived_state
from services.serving.service_host import ServiceHost
from services.settings import SettingsError, load_settings
from services.transport.tls import PublicListener, TransportSettings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gateway", help="run the gateway (public order API and admin API over gRPC)"
    )
    parser.add_argument("--listen", default=None, help="host:port (env OMS_GATEWAY_LISTEN)")
    parser.add_argument(
        "--shard-address", default=None, dest="shard_address", help="env OMS_SHARD_ADDRESS"
    )
    parser.add_argument(
        "--persister-address",
        default=None,
        dest="persister_address",
        help="env OMS_PERSISTER_ADDRESS",
    )
    parser.add_argument("--matchers", default=None, help="group=host:port,... (env OMS_MATCHERS)")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")
    # Accepted so every service takes the same flags (as the bridge does); the gateway keeps
    # no state of its own, so the folder is not used.
    parser.add_argument("--data-dir", type=Path, default=None, help=argparse.SUPPRESS)
    list_settings(parser, GatewaySettings, shared=SERVICE_SHARED)
    parser.set_defaults(handler=run)


async def serve(settings: GatewaySettings) -> None:
    try:
        gateway = Gateway(settings)
    except (MatcherDirectoryError, MarketCatalogError, SettingsError) as error:
        raise SystemExit(f"oms gateway: {error}") from error
    # Clients reach the public port with the gateway's public certificate; the
    # gateway's own channels into the mesh use the mesh's mutual TLS.
    public = PublicListener.from_settings(load_settings(TransportSettings))
    host = ServiceHost(settings.listen, listener=public.listen)
    host.install_signal_handlers()
    # Every call allocates tasks, futures and messages: with the default thresholds the
    # cyclic collector ran every few calls and took about 4% of the gateway's CPU at the
    # unary maximum (perf). What the gateway holds from its start is frozen.
    settle_long_lived_state()
    try:
        await host.run(gateway.plan())
    finally:
        await gateway.close()


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        GatewaySettings,
        overrides={
            "listen": arguments.listen,
            "shard_address": arguments.shard_address,
            "persister_address": arguments.persister_address,
            "matchers": arguments.matchers,
            "markets_file": arguments.markets_file,
        },
    )
    configure_logging("gateway", settings.log_level)
    configure_tracing("oms-gateway")
    uvloop.run(serve(settings))
    return 0
