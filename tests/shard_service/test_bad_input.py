"""Bad input over the wire: undecodable bytes, empty commands, static and funds refusals."""

from __future__ import annotations

from protos.oms.v1 import shard_pb2
from tests.shard_service.shard_client import (
    USDT,
    ShardClient,
    deposit,
    hydrate,
    limit_order,
    next_correlation,
    unpositioned,
)

R = shard_pb2


async def test_garbage_bytes_get_malformed_and_the_stream_stays_usable(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user = users[0]
    await shard.run(hydrate(user), deposit(user, 1_000))
    before = await shard.status()
    async with shard.execute() as stream:
        stream.send_raw(b"\xff\xff\xff\xff not a protobuf")
        # An undecodable batch has no correlation ids to echo: one MALFORMED result with 0.
        malformed = await stream.wait_final(0)
        assert not malformed.accepted
        assert malformed.reject_reason == R.SHARD_REJECT_REASON_MALFORMED
        assert malformed.stamp.position > 0
        # A decodable batch holding a command with nothing set: MALFORMED, its own id.
        empty = shard_pb2.ShardCommand(correlation_id=next_correlation())
        stream.send(empty)
        refused = await stream.wait_final(empty.correlation_id)
        assert refused.reject_reason == R.SHARD_REJECT_REASON_MALFORMED
        # The same stream still serves valid commands.
        (funded,) = await stream.run(deposit(user, 5))
        assert funded.accepted, funded
        assert stream.error is None
    after = await shard.status()
    assert after.counters["malformed_commands"] == before.counters["malformed_commands"] + 2


async def test_refusals_have_specific_reasons_and_change_nothing(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user = users[0]
    await shard.run(hydrate(user), deposit(user, 1_000_000))
    before = unpositioned(await shard.actor(user))
    unknown_symbol = limit_order(
        user, "b-1", price_ticks=6_500_000, quantity_lots=1, symbol="DOGE-USDT"
    )
    zero_quantity = limit_order(user, "b-2", price_ticks=6_500_000, quantity_lots=0)
    zero_price = limit_order(user, "b-3", price_ticks=0, quantity_lots=1)
    too_big = limit_order(user, "b-4", price_ticks=6_500_000, quantity_lots=1)  # 6.5 USDT
    no_amount = deposit(user, 0)
    results = await shard.run(unknown_symbol, zero_quantity, zero_price, too_big, no_amount)
    assert [(r.accepted, r.reject_reason, r.retryable) for r in results] == [
        (False, R.SHARD_REJECT_REASON_UNKNOWN_SYMBOL, False),
        (False, R.SHARD_REJECT_REASON_INVALID_QUANTITY, False),
        (False, R.SHARD_REJECT_REASON_INVALID_PRICE, False),
        (False, R.SHARD_REJECT_REASON_INSUFFICIENT_FUNDS, False),
        (False, R.SHARD_REJECT_REASON_INVALID_AMOUNT, False),
    ]
    assert unpositioned(await shard.actor(user)) == before
    # The refused client order id is not burnt: the same id is accepted once funded.
    (funded,) = await shard.run(deposit(user, 10_000_000, asset=USDT))
    (placed,) = await shard.run(limit_order(user, "b-4", price_ticks=6_500_000, quantity_lots=1))
    assert funded.accepted and placed.accepted, placed
    assert placed.order_id == f"s1:{user}:1"
