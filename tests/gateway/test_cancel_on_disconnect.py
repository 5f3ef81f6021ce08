"""Cancel on disconnect, on real processes: a Trade stream opened with
`cancel_on_disconnect_ms` has the orders placed on it, and only those, cancelled by the
user's shard when it ends without a clean close: at once when the client goes away,
after the timeout when the gateway itself dies. A clean close leaves them resting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.client import AdminClient, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2
from tests.full_mesh import FullMesh
from tests.gateway.accounts import PRICE, buy, eventually, open_account

USDT_FUNDS = 10_000_000_000  # 10,000 USDT
TIMEOUT_MS = 2_000
OPEN = common_pb2.ORDER_STATUS_OPEN
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED


def rests(client: OmsClient, prefix: str, count: int) -> list[gateway_pb2.PlaceOrderRequest]:
    return [buy(client, f"{prefix}{n}", 1, price_ticks=PRICE - 1) for n in range(count)]


async def placed(stream: object, requests: list[gateway_pb2.PlaceOrderRequest]) -> list[str]:
    answers = await stream.submit(requests)  # type: ignore[attr-defined]
    assert all(answer.place.accepted for answer in answers), answers
    return [answer.place.order_id for answer in answers]


async def statuses(client: OmsClient, order_ids: list[str]) -> list[int]:
    return [(await client.get_order(order_id=order_id)).status for order_id in order_ids]


async def test_a_client_that_goes_away_has_its_streams_orders_cancelled_and_no_others(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        async with client.trade() as plain_stream:
            untouched = await placed(plain_stream, rests(client, "plain", 1))
        stream = client.trade(cancel_on_disconnect_ms=TIMEOUT_MS)
        await stream.__aenter__()
        on_stream = await placed(stream, rests(client, "cod", 2))
        await eventually(
            lambda: statuses(client, on_stream + untouched),
            lambda found: found == [OPEN, OPEN, OPEN],
        )
        stream.abort()  # no clean close: the gateway ends the session, cancelling
        await eventually(
            lambda: statuses(client, on_stream), lambda found: found == [CANCELLED] * 2
        )
        assert await statuses(client, untouched) == [OPEN]
        # A stream closed cleanly leaves its orders resting, past its timeout.
        async with client.trade(cancel_on_disconnect_ms=TIMEOUT_MS) as clean_stream:
            kept = await placed(clean_stream, rests(client, "clean", 1))
        await eventually(client.positions, lambda _: True)  # one round trip
        await asyncio.sleep(2 * TIMEOUT_MS / 1000)  # what must NOT happen: no event to wait on
        assert await statuses(client, kept + untouched) == [OPEN, OPEN]
        await client.cancel_all()


async def test_a_bad_timeout_ends_the_stream_before_any_order(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(shared_mesh.gateway.address) as client:
        async with client.trade(cancel_on_disconnect_ms=5) as stream:
            stream.send(gateway_pb2.TradeRequestBatch(requests=[stream.request(buy(client, "x"))]))
            error = await stream.ended()
        assert error is not None and error.reason == "GATEWAY_ERROR_REASON_INVALID_FIELD", error
        assert "INVALID_TIMEOUT" in error.detail, error
        assert await client.open_orders() == []


async def test_the_gateway_dying_cancels_them_after_the_timeout(
    new_mesh: Callable[..., FullMesh],
) -> None:
    mesh = new_mesh()
    mesh.start()
    async with mesh.admin() as admin:
        account = await open_account(admin, {"USDT": USDT_FUNDS})
    async with account.client(mesh.gateway.address) as client:
        stream = client.trade(cancel_on_disconnect_ms=TIMEOUT_MS)
        await stream.__aenter__()
        on_stream = await placed(stream, rests(client, "g", 2))
        await eventually(lambda: statuses(client, on_stream), lambda found: found == [OPEN] * 2)
        mesh.gateway.kill()  # nothing ends the session: it expires in the shard
        stream.abort()
    await asyncio.to_thread(mesh.gateway.start_serving)
    async with account.client(mesh.gateway.address) as client:
        await eventually(
            lambda: statuses(client, on_stream), lambda found: found == [CANCELLED] * 2
        )
