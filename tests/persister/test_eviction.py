"""The cold path through PostgreSQL: an idle, flat user is flushed (version-checked CAS),
leaves memory on FlushComplete, and hydrates back into exactly the state it had; a stale
flush is refused, reported back and never written."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from protos.oms.v1 import shard_pb2
from tests.persister.conftest import Mesh
from tests.persister.persister_client import PersisterClient, sql
from tests.shard_service.shard_client import (
    ShardClient,
    accepted_event,
    deposit,
    eventually,
    fill_event,
    limit_order,
    matcher_events,
)
from tests.shard_service.shard_process import aio_channel

PRICE = 6_500_000
# Idle users are flushed after 1.5 s of consensus time; sweeps run every 50 ms.
EVICTING_SHARD = {"OMS_SHARD_IDLE_TTL_MS": "1500", "OMS_SHARD_TIMER_MS": "50"}
# Evictions take the TTL plus a sweep and a flush: generous on a busy machine.
EVICTION_WAIT_S = 30.0


@pytest.fixture
async def clients(
    start_mesh: Callable[..., Mesh],
) -> AsyncIterator[tuple[Mesh, ShardClient, PersisterClient]]:
    mesh = start_mesh(shard_environment=EVICTING_SHARD)
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        yield mesh, ShardClient(shard_channel), PersisterClient(persister_channel)


def _comparable(state: shard_pb2.UserState) -> shard_pb2.UserState:
    """The state with its dedup entries in one order (hydration sorts them by age)."""
    copy = shard_pb2.UserState()
    copy.CopyFrom(state)
    recent = sorted(copy.recent, key=lambda r: (r.accepted_at_ms, r.client_order_id))
    del copy.recent[:]
    copy.recent.extend(recent)
    return copy


async def _begin_dehydrate(shard: ShardClient, user_id: int) -> shard_pb2.BeginDehydrate:
    items = await shard.egress(
        ["begin_dehydrate"],
        until=lambda got: any(i.begin_dehydrate.user_id == user_id for i in got),
        timeout_s=EVICTION_WAIT_S,
    )
    return next(i.begin_dehydrate for i in items if i.begin_dehydrate.user_id == user_id)


async def test_an_evicted_user_is_flushed_and_hydrates_back_to_the_same_state(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    mesh, shard, persister = clients
    user = (await persister.create_user()).user_id
    (funded,) = await shard.run(deposit(user, 10_000_000_000))
    assert funded.accepted
    (placed,) = await shard.run(limit_order(user, "c-1", price_ticks=PRICE, quantity_lots=2))
    assert placed.accepted
    accepted = accepted_event(1, placed.order_id, user)
    fill = fill_event(
        2, placed.order_id, user, price_ticks=PRICE, quantity_lots=2, remaining_lots=0, trade_id=77
    )
    await shard.run(matcher_events([accepted, fill]))

    begin = await _begin_dehydrate(shard, user)
    await eventually(
        lambda: shard.actor(user), lambda view: not view.resident, timeout_s=EVICTION_WAIT_S
    )
    assert begin.state.positions and begin.state.recent and begin.state.user_seq == 1

    async with sql(mesh.database_url) as connection:
        row = await connection.fetchrow(
            "SELECT version, flush_epoch, flushed_by FROM users WHERE user_id = $1", user
        )
        balances = await connection.fetch(
            "SELECT asset, total FROM balances WHERE user_id = $1", user
        )
    assert (row["version"], row["flush_epoch"], row["flushed_by"]) == (1, begin.epoch, "s1")
    assert {r["asset"]: r["total"] for r in balances} == {
        b.asset: b.total for b in begin.state.balances
    }
    expected = _comparable(begin.state)
    expected.db_version = 1
    stored = await persister.stored_user(user)
    assert _comparable(stored.state) == expected
    counters = await persister.counters()
    assert counters["flushes_completed"] == 1 and counters["flushes_refused"] == 0

    await persister.prefetch([user])
    view = await eventually(lambda: shard.actor(user), lambda v: v.resident)
    assert _comparable(view.state) == expected
    status = await shard.status()
    assert status.counters["evictions_completed"] >= 1
    assert status.counters["flushes_refused"] == 0


async def test_a_stale_flush_is_refused_reported_and_never_written(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    mesh, shard, persister = clients
    user = (await persister.create_user()).user_id
    (funded,) = await shard.run(deposit(user, 5_000))
    assert funded.accepted
    # Another writer moved the row on while the user was resident here.
    async with sql(mesh.database_url) as connection:
        await connection.execute("UPDATE users SET version = 5 WHERE user_id = $1", user)
        state_before = await connection.fetchval("SELECT state FROM users WHERE user_id = $1", user)

    await eventually(
        persister.counters, lambda c: c["flushes_refused"] >= 1, timeout_s=EVICTION_WAIT_S
    )
    status = await eventually(
        shard.status, lambda s: s.counters["flushes_refused"] >= 1, timeout_s=EVICTION_WAIT_S
    )
    assert status.counters["evictions_completed"] == 0
    view = await shard.actor(user)
    assert view.resident and view.state.db_version == 0
    assert any(b.asset == "USDT" and b.total == 5_000 for b in view.state.balances)
    async with sql(mesh.database_url) as connection:
        row = await connection.fetchrow(
            "SELECT version, state, flush_epoch FROM users WHERE user_id = $1", user
        )
        balances = await connection.fetchval(
            "SELECT count(*) FROM balances WHERE user_id = $1", user
        )
    assert (row["version"], row["state"], row["flush_epoch"], balances) == (5, state_before, 0, 0)
    assert (await persister.counters())["flushes_completed"] == 0


async def test_flush_answers_are_sent_again_after_a_reconnect(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    mesh, shard, persister = clients
    user = (await persister.create_user()).user_id
    (funded,) = await shard.run(deposit(user, 1_000, asset="USDT"))
    assert funded.accepted
    await eventually(
        lambda: shard.actor(user), lambda view: not view.resident, timeout_s=EVICTION_WAIT_S
    )
    mesh.persister.kill()
    mesh.persister.start_serving()
    async with aio_channel(mesh.persister.address) as channel:
        restarted = PersisterClient(channel)
        counters = await eventually(restarted.counters, lambda c: c["egress_connects"] >= 1)
        assert counters["flush_answers_resent"] == 1
        # The shard had applied the answer already: a stale one, dropped.
        await eventually(shard.status, lambda s: s.counters["flushes_stale"] >= 1)
        assert not (await shard.actor(user)).resident
