"""Malformed and out-of-range input: a specific reason naming the field, and nothing changes.

"Nothing changes" is checked twice: the account reads back the same, and the
gateway sent no command to the shard while refusing (its own counter).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from gateway.client import AdminClient
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import (
    SOL,
    Account,
    account_state,
    assert_refused,
    buy,
    open_account,
    refusal,
)

INT64_MAX = (1 << 63) - 1
INVALID = grpc.StatusCode.INVALID_ARGUMENT
C = common_pb2
Mutation = Callable[[gateway_pb2.PlaceOrderRequest], None]


def _set(**fields: object) -> Mutation:
    def mutate(request: gateway_pb2.PlaceOrderRequest) -> None:
        for name, value in fields.items():
            setattr(request, name, value)

    return mutate


def _market(**fields: object) -> Mutation:
    return _set(
        **{"order_type": C.ORDER_TYPE_MARKET, "time_in_force": C.TIME_IN_FORCE_IOC, **fields}
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


DAY_MS = 24 * 3600 * 1000
# (id, mutation of a valid limit buy, reason, field named in the detail)
PLACE_CASES: list[tuple[str, Mutation, str, str]] = [
    ("empty client id", _set(client_order_id=""), "INVALID_FIELD", "client_order_id"),
    ("client id too long", _set(client_order_id="x" * 65), "INVALID_FIELD", "client_order_id"),
    ("client id with tab", _set(client_order_id="a\tb"), "INVALID_FIELD", "client_order_id"),
    ("client id not ascii", _set(client_order_id="ordre-é"), "INVALID_FIELD", "client_order_id"),
    ("unknown symbol", _set(symbol="DOGE-USDT"), "UNKNOWN_SYMBOL", "symbol"),
    ("no side", _set(side=C.SIDE_UNSPECIFIED), "INVALID_FIELD", "side"),
    ("unknown side", _set(side=7), "INVALID_FIELD", "side"),
    ("no order type", _set(order_type=C.ORDER_TYPE_UNSPECIFIED), "INVALID_FIELD", "order_type"),
    ("unknown order type", _set(order_type=9), "INVALID_FIELD", "order_type"),
    ("unknown time in force", _set(time_in_force=42), "INVALID_FIELD", "time_in_force"),
    ("unknown stp", _set(self_trade_prevention=8), "INVALID_FIELD", "self_trade_prevention"),
    ("zero price", _set(price_ticks=0), "OUT_OF_RANGE", "price_ticks"),
    ("negative price", _set(price_ticks=-5), "OUT_OF_RANGE", "price_ticks"),
    ("zero quantity", _set(quantity_lots=0), "OUT_OF_RANGE", "quantity_lots"),
    ("negative quantity", _set(quantity_lots=-1), "OUT_OF_RANGE", "quantity_lots"),
    ("base overflows", _set(quantity_lots=INT64_MAX), "OUT_OF_RANGE", "quantity_lots"),
    (
        "notional overflows",
        _set(price_ticks=1 << 40, quantity_lots=1 << 30),
        "OUT_OF_RANGE",
        "price_ticks",
    ),
    ("limit with quote amount", _set(quote_amount=5), "INVALID_FIELD", "quote_amount"),
    (
        "gtd without expiry",
        _set(time_in_force=C.TIME_IN_FORCE_GTD),
        "INVALID_FIELD",
        "expire_at_ms",
    ),
    (
        "gtd already expired",
        _set(time_in_force=C.TIME_IN_FORCE_GTD, expire_at_ms=1_000),
        "OUT_OF_RANGE",
        "expire_at_ms",
    ),
    (
        "gtd years ahead",
        _set(time_in_force=C.TIME_IN_FORCE_GTD, expire_at_ms=_now_ms() + 400 * DAY_MS),
        "OUT_OF_RANGE",
        "expire_at_ms",
    ),
    ("gtc with expiry", _set(expire_at_ms=_now_ms() + DAY_MS), "INVALID_FIELD", "expire_at_ms"),
    ("market with price", _market(quote_amount=1_000_000), "INVALID_FIELD", "price_ticks"),
    (
        "market fok",
        _market(price_ticks=0, quantity_lots=0, quote_amount=5, time_in_force=C.TIME_IN_FORCE_FOK),
        "INVALID_FIELD",
        "time_in_force",
    ),
    (
        "market buy by quantity",
        _market(price_ticks=0, quote_amount=1_000_000),
        "INVALID_FIELD",
        "quantity_lots",
    ),
    (
        "market buy without amount",
        _market(price_ticks=0, quantity_lots=0),
        "OUT_OF_RANGE",
        "quote_amount",
    ),
    (
        "market sell with amount",
        _market(price_ticks=0, side=C.SIDE_SELL, quote_amount=5),
        "INVALID_FIELD",
        "quote_amount",
    ),
    (
        "market sell without quantity",
        _market(price_ticks=0, quantity_lots=0, side=C.SIDE_SELL),
        "OUT_OF_RANGE",
        "quantity_lots",
    ),
]


@pytest.fixture
async def account(shared_mesh: FullMesh, admin: AdminClient) -> Account:
    return await open_account(admin, {"USDT": 10_000_000_000})


async def _commands_sent(mesh: FullMesh) -> int:
    return (await gateway_counters(mesh.gateway.address)).get("shard_commands_sent", 0)


@pytest.mark.parametrize(
    ("mutation", "reason", "field"),
    [case[1:] for case in PLACE_CASES],
    ids=[case[0] for case in PLACE_CASES],
)
async def test_place_order_field_checks(
    shared_mesh: FullMesh, account: Account, mutation: Mutation, reason: str, field: str
) -> None:
    async with account.client(shared_mesh.gateway.address) as client:
        before = await account_state(client)
        sent = await _commands_sent(shared_mesh)
        request = buy(client, "bad-1", 1)
        mutation(request)
        error = await refusal(client.place_order(request))
        assert_refused(error, INVALID, reason)
        assert error.detail.startswith(field), error.detail
        assert await _commands_sent(shared_mesh) == sent
        assert await account_state(client) == before


async def test_order_references_and_filters(shared_mesh: FullMesh, account: Account) -> None:
    async with account.client(shared_mesh.gateway.address) as client:
        sent = await _commands_sent(shared_mesh)
        for call, field in [
            (client.cancel(), "client_order_id"),
            (client.cancel(order_id="s1:1:1", client_order_id="c"), "order_id"),
            (client.cancel(order_id="x" * 129), "order_id"),
            (client.get_order(), "client_order_id"),
            (client.get_order(client_order_id="\x00"), "client_order_id"),
        ]:
            error = await refusal(call)
            assert_refused(error, INVALID, "INVALID_FIELD")
            assert error.detail.startswith(field), error.detail
        assert_refused(await refusal(client.open_orders("DOGE-USDT")), INVALID, "UNKNOWN_SYMBOL")
        assert await _commands_sent(shared_mesh) == sent
        # Well-formed references to orders that do not exist.
        missing = await refusal(client.get_order(order_id=f"s1:{account.user_id}:999"))
        assert_refused(missing, grpc.StatusCode.NOT_FOUND, "ORDER_NOT_FOUND")
        cancel = await client.cancel(client_order_id="never-placed")
        assert not cancel.accepted
        assert cancel.reject_reason == shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_FOUND


async def test_admin_input_checks(
    shared_mesh: FullMesh, admin: AdminClient, account: Account
) -> None:
    async with account.client(shared_mesh.gateway.address) as client:
        before = await account_state(client)
    sent = await _commands_sent(shared_mesh)
    user = account.user_id
    cases = [
        (admin.deposit(user, "DOGE", 5, "t"), "UNKNOWN_ASSET", "asset"),
        (admin.deposit(user, "USDT", 0, "t"), "OUT_OF_RANGE", "amount"),
        (admin.withdraw(user, "USDT", -5, "t"), "OUT_OF_RANGE", "amount"),
        (admin.deposit(user, "USDT", 5, ""), "INVALID_FIELD", "transfer_id"),
        (admin.deposit(user, "USDT", 5, "t" * 65), "INVALID_FIELD", "transfer_id"),
        (admin.deposit(0, "USDT", 5, "t"), "INVALID_FIELD", "user_id"),
        (admin.deposit(1 << 63, "USDT", 5, "t"), "OUT_OF_RANGE", "user_id"),
        (admin.kill_switch(0, enable=True), "INVALID_FIELD", "user_id"),
        (admin.halt_symbol("DOGE-USDT"), "UNKNOWN_SYMBOL", "symbol"),
        (admin.resume_symbol(""), "UNKNOWN_SYMBOL", "symbol"),
        (admin.create_user(tier=9), "INVALID_FIELD", "tier"),
        (
            admin.create_user(risk_limits=shard_pb2.RiskLimits(max_open_orders=-1)),
            "OUT_OF_RANGE",
            "risk_limits.max_open_orders",
        ),
    ]
    for call, reason, field in cases:
        error = await refusal(call)
        assert_refused(error, INVALID, reason)
        assert error.detail.startswith(field), error.detail
    taken = await refusal(admin.create_user(user))
    assert_refused(taken, grpc.StatusCode.ALREADY_EXISTS, "USER_EXISTS")
    assert await _commands_sent(shared_mesh) == sent
    async with account.client(shared_mesh.gateway.address) as client:
        assert await account_state(client) == before


async def test_deposit_to_an_account_that_does_not_exist(admin: AdminClient) -> None:
    ack = await admin.deposit(9_000_000_001, "USDT", 5, "nobody")
    assert not ack.accepted
    assert ack.reject_reason == shard_pb2.SHARD_REJECT_REASON_UNKNOWN_USER


async def test_trade_stream_answers_bad_requests_one_by_one(
    shared_mesh: FullMesh, account: Account
) -> None:
    async with account.client(shared_mesh.gateway.address) as client, client.trade() as stream:
        good = buy(client, "t-good", 1)
        unknown_symbol = buy(client, "t-doge", 1)
        unknown_symbol.symbol = "DOGE-USDT"
        zero = buy(client, "t-zero", 0)
        no_reference = gateway_pb2.CancelOrderRequest(user_id=account.user_id)
        sol = client.place_request("t-sol", SOL, C.SIDE_BUY, price_ticks=15_000, quantity_lots=0)
        answers = await stream.submit([good, unknown_symbol, zero, no_reference, sol])
        kinds = [answer.WhichOneof("response") for answer in answers]
        assert kinds == ["place", "error", "error", "error", "error"]
        assert answers[0].place.accepted
        assert [answer.error.reason for answer in answers[1:]] == [
            gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL,
            gateway_pb2.GATEWAY_ERROR_REASON_OUT_OF_RANGE,
            gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD,
            gateway_pb2.GATEWAY_ERROR_REASON_OUT_OF_RANGE,
        ]
        assert answers[2].error.detail.startswith("quantity_lots")
        # A TradeRequest holding neither a place nor a cancel.
        stream.send(
            gateway_pb2.TradeRequestBatch(requests=[gateway_pb2.TradeRequest(request_id=10**6)])
        )
        (empty,) = await stream.wait([10**6])
        assert empty.error.reason == gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD
        assert empty.error.detail.startswith("request")
    async with account.client(shared_mesh.gateway.address) as client:
        assert [order.client_order_id for order in await client.open_orders()] == ["t-good"]


async def test_an_oversized_trade_batch_ends_the_stream_and_places_nothing(
    shared_mesh: FullMesh, account: Account
) -> None:
    async with account.client(shared_mesh.gateway.address) as client:
        before = await account_state(client)
        sent = await _commands_sent(shared_mesh)
        async with client.trade() as stream:
            requests = [stream.request(buy(client, f"big-{n}", 1)) for n in range(1_001)]
            stream.send(gateway_pb2.TradeRequestBatch(requests=requests))
            error = await stream.ended()
        assert error is not None
        assert_refused(error, INVALID, "BATCH_TOO_LARGE")
        assert stream.answers == {}
        assert await _commands_sent(shared_mesh) == sent
        assert await account_state(client) == before
