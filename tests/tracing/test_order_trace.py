"""One order's trace crosses the whole mesh and arrives at a real OTLP receiver as one tree.

Gateway, shard, persister, reconciler, matchers g1/g2 and bridge run as real
processes that export to `OtlpReceiver` (what Jaeger's collector would receive).
One order placed through the client library must give:

    gateway.place_order (oms-gateway)
    ├── shard.admit_order (oms-shard)          across the shard's log
    └── bridge.submit (oms-bridge)             from SubmitToME.order.trace_parent
        ├── matcher.execute (oms-matcher)      from the call's traceparent metadata
        └── bridge.deliver_event (oms-bridge)  the order's first event, on its way back

and the gateway's JSON log line for the order carries the same trace id. A resting
order's fill comes back in the same trace: every event of the order on the bridge's
way back, the fill's settlement in the shard (a child of the gateway's span), the
persister's write of its rows and the gateway's update to a subscriber (children of
the settlement).
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
from tests.gateway.accounts import BTC, PRICE, buy, eventually, open_account
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
    writes = [span for span in spans if span.name == "persister.write_rows"]
    for span in spans:
        if span.name == "persister.write_rows":
            continue  # the order's rows, perhaps in more than one write: below
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
    # The order's own rows (its updates to pending, then open) written in its trace.
    for write in writes:
        assert (write.service, write.parent_span_id) == ("oms-persister", gateway.span_id)
        assert write.attributes["oms.order_id"] == ack.order_id

    line = await gateway_log_line(mesh.gateway.log_path, "gateway.order_placed", ack.order_id)
    assert line["trace_id"] == trace_id
    assert line["span_id"] == gateway.span_id

    counters = (await service_status(mesh.bridge.address)).counters
    assert counters["traced_submits"] == 1 and counters["traced_batched"] == 0


FILL_SPAN_NAMES = {
    "gateway.place_order",
    "shard.admit_order",
    "bridge.submit",
    "matcher.execute",
    "bridge.deliver_event",
    "shard.settle_fill",
    "persister.write_rows",
    "gateway.order_update",
}


async def test_a_resting_orders_fill_comes_back_in_its_trace(
    traced_mesh: tuple[FullMesh, OtlpReceiver],
) -> None:
    """The way back of a fill: a bid rests (its trace as above), an ask by another user
    crosses it; the bid's fill reaches the bridge from the matcher's stream
    (bridge.deliver_event for `fill`), is settled by the shard (shard.settle_fill),
    its rows written (persister.write_rows) and its update sent to the subscriber
    (gateway.order_update), all in the bid's trace."""
    mesh, receiver = traced_mesh
    async with mesh.admin() as admin:
        buyer = await open_account(admin, {"USDT": USDT_FUNDS})
        seller = await open_account(admin, {"BTC": 1_000_000})
    async with (
        buyer.client(mesh.gateway.address) as buying,
        seller.client(mesh.gateway.address) as selling,
        buying.order_updates() as updates,
    ):
        bid = await buying.place_order(buy(buying, "traced-bid", 1))
        assert bid.accepted, bid
        await eventually(
            lambda: buying.get_order(order_id=bid.order_id),
            lambda view: view.status == common_pb2.ORDER_STATUS_OPEN,
        )
        ask = await selling.place(
            "traced-ask", BTC, common_pb2.SIDE_SELL, price_ticks=PRICE, quantity_lots=1
        )
        assert ask.accepted, ask
        while True:
            update = await updates.next()
            if update.order_id == bid.order_id and update.status == common_pb2.ORDER_STATUS_FILLED:
                break

    trace_id = await trace_of_order(receiver, bid.order_id)
    await receiver.wait_trace(trace_id, SERVICES | {"oms-persister"}, timeout_s=WAIT_S)

    async def probe() -> list[ReceivedSpan]:
        return [span for span in receiver.spans if span.trace_id == trace_id]

    def complete(found: list[ReceivedSpan]) -> bool:
        """Every kind of span, the settlement's write and its FILLED update among them
        (spans arrive in batches, from five processes, in no order)."""
        settles = {span.span_id for span in found if span.name == "shard.settle_fill"}
        children = {
            span.name
            for span in found
            if span.parent_span_id in settles
            and (
                span.name == "persister.write_rows"
                or "FILLED" in span.attributes.get("oms.status", "")
            )
        }
        names = {span.name for span in found}
        delivered = {
            span.attributes.get("oms.event")
            for span in found
            if span.name == "bridge.deliver_event"
        }
        return (
            names >= FILL_SPAN_NAMES
            and delivered >= {"accepted", "fill"}
            and children
            == {
                "persister.write_rows",
                "gateway.order_update",
            }
        )

    spans = await eventually(probe, complete, timeout_s=WAIT_S)
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    (gateway,) = named["gateway.place_order"]
    (submit,) = named["bridge.submit"]
    events = {span.attributes["oms.event"]: span for span in named["bridge.deliver_event"]}
    assert set(events) == {"accepted", "fill"}, named["bridge.deliver_event"]
    assert {span.parent_span_id for span in events.values()} == {submit.span_id}
    (settle,) = named["shard.settle_fill"]
    assert (settle.service, settle.parent_span_id) == ("oms-shard", gateway.span_id)
    assert settle.attributes["oms.order_id"] == bid.order_id
    writes = named["persister.write_rows"]
    assert ("oms-persister", settle.span_id) in {
        (span.service, span.parent_span_id) for span in writes
    }, writes
    (settled_write,) = [span for span in writes if span.parent_span_id == settle.span_id]
    assert "fill@" in settled_write.attributes["oms.rows"], settled_write
    delivered = named["gateway.order_update"]
    filled = [span for span in delivered if span.attributes["oms.status"] == "ORDER_STATUS_FILLED"]
    assert [(span.service, span.parent_span_id) for span in filled] == [
        ("oms-gateway", settle.span_id)
    ]
    # Nothing of the ask's own trace is mixed in.
    assert {span.attributes.get("oms.order_id", bid.order_id) for span in spans} == {bid.order_id}
