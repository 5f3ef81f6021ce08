"""The benchmark's floor moves the same money as the shard, so its rate is a fair bound."""

from __future__ import annotations

from services.bench.shard_bench import (
    RESIDENT_BALANCES,
    SHARD_ID,
    START_MS,
    SYMBOL,
    WorkloadBuilder,
    batches,
    bench_settings,
    resident_states,
)
from services.bench.shard_floor import ShardFloor, floor_seconds
from services.shard.core.shard_machine import ShardMachine

USERS = 300
ORDERS = 5_000


def test_floor_ends_with_the_shards_balances_and_conserves_money() -> None:
    shard = ShardMachine(bench_settings(USERS))
    shard.bulk_hydrate(resident_states(1, USERS), START_MS)
    for index, group in enumerate(batches(WorkloadBuilder(USERS, 11).build(ORDERS).commands, 100)):
        shard.apply_commands(group, START_MS + 1 + index)

    floor = ShardFloor(SHARD_ID, SYMBOL)
    floor.add_users(1, USERS, RESIDENT_BALANCES)
    before = floor.totals()
    groups = batches(WorkloadBuilder(USERS, 11).build(ORDERS).commands, 100)
    floor_seconds(floor, groups, START_MS + 1)

    assert not floor.orders
    assert floor.totals() == before
    for user_id in range(1, USERS + 1):
        actor = shard.actor(user_id)
        assert actor is not None
        floor_actor = floor.actors[user_id]
        assert floor_actor.balances == dict(actor.balances), user_id
        assert not any(floor_actor.reserved.values())
    assert sum(floor.fees.values()) > 0
