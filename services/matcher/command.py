"""`oms matcher --group NAME`: run one matcher group as a service."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvloop

from services.coordination.writer_tokens import WriterFences
from services.manual.settings_help import SERVICE_SHARED, list_settings
from services.markets.catalog import load_catalog
from services.matcher.core.machine import MatcherEgress, MatcherMachine
from services.matcher.core.settings import EngineSettings, SymbolSettings
from services.matcher.service import MatcherServicer
from services.matcher.settings import MatcherServiceSettings
from services.observability.logs import configure_logging
from services.observability.tracing import configure_tracing
from services.runtime.egress_feed import DurableEgressFeed
from services.runtime.hosting import RuntimeHost
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.replicated_host import host_for
from services.runtime.sequencer import SequencerSettings
from services.settings import SettingsError, load_settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "matcher", help="run one matcher group (price-time books for its symbols)"
    )
    parser.add_argument("--group", default=None, help="matcher group (env OMS_MATCHER_GROUP)")
    parser.add_argument("--listen", default=None, help="host:port (env OMS_MATCHER_LISTEN)")
    parser.add_argument("--data-dir", type=Path, default=None, dest="data_dir")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")
    list_settings(parser, MatcherServiceSettings, shared=SERVICE_SHARED)
    parser.set_defaults(handler=run)


def engine_settings(settings: MatcherServiceSettings) -> EngineSettings:
    markets = load_catalog(settings.markets_file).group(settings.group)
    if not markets:
        raise SystemExit(f"oms matcher: no markets belong to group {settings.group!r}")
    return EngineSettings(
        symbols=tuple(
            SymbolSettings(
                symbol=market.symbol,
                base_asset=market.base_asset,
                quote_asset=market.quote_asset,
                lot_size=market.lot_size,
                tick_size=market.tick_size,
                min_notional=market.min_notional,
                price_band_bps=market.price_band_bps,
                reference_price_ticks=market.reference_price_ticks,
                maker_fee_ppm=market.maker_fee_ppm,
                taker_fee_ppm=market.taker_fee_ppm,
            )
            for market in markets
        ),
        dedup_horizon_ms=settings.dedup_horizon_ms,
        retained_events_per_shard=settings.retained_events_per_shard,
        retained_market_data_per_symbol=settings.retained_market_data_per_symbol,
    )


def build_host(settings: MatcherServiceSettings) -> RuntimeHost[MatcherEgress]:
    node: RuntimeNode[MatcherEgress] = RuntimeNode(
        MatcherMachine(engine_settings(settings)),
        NodeSettings(
            data_dir=settings.data_dir,
            snapshot_interval_entries=settings.snapshot_interval_entries,
            checkpoint_interval_entries=settings.checkpoint_interval_entries,
            sequencer=SequencerSettings(
                timer_interval_ms=settings.timer_interval_ms,
                idle_timer_interval_ms=settings.idle_timer_interval_ms,
            ),
        ),
    )
    try:
        return host_for(
            node,
            DurableEgressFeed(10_000),
            listen_address=settings.listen,
            log_backend=settings.log_backend,
            kind="matcher",
            name=settings.group,
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
            advertise=settings.advertise,
            lease_ttl_s=settings.lease_ttl_s,
            compact_interval_s=settings.etcd_compact_interval_s,
        )
    except ValueError as error:
        raise SettingsError(f"OMS_MATCHER_LOG: {error}") from error


async def serve(settings: MatcherServiceSettings) -> None:
    host = build_host(settings)
    host.install_signal_handlers()
    fences = WriterFences(settings.etcd_endpoints, settings.mesh_id)
    try:
        await host.run(
            lambda h: MatcherServicer(
                h, settings.max_inflight_batches, fences, settings.version_at_start
            ).plan()
        )
    finally:
        await fences.close()


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        MatcherServiceSettings,
        overrides={
            "group": arguments.group,
            "listen": arguments.listen,
            "data_dir": arguments.data_dir,
            "markets_file": arguments.markets_file,
        },
    )
    configure_logging(f"matcher-{settings.group}", settings.log_level)
    configure_tracing("oms-matcher")
    uvloop.run(serve(settings))
    return 0
