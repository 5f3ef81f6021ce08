"""Bad input over the wire: each bad order gets its specific reject reason and changes
nothing but its own Rejected event; bytes that are no command batch fail the Execute
stream with INVALID_ARGUMENT and change nothing at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.event_replay import kind
from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    ETH,
    OPEN,
    REFERENCE_TICKS,
    REJECTED,
    SELL,
    OrderFactory,
    halt,
    resume,
    submits,
)
from tests.matcher_service.matcher_process import SERVICE_NAME

REFERENCE = REFERENCE_TICKS[BTC]
Reason: TypeAlias = matcher_pb2.MatcherRejectReason.ValueType
OrderChange = Callable[[matcher_pb2.Order], None]


def _set(**fields: object) -> OrderChange:
    def change(order: matcher_pb2.Order) -> None:
        for name, value in fields.items():
            setattr(order, name, value)

    return change


BAD_ORDERS: list[tuple[str, OrderChange, Reason]] = [
    ("unknown symbol", _set(symbol="DOGE-USDT"), matcher_pb2.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL),
    (
        "symbol of another group",
        _set(symbol="SOL-USDT"),
        matcher_pb2.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL,
    ),
    (
        "negative price",
        _set(price_ticks=-REFERENCE),
        matcher_pb2.MATCHER_REJECT_REASON_PRICE_OFF_TICK,
    ),
    ("zero quantity", _set(quantity_lots=0), matcher_pb2.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT),
    (
        "negative quantity",
        _set(quantity_lots=-3),
        matcher_pb2.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT,
    ),
    (
        "below min notional",  # one ETH-USDT lot at its reference: 350,000 < 1,000,000
        _set(symbol=ETH, price_ticks=REFERENCE_TICKS[ETH], quantity_lots=1),
        matcher_pb2.MATCHER_REJECT_REASON_BELOW_MIN_NOTIONAL,
    ),
    (
        "above the band",
        _set(price_ticks=REFERENCE * 111 // 100),
        matcher_pb2.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND,
    ),
    (
        "below the band",
        _set(price_ticks=REFERENCE * 89 // 100),
        matcher_pb2.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND,
    ),
    ("no time in force", _set(time_in_force=0), matcher_pb2.MATCHER_REJECT_REASON_INVALID_ORDER),
]


@pytest.mark.parametrize(
    ("change", "reason"),
    [(change, reason) for _, change, reason in BAD_ORDERS],
    ids=[name for name, _, _ in BAD_ORDERS],
)
async def test_a_bad_order_gets_its_reject_reason_and_changes_nothing_else(
    matcher: MatcherClient,
    orders: OrderFactory,
    users: tuple[int, ...],
    change: OrderChange,
    reason: Reason,
) -> None:
    user_id = users[0]
    await matcher.submit(orders.limit(user_id, BUY, REFERENCE - 2, 2))
    before = await matcher.open_orders(orders.shard, user_id)
    bad = orders.limit(user_id, SELL, REFERENCE - 2, 2)  # would cross the resting buy
    change(bad)

    (result,) = await matcher.submit(bad)

    assert (result.reject_reason, result.duplicate, result.not_found) == (reason, False, False)
    assert result.order.status == REJECTED
    assert result.order.order == bad
    events = await matcher.events_before_fence(orders, users[-1], before.as_of_sequence)
    assert [(e.order_id, kind(e)) for e in events] == [(bad.order_id, "rejected")]
    assert events[0].rejected.reason == reason
    assert events[0].rejected.order == bad
    after = await matcher.open_orders(orders.shard, user_id)
    assert list(after.orders) == list(before.orders)
    state = await matcher.get_order(bad.order_id)
    assert state is not None and state.status == REJECTED


async def test_a_malformed_order_id_is_answered_but_recorded_nowhere(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    good = orders.limit(users[0], BUY, REFERENCE - 2, 2)
    malformed = [
        _set(order_id=f"{orders.shard}:{users[1]}:1"),  # someone else's user id
        _set(order_id=f"{orders.shard}:{users[0]}:01"),  # a second spelling of seq 1
        _set(order_id="no-colons"),
    ]
    bad_orders = []
    for change in malformed:
        bad = matcher_pb2.Order()
        bad.CopyFrom(good)
        change(bad)
        bad_orders.append(bad)

    results = await matcher.submit(*bad_orders)

    invalid_id = matcher_pb2.MATCHER_REJECT_REASON_INVALID_ORDER_ID
    assert [result.reject_reason for result in results] == [invalid_id] * len(bad_orders)
    assert await matcher.events_before_fence(orders, users[-1], 0) == []
    for bad in bad_orders:
        assert await matcher.get_order(bad.order_id) is None
    (accepted,) = await matcher.submit(good)  # its id was not taken by the malformed ones
    assert not accepted.duplicate and accepted.order.status == OPEN


async def test_a_halted_symbol_rejects_orders_until_resumed(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    resting = orders.limit(users[0], BUY, REFERENCE - 4, 2)
    await matcher.submit(resting)
    before = await matcher.open_orders(orders.shard, users[0])
    try:
        (halted,) = await matcher.run(halt(BTC))
        assert (halted.reject_reason, halted.not_found) == (0, False)
        refused = orders.limit(users[0], SELL, REFERENCE + 4, 1)
        eth = orders.limit(users[1], SELL, REFERENCE_TICKS[ETH], 3, symbol=ETH)
        refused_result, eth_result = await matcher.submit(refused, eth)
        assert refused_result.reject_reason == matcher_pb2.MATCHER_REJECT_REASON_SYMBOL_HALTED
        assert (eth_result.reject_reason, eth_result.order.status) == (0, OPEN)
        assert list((await matcher.open_orders(orders.shard, users[0])).orders) == list(
            before.orders
        )
    finally:
        await matcher.run(resume(BTC))
    after_resume = orders.limit(users[0], SELL, REFERENCE + 4, 1)
    (result,) = await matcher.submit(after_resume)
    assert (result.reject_reason, result.order.status) == (0, OPEN)

    events = await matcher.events_before_fence(orders, users[-1], before.as_of_sequence)
    assert [(e.order_id, kind(e)) for e in events] == [
        (refused.order_id, "rejected"),
        (eth.order_id, "accepted"),
        (after_resume.order_id, "accepted"),
    ]


def raw_execute(matcher: MatcherClient) -> grpc.aio.StreamStreamMultiCallable:
    """Execute with identity serializers: whatever bytes the test hands over go on the wire."""
    return matcher.channel.stream_stream(
        "/oms.v1.Matcher/Execute", request_serializer=None, response_deserializer=None
    )


TOO_MANY_COMMANDS = matcher_pb2.MatcherCommandBatch(
    commands=[matcher_pb2.MatcherCommand(correlation_id=k + 1) for k in range(10_001)]
).SerializeToString()

UNACCEPTABLE_BYTES = [
    ("garbage", b"\xff\xff\xff\x07 not protobuf"),
    ("truncated", submits(OrderFactory("x").limit(1, BUY, REFERENCE, 1)).SerializeToString()[:-3]),
    ("over the command limit", TOO_MANY_COMMANDS),
    ("over the log entry size cap", b"\n\x00" * (3 * 1024 * 1024)),
]


@pytest.mark.parametrize(
    "payload",
    [payload for _, payload in UNACCEPTABLE_BYTES],
    ids=[n for n, _ in UNACCEPTABLE_BYTES],
)
async def test_bytes_that_are_no_command_batch_fail_execute_with_invalid_argument(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...], payload: bytes
) -> None:
    good = orders.limit(users[0], BUY, REFERENCE - 2, 2)
    call = raw_execute(matcher)(iter([submits(good).SerializeToString(), payload]))

    answers: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for answer in call:
            answers.append(answer)

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    (results,) = [matcher_pb2.MatcherResultBatch.FromString(answer) for answer in answers]
    assert results.results[0].order.status == OPEN  # the batch before the bad bytes stands
    events = await matcher.events_before_fence(orders, users[-1], 0)
    assert [(e.order_id, kind(e)) for e in events] == [(good.order_id, "accepted")]
    health = health_pb2_grpc.HealthStub(matcher.channel)
    response = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert response.status == health_pb2.HealthCheckResponse.SERVING
