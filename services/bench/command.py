"""`oms bench <target>`: each target lives in its own module and loads on demand."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

# target -> (module, help)
TARGETS: dict[str, tuple[str, str]] = {
    "runtime": (
        "services.bench.runtime_bench",
        "durable entries/s, append-to-durable latency, snapshot pause of the runtime",
    ),
    "shard": (
        "services.bench.shard_bench",
        "user shard commands/s in-process with 1M resident users, eviction sweep cost",
    ),
    "matcher": (
        "services.bench.matcher_bench",
        "orders/s through the pure matching core: engine only, and from batch bytes",
    ),
    "write-behind": (
        "services.bench.write_behind_bench",
        "the persister's usual transaction: one call (migration 0007) against its statements",
    ),
    "e2e": (
        "services.bench.e2e_bench",
        "orders/s and ack latency through the whole mesh vs the row-lock baseline",
    ),
    "unary-floor": (
        "services.bench.unary_floor",
        "CPU per unary PlaceOrder call before any shard: grpc.aio alone, with an interceptor,"
        " and the gateway's own handler path, side by side",
    ),
    "scale": (
        "services.bench.scale_bench",
        "ack latency and throughput before, during and after a scaling wave (2 -> 3 user-shard "
        "clusters and back), and each wave's duration against the resident users it moved",
    ),
    "failover": (
        "services.bench.failover_bench",
        "seconds from SIGKILL of a shard's or matcher group's leader to its successor's "
        "first acknowledged command",
    ),
    "upgrade": (
        "services.bench.upgrade_bench",
        "the callers' longest wait while each replica of a shard and of a matcher group is "
        "rolled to the next build, and at the switch to its state-machine version",
    ),
    "marketdata": (
        "services.bench.market_data_bench",
        "the market-data service under N subscribers at a steady order rate: matcher log"
        " entry to receipt p50/p99, the matchers' CPU per order with and without subscribers,"
        " the service's CPU per delivered message and memory per subscriber",
    ),
}


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench", help="run a benchmark and print its figures"
    )
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name, (module_path, help_text) in TARGETS.items():
        target = targets.add_parser(name, help=help_text)
        module = importlib.import_module(module_path)
        module.add_arguments(target)
        target.set_defaults(handler=module.run)
