"""Every service's Prometheus endpoint, scraped while orders flow through a real mesh.

Each process serves `GET /metrics` on `OMS_METRICS_LISTEN`; the series move as
orders are placed and filled, the database-side duplicate counters stay 0, and every
series the shipped alert rules and dashboard use is one a running mesh exports.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from protos.oms.v1 import common_pb2
from services.infra.ports import LOOPBACK, free_port
from tests.full_mesh import FullMesh
from tests.gateway.accounts import buy, eventually, open_account
from tests.service_process import ROOT, ServiceProcess

MONITORING = ROOT / "k8s" / "monitoring"
ORDERS = 12
# Only a replicated group (an etcd log, `--replicas 3`) exports its replica's numbers:
# test_replica_metrics.py scrapes those.
REPLICATED_ONLY = {"oms_leading"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
async def scraped_mesh(tmp_path: Path, database_url: str) -> AsyncIterator[FullMesh]:
    mesh = FullMesh.create(tmp_path / "mesh", database_url)
    for process in mesh.all():
        process.environment["OMS_METRICS_LISTEN"] = f"{LOOPBACK}:{free_port()}"
    try:
        await asyncio.to_thread(mesh.start)
        yield mesh
    finally:
        await asyncio.to_thread(mesh.stop)


def scrape(address: str) -> Samples:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{address}: {error}: {error.read().decode()[-2000:]}") from error
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def process_name(mesh: FullMesh, process: ServiceProcess) -> str:
    for group, matcher in mesh.matchers.items():
        if matcher is process:
            return f"matcher-{group}"
    return process.subcommand


async def scrape_all(mesh: FullMesh) -> dict[str, Samples]:
    return {
        process_name(mesh, process): await asyncio.to_thread(
            scrape, process.environment["OMS_METRICS_LISTEN"]
        )
        for process in mesh.all()
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_every_service_exports_series_that_move_as_orders_flow(
    scraped_mesh: FullMesh,
) -> None:
    mesh = scraped_mesh
    before = await scrape_all(mesh)
    async with mesh.admin() as admin:
        buyer = await open_account(admin, {"USDT": 10**12})
        seller = await open_account(admin, {"BTC": 10**9})
    async with (
        buyer.client(mesh.gateway.address) as buying,
        seller.client(mesh.gateway.address) as selling,
    ):
        for number in range(ORDERS):
            assert (await buying.place_order(buy(buying, f"m-b-{number}", 1))).accepted
            sell = selling.place_request(
                f"m-s-{number}",
                "BTC-USDT",
                common_pb2.SIDE_SELL,
                price_ticks=6_500_000,
                quantity_lots=1,
            )
            assert (await selling.place_order(sell)).accepted

    async def settled() -> dict[str, Samples]:
        return await scrape_all(mesh)

    after = await eventually(
        settled,
        lambda now: (
            value(now["shard"], "oms_fills_settled_total", service="shard")
            >= value(before["shard"], "oms_fills_settled_total", service="shard") + 2 * ORDERS
            # and the persister's cursor, reported once a second, logged past the orders
            and value(now["shard"], "oms_persisted_through", service="shard")
            > value(before["shard"], "oms_persisted_through", service="shard")
        ),
        timeout_s=30.0,
    )
    gateway, shard, persister = after["gateway"], after["shard"], after["persister"]
    # The gateway: requests by method, and every ack in the latency histogram.
    assert (
        value(gateway, "oms_requests_total", service="gateway", key="PlaceOrder")
        >= value(before["gateway"], "oms_requests_total", service="gateway", key="PlaceOrder")
        + 2 * ORDERS
    )
    acks = value(gateway, "oms_gateway_ack_latency_seconds_count", api="unary", outcome="accepted")
    assert acks >= 2 * ORDERS, acks
    assert (
        value(
            gateway,
            "oms_gateway_ack_latency_seconds_bucket",
            api="unary",
            outcome="accepted",
            le="+Inf",
        )
        == acks
    )
    # The shard: orders, its log, residents; the persister: rows written, no duplicate.
    assert value(shard, "oms_orders_accepted_total", service="shard") >= 2 * ORDERS
    assert value(shard, "oms_resident_users", service="shard") >= 2
    assert value(shard, "oms_records_total", service="sequencer") > value(
        before["shard"], "oms_records_total", service="sequencer"
    )
    assert value(shard, "oms_sequencer_queue_dwell_seconds_count") >= 2 * ORDERS
    for duplicate in ("command", "order", "fill"):
        name = f"oms_duplicate_{duplicate}_reached_db_total"
        assert (name, (("service", "persister"),)) in persister, name
        assert value(persister, name, service="persister") == 0
    assert value(after["matcher-g1"], "oms_last_trade_id", service="matcher") >= ORDERS
    # Every process: its CPU and memory.
    for name, samples in after.items():
        assert value(samples, "oms_process_cpu_seconds_total") > 0, name
        assert value(samples, "oms_process_resident_memory_bytes") > 0, name

    # What the shipped rules and dashboard query is what a mesh exports.
    exported = {
        re.sub(r"_(bucket|count|sum)$", "", sample_name)
        for samples in after.values()
        for sample_name, _ in samples
    }
    queried = queried_series()
    assert queried, "no series found in the rules and the dashboard"
    missing = queried - exported - REPLICATED_ONLY
    assert not missing, sorted(missing)


def queried_series() -> set[str]:
    rules = yaml.safe_load((MONITORING / "oms-alerts.rules.yaml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((MONITORING / "oms-dashboard.json").read_text())
    expressions += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    names: set[str] = set()
    for expression in expressions:
        names.update(
            re.sub(r"_bucket$", "", name) for name in re.findall(r"\boms_[a-z0-9_]+", expression)
        )
    return names
