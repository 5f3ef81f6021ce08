"""Authentication and authorization: each refusal has its own reason and changes nothing.

The bad requests are sent as a real client would (raw gRPC with hand-made
metadata where the client library would refuse to make them), and the account
is read back afterwards through a correctly signed client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import pytest

from gateway.client import AdminClient, GatewayCallError, OmsClient
from gateway.signing import (
    API_KEY_HEADER,
    REASON_TRAILER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signed_metadata,
)
from protos.oms.v1 import gateway_pb2
from services.clients.channels import mesh_channel
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import (
    Account,
    account_state,
    assert_refused,
    buy,
    open_account,
    refusal,
)
from tests.gateway.gateway_process import ADMIN_KEY, ADMIN_SECRET

PLACE = "/oms.v1.OrderGateway/PlaceOrder"
U = grpc.StatusCode.UNAUTHENTICATED
P = grpc.StatusCode.PERMISSION_DENIED


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def raw_place(
    address: str, request: gateway_pb2.PlaceOrderRequest, metadata: Sequence[tuple[str, str]]
) -> GatewayCallError:
    async with mesh_channel(address) as channel:
        call = channel.unary_unary(
            PLACE,
            request_serializer=gateway_pb2.PlaceOrderRequest.SerializeToString,
            response_deserializer=gateway_pb2.OrderAck.FromString,
        )
        try:
            answer = await call(request, metadata=tuple(metadata), timeout=10)
        except grpc.aio.AioRpcError as error:
            return GatewayCallError.of(error)
    raise AssertionError(f"expected a refusal, got {answer}")


@pytest.fixture
async def victim(shared_mesh: FullMesh, admin: AdminClient) -> Account:
    return await open_account(admin, {"USDT": 10_000_000_000})


async def test_bad_credentials_are_refused_with_their_reason(
    shared_mesh: FullMesh, victim: Account
) -> None:
    address = shared_mesh.gateway.address
    async with victim.client(address) as client:
        before = await account_state(client)
        counters_before = await gateway_counters(address)
        request = buy(client, "sneaky", 1)
        good = dict(signed_metadata(victim.api_key, victim.api_secret, PLACE, request, now_ms()))

        missing = await raw_place(address, request, [])
        assert_refused(missing, U, "MISSING_CREDENTIALS")
        no_signature = await raw_place(
            address, request, [(k, v) for k, v in good.items() if k != SIGNATURE_HEADER]
        )
        assert_refused(no_signature, U, "MISSING_CREDENTIALS")
        bad_timestamp = await raw_place(
            address, request, [*{**good, TIMESTAMP_HEADER: "soon"}.items()]
        )
        assert_refused(bad_timestamp, U, "MISSING_CREDENTIALS")

        wrong_secret = signed_metadata(victim.api_key, "not-the-secret", PLACE, request, now_ms())
        assert_refused(await raw_place(address, request, wrong_secret), U, "BAD_SIGNATURE")
        # A valid signature of other bytes: the request was altered on the way.
        altered = buy(client, "sneaky", 1000)
        assert_refused(await raw_place(address, altered, list(good.items())), U, "BAD_SIGNATURE")
        # A valid signature for another method.
        for_cancel = signed_metadata(
            victim.api_key, victim.api_secret, "/oms.v1.OrderGateway/CancelOrder", request, now_ms()
        )
        assert_refused(await raw_place(address, request, for_cancel), U, "BAD_SIGNATURE")

        for skew_ms in (-6_000, 6_000):
            stale = signed_metadata(
                victim.api_key, victim.api_secret, PLACE, request, now_ms() + skew_ms
            )
            assert_refused(await raw_place(address, request, stale), U, "STALE_TIMESTAMP")

        made_up = signed_metadata("ak_made_up", "whatever", PLACE, request, now_ms())
        assert_refused(await raw_place(address, request, made_up), U, "UNKNOWN_KEY")

        after = await account_state(client)
    assert after == before
    counters = await gateway_counters(address)
    assert counters["auth_failures"] - counters_before.get("auth_failures", 0) == 9
    assert counters["errors.BAD_SIGNATURE"] - counters_before.get("errors.BAD_SIGNATURE", 0) == 3


async def test_a_key_acts_only_on_its_own_account(
    shared_mesh: FullMesh, admin: AdminClient, victim: Account
) -> None:
    address = shared_mesh.gateway.address
    intruder = await open_account(admin, {"USDT": 10_000_000_000})
    async with victim.client(address) as own:
        placed = await own.place_order(buy(own, "mine", 1))
        before = await account_state(own)
    # The intruder's own, correctly signed key, naming the victim's account.
    async with OmsClient(
        address, user_id=victim.user_id, api_key=intruder.api_key, api_secret=intruder.api_secret
    ) as intruder_client:
        calls = [
            intruder_client.place_order(buy(intruder_client, "theirs", 1)),
            intruder_client.cancel(order_id=placed.order_id),
            intruder_client.cancel(client_order_id="mine"),
            intruder_client.get_order(order_id=placed.order_id),
            intruder_client.open_orders(),
            intruder_client.balances(),
            intruder_client.positions(),
        ]
        for call in calls:
            assert_refused(await refusal(call), P, "NOT_YOUR_ACCOUNT")
        with pytest.raises(GatewayCallError) as streamed:
            async with intruder_client.order_updates():
                pass
        assert_refused(streamed.value, P, "NOT_YOUR_ACCOUNT")
    # The Trade stream opens (it is the intruder's key) but refuses each foreign request.
    async with intruder.client(address) as trader, trader.trade() as stream:
        foreign = buy(trader, "via-stream", 1)
        foreign.user_id = victim.user_id
        cancel = gateway_pb2.CancelOrderRequest(user_id=victim.user_id, order_id=placed.order_id)
        answers = await stream.submit([foreign, cancel])
        assert [a.error.reason for a in answers] == [
            gateway_pb2.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT
        ] * 2
    async with victim.client(address) as own:
        assert await account_state(own) == before


async def test_only_the_admin_key_calls_the_admin_api(
    shared_mesh: FullMesh, victim: Account
) -> None:
    address = shared_mesh.gateway.address
    async with victim.client(address) as own:
        before = await account_state(own)
    async with AdminClient(address, api_key=victim.api_key, api_secret=victim.api_secret) as fake:
        calls = [
            fake.create_user(),
            fake.deposit(victim.user_id, "USDT", 1_000_000, "self-service"),
            fake.withdraw(victim.user_id, "USDT", 1_000_000, "self-service"),
            fake.halt_symbol("BTC-USDT"),
            fake.resume_symbol("BTC-USDT"),
            fake.kill_switch(victim.user_id, enable=True),
        ]
        for call in calls:
            assert_refused(await refusal(call), P, "ADMIN_REQUIRED")
    async with AdminClient(address, api_key=ADMIN_KEY, api_secret="guess") as guessed:
        assert_refused(await refusal(guessed.create_user()), U, "BAD_SIGNATURE")
    # The admin key has no account of its own to trade on.
    async with OmsClient(
        address, user_id=victim.user_id, api_key=ADMIN_KEY, api_secret=ADMIN_SECRET
    ) as operator:
        assert_refused(await refusal(operator.balances()), P, "NOT_YOUR_ACCOUNT")
    async with victim.client(address) as own:
        assert await account_state(own) == before


async def test_streams_are_authenticated_at_open(shared_mesh: FullMesh, victim: Account) -> None:
    address = shared_mesh.gateway.address
    async with OmsClient(
        address, user_id=victim.user_id, api_key=victim.api_key, api_secret="wrong"
    ) as wrong:
        with pytest.raises(GatewayCallError) as updates:
            async with wrong.order_updates():
                pass
        assert_refused(updates.value, U, "BAD_SIGNATURE")
        # A Trade stream too is refused as it opens, before anything is written on it.
        with pytest.raises(GatewayCallError) as trade:
            async with wrong.trade():
                pass
        assert_refused(trade.value, U, "BAD_SIGNATURE")


async def test_the_reason_travels_in_trailing_metadata(shared_mesh: FullMesh) -> None:
    async with mesh_channel(shared_mesh.gateway.address) as channel:
        call = channel.unary_unary(
            "/oms.v1.OrderGateway/GetBalances",
            request_serializer=gateway_pb2.GetBalancesRequest.SerializeToString,
            response_deserializer=gateway_pb2.Balances.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call(gateway_pb2.GetBalancesRequest(user_id=1), metadata=((API_KEY_HEADER, "x"),))
    error = raised.value
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (REASON_TRAILER, "GATEWAY_ERROR_REASON_MISSING_CREDENTIALS") in tuple(
        error.trailing_metadata() or ()
    )
