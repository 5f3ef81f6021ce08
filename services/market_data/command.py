"""`oms marketdata`: the market-data service (books, trades, tickers, candles, instruments)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvloop

from services.clients.matcher_directory import MatcherDirectoryError
from services.manual.settings_help import SERVICE_SHARED, list_settings
from services.market_data.service import MarketDataService
from services.market_data.settings import MarketDataSettings
from services.markets.catalog import MarketCatalogError, load_catalog
from services.observability.logs import configure_logging
from services.observability.tracing import configure_tracing
from services.runtime.collector import settle_long_lived_state
from services.serving.service_host import ServiceHost
from services.settings import load_settings
from services.transport.tls import PublicListener, TransportSettings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "marketdata",
        help="run the market-data service (order books, trades, tickers, candles)",
        description="Follows every matcher group's feed (OMS_MATCHERS) once and serves"
        " oms.v1.MarketData to any number of clients, on the public port's TLS.",
    )
    parser.add_argument("--listen", default=None, help="host:port (env OMS_MARKETDATA_LISTEN)")
    parser.add_argument("--matchers", default=None, help="group=host:port,... (env OMS_MATCHERS)")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")
    # Accepted so every service takes the same flags; it keeps no state of its own.
    parser.add_argument("--data-dir", type=Path, default=None, help=argparse.SUPPRESS)
    list_settings(parser, MarketDataSettings, shared=SERVICE_SHARED)
    parser.set_defaults(handler=run)


async def serve(settings: MarketDataSettings) -> None:
    try:
        service = MarketDataService(settings, load_catalog(settings.markets_file))
    except (MatcherDirectoryError, MarketCatalogError, ValueError) as error:
        raise SystemExit(f"oms marketdata: {error}") from error
    public = PublicListener.from_settings(load_settings(TransportSettings))
    host = ServiceHost(settings.listen, listener=public.listen)
    host.install_signal_handlers()
    settle_long_lived_state()
    try:
        await host.run(service.plan())
    finally:
        await service.close()


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        MarketDataSettings,
        overrides={
            "listen": arguments.listen,
            "matchers": arguments.matchers,
            "markets_file": arguments.markets_file,
        },
    )
    configure_logging("marketdata", settings.log_level)
    configure_tracing("oms-marketdata")
    uvloop.run(serve(settings))
    return 0
