"""Crashes around the gateway: clients retry with the same client order ids, nothing doubles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

import grpc

from gateway.client import AdminClient, GatewayCallError, OmsClient, TradeStream
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import (
    PRICE,
    account_state,
    assert_refused,
    buy,
    eventually,
    limit_buy_reservation,
    open_account,
    refusal,
)

WHALE = shard_pb2.USER_TIER_WHALE


async def test_retry_after_the_gateway_is_killed_returns_the_original_ack(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    gateway = shared_mesh.new_gateway("gateway-killed")
    shared_mesh.start(gateway)
    account = await open_account(admin, {"USDT": 10_000_000_000})
    async with account.client(gateway.address) as client:
        original = await client.place_order(buy(client, "before-crash", 2))
    gateway.kill()
    gateway.start_serving()
    async with account.client(gateway.address) as client:
        retried = await client.place_order(buy(client, "before-crash", 2))
        assert retried.accepted and retried.duplicate
        assert retried.order_id == original.order_id
        state = await account_state(client)
    assert state.balances["USDT"] == (10_000_000_000, limit_buy_reservation(PRICE, 2))
    assert [order_id for order_id, _, _ in state.open_orders] == [original.order_id]


async def test_orders_in_flight_at_a_gateway_crash_apply_exactly_once(
    shared_mesh: FullMesh, admin: AdminClient
) -> None:
    gateway = shared_mesh.new_gateway("gateway-crash-in-flight")
    shared_mesh.start(gateway)
    account = await open_account(admin, {"USDT": 100_000_000_000}, tier=WHALE)
    count = 1_000
    async with account.client(gateway.address) as client:
        orders = [buy(client, f"f-{n}", 1) for n in range(count)]
        async with client.trade() as stream:
            submitted = asyncio.create_task(stream.submit(orders))

            # Kill once the first answers are back: the rest are in flight or not yet sent.
            async def answered() -> int:
                return len(stream.answers)

            await eventually(answered, lambda n: n > 0, timeout_s=15)
            gateway.kill()
            with contextlib.suppress(GatewayCallError):
                await submitted
    gateway.start_serving()
    async with account.client(gateway.address) as client:
        async with client.trade() as stream:
            answers = await stream.submit(orders)
        assert all(answer.place.accepted for answer in answers)
        order_ids = [answer.place.order_id for answer in answers]
        assert len(set(order_ids)) == count
        assert sorted(order_ids, key=_sequence) == [
            f"s1:{account.user_id}:{n}" for n in range(1, count + 1)
        ]
        state = await account_state(client)
    assert len(state.open_orders) == count
    assert state.balances["USDT"][1] == count * limit_buy_reservation(PRICE, 1)


def _sequence(order_id: str) -> int:
    return int(order_id.rsplit(":", 1)[1])


async def test_an_unreachable_shard_is_unavailable_and_the_retry_applies_once(
    new_mesh: Callable[..., FullMesh],
) -> None:
    mesh = new_mesh()
    mesh.start()
    async with mesh.admin() as admin:
        account = await open_account(admin, {"USDT": 10_000_000_000})
    async with account.client(mesh.gateway.address) as client, client.order_updates() as updates:
        mesh.shard.kill()
        error = await refusal(client.place_order(buy(client, "during-outage", 1)))
        assert_refused(error, grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE")
        mesh.shard.start_serving()
        placed = await eventually(
            lambda: _place_or_none(client, "during-outage"), lambda ack: ack is not None
        )
        assert placed is not None and placed.accepted
        again = await client.place_order(buy(client, "during-outage", 1))
        assert again.duplicate and again.order_id == placed.order_id
        # The gateway's order-update feed resumed after the shard came back.
        while True:
            update = await updates.next()
            if update.order_id == placed.order_id and update.status == common_pb2.ORDER_STATUS_OPEN:
                break
        state = await account_state(client)
    assert state.balances["USDT"] == (10_000_000_000, limit_buy_reservation(PRICE, 1))
    counters = await gateway_counters(mesh.gateway.address)
    assert counters["shard_unavailable"] >= 1 and counters["shard_stream_breaks"] >= 1


async def _place_or_none(client: OmsClient, client_order_id: str) -> gateway_pb2.OrderAck | None:
    try:
        return await client.place_order(buy(client, client_order_id, 1))
    except GatewayCallError as error:
        if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        raise


async def test_sigterm_stops_the_gateway_cleanly(shared_mesh: FullMesh, admin: AdminClient) -> None:
    gateway = shared_mesh.new_gateway("gateway-stopped")
    shared_mesh.start(gateway)
    account = await open_account(admin, {"USDT": 10_000_000_000})
    async with account.client(gateway.address) as client:
        assert (await client.place_order(buy(client, "before-stop", 1))).accepted
    assert gateway.terminate() == 0
    assert "service.stopped" in gateway.log_tail()


async def test_a_stopped_shard_gets_every_request_an_answer_within_the_deadline(
    new_mesh: Callable[..., FullMesh],
) -> None:
    # SIGSTOP: the shard's connections stay open and nothing answers on them.
    deadline_s = 1.0
    mesh = new_mesh(gateway_environment={"OMS_GATEWAY_REQUEST_DEADLINE_MS": "1000"})
    mesh.start()
    async with mesh.admin() as admin:
        account = await open_account(admin, {"USDT": 10_000_000_000}, tier=WHALE)
    async with account.client(mesh.gateway.address) as client:
        orders = [buy(client, f"stopped-{n}", 1) for n in range(200)]
        os.kill(mesh.shard.pid, signal.SIGSTOP)
        try:
            async with client.trade() as stream:
                started = time.monotonic()
                answers = await stream.submit(orders, timeout_s=10 * deadline_s)
                took_s = time.monotonic() - started
            reasons = {answer.error.reason for answer in answers}
            assert reasons <= {
                gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT,
                gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE,
            }, answers[:3]
            assert took_s < deadline_s + 1.0, took_s
            started = time.monotonic()
            error = await refusal(client.place_order(orders[0]))
            assert error.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
            assert time.monotonic() - started < deadline_s + 1.0
        finally:
            os.kill(mesh.shard.pid, signal.SIGCONT)
        # Retried with the same ids once the shard runs again: each order exists once.
        async with client.trade() as stream:
            retried = await eventually(
                lambda: _all_answered(stream, orders), lambda acks: acks is not None
            )
        assert retried is not None
        assert len({ack.order_id for ack in retried}) == len(orders)
        state = await account_state(client)
    assert len(state.open_orders) == len(orders)


async def _all_answered(
    stream: TradeStream, orders: list[gateway_pb2.PlaceOrderRequest]
) -> list[gateway_pb2.OrderAck] | None:
    answers = await stream.submit(orders, timeout_s=10)
    if any(not answer.HasField("place") or answer.place.retryable for answer in answers):
        return None
    return [answer.place for answer in answers]
