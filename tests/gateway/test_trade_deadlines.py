"""The Trade stream's deadline: one sweep per stream answers every request still
unanswered at its deadline with TIMEOUT, whatever the handler is waiting on, and the
requests answered in time are not touched (no timer per request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from gateway.credentials import KeyHolder
from gateway.statistics import GatewayCounters
from gateway.trade_stream import TradeSession
from protos.oms.v1 import gateway_pb2

USER = 7
DEADLINE_S = 0.3


def _request(request_id: int, client_order_id: str) -> gateway_pb2.TradeRequest:
    request = gateway_pb2.TradeRequest(request_id=request_id)
    request.place.user_id = USER
    request.place.client_order_id = client_order_id
    return request


async def test_late_requests_are_answered_timeout_and_prompt_ones_are_not() -> None:
    released = asyncio.Event()

    async def place(request: gateway_pb2.PlaceOrderRequest) -> gateway_pb2.OrderAck:
        if request.client_order_id.startswith("stuck"):
            await asyncio.Event().wait()  # a shard that never answers
        if request.client_order_id.startswith("late-but-ok"):
            await released.wait()
        return gateway_pb2.OrderAck(client_order_id=request.client_order_id, accepted=True)

    async def cancel(request: gateway_pb2.CancelOrderRequest) -> gateway_pb2.CancelAck:
        return gateway_pb2.CancelAck()

    session = TradeSession(
        KeyHolder(api_key="k", secret="s", user_id=USER),
        check=lambda request: None,
        place=place,
        cancel=cancel,
        counters=GatewayCounters(),
        max_in_flight=100,
        deadline_s=DEADLINE_S,
    )
    second_batch = asyncio.Event()

    async def batches() -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
        yield gateway_pb2.TradeRequestBatch(
            requests=[_request(1, "stuck-1"), _request(2, "fast-2"), _request(3, "late-but-ok")]
        )
        await second_batch.wait()
        yield gateway_pb2.TradeRequestBatch(requests=[_request(4, "stuck-4")])

    answered: dict[int, tuple[float, gateway_pb2.TradeResponse]] = {}
    started = time.monotonic()
    async for batch in session.run(batches()):
        for response in batch.responses:
            answered[response.request_id] = (time.monotonic() - started, response)
        if 2 in answered and not released.is_set():
            released.set()  # answered well inside its deadline
            second_batch.set()
    reasons = {rid: r.WhichOneof("response") or "" for rid, (_, r) in answered.items()}
    assert set(answered) == {1, 2, 3, 4}
    assert answered[2][1].place.accepted and answered[3][1].place.accepted
    for rid in (1, 4):
        took_s, response = answered[rid]
        assert response.error.reason == gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT, reasons
        assert DEADLINE_S <= took_s < DEADLINE_S + 1.0, (rid, took_s)
