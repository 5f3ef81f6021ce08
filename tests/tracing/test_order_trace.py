"""One order's trace crosses the whole mesh and arrives at a real OTLP receiver as one tree.

Gateway, shard, persister, reconciler, matchers g1/g2 and bridge run as real
processes that export to `OtlpReceiver` (what Jaeger's collector would receive).
One order placed through the client library must give:

    gateway.place_order (oms-gateway)
    ├── shard.admit_order (oms-shard)          across the shard's log
    └── bridge.submit (oms-bridge)             from SubmitToME.order.trace_parent
        ├── matcher.execute (oms-matcher)      from the call's traceparent metadata
        └── bridge.deliver_event (oms-bridge)  the order's first event, on its way back

and the gateway's JSON log line for the order carries the same trace id.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protos.oms.v1 import common_pb2
from tests.bridge.bridge_process import service_status
from tests.full_mesh import FullMesh
from tests.gateway.accounts import buy, eventually, open_account
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

SERVICES = {"oms-gateway", "oms-shard", "oms-bridge", "oms-matcher"}
SPAN_NAMES = {
    "gateway.place_order",
    "shard.admit_order",
    "bridge.submit",
    "matcher.execute",
    "bridge.deliver_event",
}
USDT_FUNDS = 10_000_000_000  # 10,000 USDT
WAIT_S = 20.0
POLL_S = 0.05


@pytest.fixture
async def traced_mesh(
    tmp_path: Path, database_url: str
) -> AsyncIterator[tuple[FullMesh, OtlpReceiver]]:
    async with OtlpReceiver() as receiver:
        mesh = FullMesh.create(tmp_path / "mesh", database_url)
        for process in mesh.all():
            process.environment.update(
                {"OMS_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
            )
        mesh.gateway.environment["OMS_LOG_LEVEL"] = "DEBUG"
        try:
            # In a thread: the receiver serves on this loop while the processes start.
            await asyncio.to_thread(mesh.start)
            yield mesh, receiver
        finally:
            await asyncio.to_thread(mesh.stop)


async def trace_of_order(receiver: OtlpReceiver, order_id: str) -> str:
    """The trace id of the shard's span of `order_id` (the client starts no trace itself)."""

    async def probe() -> list[ReceivedSpan]:
        return [
            span
            for span in receiver.spans
            if span.name == "shard.admit_order" and span.attributes.get("oms.order_id") == order_id
        ]

    (span,) = await eventually(probe, bool, timeout_s=WAIT_S)
    return span.trace_id


async def wait_span_names(receiver: OtlpReceiver, trace_id: str) -> list[ReceivedSpan]:
    await receiver.wait_trace(trace_id, SERVICES, timeout_s=WAIT_S)

    async def probe() -> list[ReceivedSpan]:
        return [span for span in receiver.spans if span.trace_id == trace_id]

    return await eventually(
        probe, lambda spans: {span.name for span in spans} >= SPAN_NAMES, timeout_s=WAIT_S
    )


async def gateway_log_line(path: Path, event: str, order_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        for line in (await asyncio.to_thread(path.read_text)).splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            if entry.get("event") == event and entry.get("order_id") == order_id:
                return dict(entry)
        if time.monotonic() > deadline:
            raise AssertionError(f"no {event} line for {order_id} in {path}")
        await asyncio.sleep(POLL_S)


async def test_one_orders_spans_cover_the_four_services_as_one_tree(
    traced_mesh: tuple[FullMesh, OtlpReceiver],
) -> None:
    mesh, receiver = traced_mesh
    async with mesh.admin() as admin:
        account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(mesh.gateway.address) as client:
        ack = await client.place_order(buy(client, "traced-1", 1))
        assert ack.accepted, ack
        # Nothing to cross with: the order rests, so its first event is `accepted`.
        await eventually(
            lambda: client.get_order(order_id=ack.order_id),
            lambda view: view.status == common_pb2.ORDER_STATUS_OPEN,
        )

    trace_id = await trace_of_order(receiver, ack.order_id)
    spans = await wait_span_names(receiver, trace_id)
    by_name: dict[str, ReceivedSpan] = {}
    for span in spans:
        assert span.name not in by_name, f"two {span.name} spans: {spans}"
        by_name[span.name] = span
    assert set(by_name) == SPAN_NAMES, spans

    gateway = by_name["gateway.place_order"]
    admit = by_name["shard.admit_order"]
    submit = by_name["bridge.submit"]
    execute = by_name["matcher.execute"]
    back = by_name["bridge.deliver_event"]
    assert [(s.service, s.parent_span_id) for s in (gateway, admit, submit, execute, back)] == [
        ("oms-gateway", ""),  # the root: the client sent no traceparent
        ("oms-shard", gateway.span_id),
        ("oms-bridge", gateway.span_id),
        ("oms-matcher", submit.span_id),
        ("oms-bridge", submit.span_id),
    ]
    for span in (admit, submit, back):
        assert span.attributes["oms.order_id"] == ack.order_id
    assert back.attributes["oms.event"] == "accepted"

    line = await gateway_log_line(mesh.gateway.log_path, "gateway.order_placed", ack.order_id)
    assert line["trace_id"] == trace_id
    assert line["span_id"] == gateway.span_id

    counters = (await service_status(mesh.bridge.address)).counters
    assert counters["traced_submits"] == 1 and counters["traced_batched"] == 0
