"""`oms shard --shard-id ID`: run one user shard as a service."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import uvloop

from services.coordination.writer_tokens import WriterFences
from services.manual.settings_help import SERVICE_SHARED, list_settings
from services.markets.catalog import load_catalog
from services.observability.logs import configure_logging
from services.observability.tracing import configure_tracing
from services.runtime.egress_feed import DurableEgressFeed
from services.runtime.hosting import RuntimeHost
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.replicated_host import host_for
from services.runtime.sequencer import SequencerSettings
from services.settings import SettingsError, load_settings
from services.shard.core.settings import ShardSettings, SymbolSettings
from services.shard.core.shard_machine import ShardMachine
from services.shard.service import ShardServicer
from services.shard.settings import ShardServiceSettings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "shard", help="run one user shard (hot user actors on the deterministic runtime)"
    )
    parser.add_argument("--shard-id", default=None, dest="shard_id")
    parser.add_argument("--listen", default=None, help="host:port (env OMS_SHARD_LISTEN)")
    parser.add_argument("--data-dir", type=Path, default=None, dest="data_dir")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")
    parser.add_argument(
        "--colocate",
        action="store_true",
        help="run the shard's persister, bridge and reconciler in this process too, their"
        " links to the shard in-process (each configured by its own OMS_* settings;"
        " services/shard/colocated.py)",
    )
    list_settings(parser, ShardServiceSettings, shared=SERVICE_SHARED)
    parser.set_defaults(handler=run)


def machine_settings(settings: ShardServiceSettings) -> ShardSettings:
    catalog = load_catalog(settings.markets_file)
    return ShardSettings(
        shard_id=settings.shard_id,
        symbols=tuple(
            SymbolSettings(
                symbol=market.symbol,
                base_asset=market.base_asset,
                quote_asset=market.quote_asset,
                lot_size=market.lot_size,
                tick_size=market.tick_size,
                maker_fee_ppm=market.maker_fee_ppm,
                taker_fee_ppm=market.taker_fee_ppm,
                matcher_group=market.matcher_group,
            )
            for market in catalog.markets
        ),
        idle_ttl_ms=settings.idle_ttl_ms,
        max_resident=settings.max_resident,
        max_in_flight_sagas=settings.max_in_flight_sagas,
    )


def build_host(settings: ShardServiceSettings) -> RuntimeHost[Any]:
    machine = ShardMachine(machine_settings(settings))
    node: RuntimeNode[Any] = RuntimeNode(
        machine,
        NodeSettings(
            data_dir=settings.data_dir,
            checkpoint_interval_entries=settings.checkpoint_interval_entries,
            snapshot_interval_entries=settings.snapshot_interval_entries,
            sequencer=SequencerSettings(
                timer_interval_ms=settings.timer_interval_ms,
                idle_timer_interval_ms=settings.idle_timer_interval_ms,
            ),
        ),
        # The persister resumes after its cursor: egress after it must be replayable.
        egress_floor=lambda: machine.egress_floor,
    )
    feed: DurableEgressFeed[Any] = DurableEgressFeed(
        settings.retained_egress_records, retained_items=settings.retained_egress_items
    )
    try:
        return host_for(
            node,
            feed,
            listen_address=settings.listen,
            log_backend=settings.log_backend,
            kind="shard",
            name=settings.shard_id,
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
            advertise=settings.advertise,
            lease_ttl_s=settings.lease_ttl_s,
            compact_interval_s=settings.etcd_compact_interval_s,
        )
    except ValueError as error:
        raise SettingsError(f"OMS_SHARD_LOG: {error}") from error


async def serve(settings: ShardServiceSettings, host: RuntimeHost[Any] | None = None) -> None:
    """Run the shard until stopped; on `host` when given (a co-located cluster made it
    to serve its own roles in-process)."""
    host = host or build_host(settings)
    host.install_signal_handlers()

    fences = WriterFences(settings.etcd_endpoints, settings.mesh_id)

    def plan(h: RuntimeHost[Any]) -> Any:
        return ShardServicer(
            h,
            shard_id=settings.shard_id,
            max_inflight_batches=settings.max_inflight_batches,
            mark_interval_ms=settings.mark_interval_ms,
            saturation_dwell_ms=settings.saturation_dwell_ms,
            fences=fences,
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
            version_at_start=settings.version_at_start,
        ).plan()

    try:
        await host.run(plan)
    finally:
        await fences.close()


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        ShardServiceSettings,
        overrides={
            "shard_id": arguments.shard_id,
            "listen": arguments.listen,
            "data_dir": arguments.data_dir,
            "markets_file": arguments.markets_file,
        },
    )
    configure_logging(f"shard-{settings.shard_id}", settings.log_level)
    configure_tracing("oms-shard")
    if arguments.colocate:
        # Loaded only here: it brings the persister's, bridge's and reconciler's code.
        colocated = importlib.import_module("services.shard.colocated")
        uvloop.run(colocated.serve_colocated(settings))
    else:
        uvloop.run(serve(settings))
    return 0
