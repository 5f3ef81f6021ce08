"""The Trade stream's deadline: one sweep per stream answers every request still
unanswered at its deadline with TIMEOUT, whatever the handler is waiting on, and the
requests answered in time are not touched (no timer per request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from gateway.credentials import KeyHolder
from gateway.direct_orders import DirectOrder
from gateway.statistics import GatewayCounters
from gateway.trade_stream import TradeSession
from protos.oms.v1 import gateway_pb2, shard_pb2

USER = 7
DEADLINE_S = 0.3


def _request(request_id: int, client_order_id: str) -> gateway_pb2.TradeRequest:
    request = gateway_pb2.TradeRequest(request_id=request_id)
    request.place.user_id = USER
    request.place.client_order_id = client_order_id
    return request


async def test_late_requests_are_answered_timeout_and_prompt_ones_are_not() -> None:
    released = asyncio.Event()

    async def place(
        request: gateway_pb2.PlaceOrderRequest, session_id: int = 0
    ) -> gateway_pb2.OrderAck:
        if request.client_order_id.startswith("stuck"):
            await asyncio.Event().wait()  # a shard that never answers
        if request.client_order_id.startswith("late-but-ok"):
            await released.wait()
        return gateway_pb2.OrderAck(client_order_id=request.client_order_id, accepted=True)

    async def cancel(request: gateway_pb2.CancelOrderRequest) -> gateway_pb2.CancelAck:
        return gateway_pb2.CancelAck()

    async def cancel_all(
        request: gateway_pb2.CancelAllOrdersRequest,
    ) -> gateway_pb2.CancelAllAck:
        return gateway_pb2.CancelAllAck()

    session = TradeSession(
        KeyHolder(api_key="k", secret="s", user_id=USER),
        check=lambda request: None,
        place=place,
        cancel=cancel,
        cancel_all=cancel_all,
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


async def test_orders_sent_straight_to_the_link_meet_the_same_deadline() -> None:
    """The direct path (gateway/direct_orders.py): no task per request, the answer from
    the result future's callback, and the same sweep answering TIMEOUT at the deadline
    (which also cancels the future, so a command not yet sent is never sent)."""
    loop = asyncio.get_running_loop()
    futures: dict[str, asyncio.Future[shard_pb2.ShardResult]] = {}

    def submit(
        request: gateway_pb2.TradeRequest, deadline: float, session_id: int = 0
    ) -> DirectOrder:
        future: asyncio.Future[shard_pb2.ShardResult] = loop.create_future()
        futures[request.place.client_order_id] = future
        if request.place.client_order_id.startswith("fast"):
            future.set_result(shard_pb2.ShardResult(accepted=True, order_id="s1:1"))
        return DirectOrder(request, None, future, deadline)  # type: ignore[arg-type]

    async def never(request: object) -> None:
        raise AssertionError("the routed path is not taken")

    session = TradeSession(
        KeyHolder(api_key="k", secret="s", user_id=USER),
        check=lambda request: None,
        place=never,  # type: ignore[arg-type]
        cancel=never,  # type: ignore[arg-type]
        cancel_all=never,  # type: ignore[arg-type]
        counters=GatewayCounters(),
        max_in_flight=100,
        deadline_s=DEADLINE_S,
        submit=submit,
    )

    async def batches() -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
        yield gateway_pb2.TradeRequestBatch(requests=[_request(1, "stuck-1"), _request(2, "fast")])

    answered: dict[int, tuple[float, gateway_pb2.TradeResponse]] = {}
    started = time.monotonic()
    async for batch in session.run(batches()):
        for response in batch.responses:
            answered[response.request_id] = (time.monotonic() - started, response)
    assert answered[2][1].place.accepted and answered[2][1].place.order_id == "s1:1"
    took_s, stuck = answered[1]
    assert stuck.error.reason == gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT, stuck
    assert DEADLINE_S <= took_s < DEADLINE_S + 1.0, took_s
    assert futures["stuck-1"].cancelled()
