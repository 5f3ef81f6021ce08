"""Hydration from PostgreSQL through the persister, the negative cache, hydrate-ahead,
and the synchronous API (accounts, credentials, stored reads) with its error reasons."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from protos.oms.v1 import shard_pb2
from tests.persister.conftest import Mesh
from tests.persister.persister_client import PersisterClient, reason_of, sql
from tests.shard_service.shard_client import (
    USDT,
    ShardClient,
    balance,
    deposit,
    eventually,
)
from tests.shard_service.shard_process import aio_channel


@pytest.fixture
async def mesh(start_mesh: Callable[..., Mesh]) -> AsyncIterator[Mesh]:
    yield start_mesh()


@pytest.fixture
async def clients(mesh: Mesh) -> AsyncIterator[tuple[ShardClient, PersisterClient]]:
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        yield ShardClient(shard_channel), PersisterClient(persister_channel)


async def test_a_created_user_hydrates_from_postgresql_on_its_first_command(
    clients: tuple[ShardClient, PersisterClient],
) -> None:
    shard, persister = clients
    limits = shard_pb2.RiskLimits(max_open_orders=7)
    created = await persister.create_user(tier=shard_pb2.USER_TIER_WHALE, limits=limits)
    assert created.user_id > 0 and created.api_key and created.api_secret
    assert not (await shard.actor(created.user_id)).resident

    (funded,) = await shard.run(deposit(created.user_id, 25_000))
    assert funded.accepted, funded

    view = await shard.actor(created.user_id)
    assert view.resident
    assert balance(view, USDT).total == 25_000
    assert view.state.tier == shard_pb2.USER_TIER_WHALE
    assert view.state.risk_limits.max_open_orders == 7
    counters = await persister.counters()
    assert counters["hydrations_answered"] == 1
    assert counters["hydration_users_read"] == 1


async def test_an_unknown_user_is_refused_and_then_answered_from_the_negative_cache(
    clients: tuple[ShardClient, PersisterClient],
) -> None:
    shard, persister = clients
    (first,) = await shard.run(deposit(4_242, 10))
    assert not first.accepted
    assert first.reject_reason == shard_pb2.SHARD_REJECT_REASON_UNKNOWN_USER
    (second,) = await shard.run(deposit(4_242, 10))
    assert second.reject_reason == shard_pb2.SHARD_REJECT_REASON_UNKNOWN_USER

    counters = await persister.counters()
    assert counters["hydration_users_read"] == 1, counters
    assert counters["negative_cache_hits"] == 1, counters
    assert counters["unknown_users_answered"] == 2

    # CreateUser forgets the negative entry at once: the next command finds the user.
    await persister.create_user(4_242)
    (third,) = await shard.run(deposit(4_242, 10))
    assert third.accepted, third


async def test_prefetch_makes_known_users_resident_before_their_first_command(
    clients: tuple[ShardClient, PersisterClient],
) -> None:
    shard, persister = clients
    created = await persister.create_user()
    await persister.prefetch([created.user_id, 987_654])
    view = await eventually(lambda: shard.actor(created.user_id), lambda v: v.resident)
    assert view.state.user_id == created.user_id
    assert (await persister.counters())["prefetch_offers"] == 1
    assert not (await shard.actor(987_654)).resident


async def test_accounts_credentials_and_error_reasons(
    mesh: Mesh, clients: tuple[ShardClient, PersisterClient]
) -> None:
    _, persister = clients
    chosen = await persister.create_user(500)
    assert chosen.user_id == 500
    credential = await persister.credential(chosen.api_key)
    assert credential.user_id == 500 and credential.enabled
    assert credential.api_secret == chosen.api_secret

    with pytest.raises(grpc.aio.AioRpcError) as taken:
        await persister.create_user(500)
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert reason_of(taken.value) == "PERSISTER_ERROR_REASON_USER_EXISTS"

    # Assigned ids never collide with chosen ones.
    async with sql(mesh.database_url) as connection:
        await connection.execute("SELECT setval('user_ids', 499)")
    assigned = await persister.create_user()
    assert assigned.user_id == 501

    with pytest.raises(grpc.aio.AioRpcError) as unknown_key:
        await persister.credential("ak_nobody")
    assert unknown_key.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason_of(unknown_key.value) == "PERSISTER_ERROR_REASON_UNKNOWN_KEY"

    with pytest.raises(grpc.aio.AioRpcError) as unknown_order:
        await persister.stored_order("s1:500:1")
    assert reason_of(unknown_order.value) == "PERSISTER_ERROR_REASON_UNKNOWN_ORDER"

    with pytest.raises(grpc.aio.AioRpcError) as bad_tier:
        await persister.create_user(tier=9)
    assert bad_tier.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(bad_tier.value) == "PERSISTER_ERROR_REASON_INVALID_FIELD"
    with pytest.raises(grpc.aio.AioRpcError) as bad_limit:
        await persister.create_user(limits=shard_pb2.RiskLimits(max_open_orders=-1))
    assert bad_limit.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(bad_limit.value) == "PERSISTER_ERROR_REASON_INVALID_FIELD"
    with pytest.raises(grpc.aio.AioRpcError) as too_big:
        await persister.create_user(1 << 63)
    assert too_big.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(too_big.value) == "PERSISTER_ERROR_REASON_INVALID_FIELD"

    stored = await persister.stored_user(500)
    assert stored.known and stored.state.user_id == 500 and stored.state.db_version == 0
    assert not (await persister.stored_user(77_777)).known
    async with sql(mesh.database_url) as connection:
        users = await connection.fetchval("SELECT count(*) FROM users")
        keys = await connection.fetchval("SELECT count(*) FROM api_keys")
    assert (users, keys) == (2, 2)  # refused calls changed nothing
