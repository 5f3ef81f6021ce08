"""kill -9 of the persister (and of the shard) mid-stream: after restarts, PostgreSQL holds
every ledger row, order and fill of the shard's egress exactly once, flushed balances agree
with the ledger, and the oracle counters stay at zero."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import pytest

from protos.oms.v1 import shard_pb2
from tests.persister.conftest import Mesh
from tests.persister.egress_rows import egress_through, ledger_rows, table_ledger
from tests.persister.order_flow import OrderFlow
from tests.persister.persister_client import PersisterClient, sql
from tests.shard_service.shard_client import ShardClient, deposit, eventually
from tests.shard_service.shard_process import aio_channel

USERS = 12
# Idle users are flushed after 0.8 s, so evictions and hydrations run through the kills.
EVICTING_SHARD = {"OMS_SHARD_IDLE_TTL_MS": "800", "OMS_SHARD_TIMER_MS": "50"}
ORACLES = (
    "duplicate_command_reached_db",
    "duplicate_order_reached_db",
    "duplicate_fill_reached_db",
    "rejected_rows",
    "replayed_rows",
)
SETTLE_S = 30.0
FENCE_USER = 1_000_000


async def _progress(persister_address: str, beyond: int) -> int:
    """Wait until the persister committed past `beyond`; its committed position."""
    async with aio_channel(persister_address) as channel:
        client = PersisterClient(channel)
        counters = await eventually(
            client.counters, lambda c: c["committed_position"] > beyond, timeout_s=SETTLE_S
        )
    return counters["committed_position"]


async def _check_database_against_egress(mesh: Mesh, shard: ShardClient) -> None:
    (fence,) = await shard.run(deposit(FENCE_USER, 1, transfer_id="fence"))
    assert fence.accepted
    # Everyone idle: all users get flushed, so balances hold every user's final state. A
    # FlushComplete is sent only after its commit, and with it everything before it.
    await eventually(shard.status, lambda s: s.resident_users == 0, timeout_s=SETTLE_S)
    status = await shard.status()
    assert status.counters["flushes_refused"] == 0
    async with aio_channel(mesh.persister.address) as channel:
        counters = await PersisterClient(channel).counters()
    assert all(counters[name] == 0 for name in ORACLES), counters
    assert counters["committed_position"] > fence.stamp.position

    egress = await egress_through(
        shard, ["submit", "fill", "ledger"], counters["committed_position"]
    )
    submits = sorted(i.submit.order.order_id for i in egress if i.WhichOneof("egress") == "submit")
    fills = sorted(
        (i.fill.order_id, i.fill.trade_id) for i in egress if i.WhichOneof("egress") == "fill"
    )
    async with sql(mesh.database_url) as connection:
        assert await table_ledger(connection) == ledger_rows(egress)
        orders = await connection.fetch("SELECT order_id, status FROM orders ORDER BY order_id")
        stored_fills = await connection.fetch(
            "SELECT order_id, trade_id FROM fills ORDER BY order_id, trade_id"
        )
        mismatched = await connection.fetch(
            """
            SELECT coalesce(b.user_id, l.user_id) AS user_id, b.total, l.total AS ledger
            FROM balances b
            FULL JOIN (SELECT user_id, asset, sum(amount) AS total FROM ledger
                       WHERE account = 'user' GROUP BY user_id, asset) l
              ON l.user_id = b.user_id AND l.asset = b.asset
            WHERE b.total IS DISTINCT FROM l.total AND coalesce(b.total, l.total) <> 0
            """
        )
    assert [row["order_id"] for row in orders] == submits
    assert {row["status"] for row in orders} <= {4}  # every order of the flow ended FILLED
    assert [tuple(row.values()) for row in stored_fills] == fills
    assert mismatched == []
    assert status.counters["evictions_completed"] >= USERS


@pytest.mark.slow
async def test_kill_9_of_the_persister_mid_stream_loses_and_doubles_nothing(
    start_mesh: Callable[..., Mesh],
) -> None:
    mesh = start_mesh(shard_environment=EVICTING_SHARD)
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        shard = ShardClient(shard_channel)
        persister = PersisterClient(persister_channel)
        users = [(await persister.create_user()).user_id for _ in range(USERS)]
        await persister.create_user(FENCE_USER)
        flow = OrderFlow(shard, users, sequences=itertools.count(1))
        flow.start()
        try:
            committed = 0
            for _ in range(2):
                committed = await _progress(mesh.persister.address, committed + 50)
                before = await shard.status()
                mesh.persister.kill()
                await eventually(shard.status, functools.partial(_moved_on, before=before))
                mesh.persister.start_serving()
            await _progress(mesh.persister.address, committed + 50)
            # A worker whose hydration read died with the persister waits for the shard's
            # re-drive (5 s of consensus time): every user gets a round in before the end,
            # so every one of them is flushed by the final check.
            await eventually(
                functools.partial(_served, flow), lambda n: n == USERS, timeout_s=SETTLE_S
            )
        finally:
            await flow.stop()
        await _check_database_against_egress(mesh, shard)


@pytest.mark.slow
async def test_kill_9_of_the_shard_the_persister_resumes_where_it_was(
    start_mesh: Callable[..., Mesh],
) -> None:
    mesh = start_mesh(shard_environment=EVICTING_SHARD)
    async with aio_channel(mesh.persister.address) as persister_channel:
        persister = PersisterClient(persister_channel)
        users = [(await persister.create_user()).user_id for _ in range(USERS)]
        await persister.create_user(FENCE_USER)
    sequences = itertools.count(1)
    for _ in range(2):
        async with aio_channel(mesh.shard.address) as shard_channel:
            flow = OrderFlow(ShardClient(shard_channel), users, sequences=sequences)
            flow.start()
            try:
                await eventually(functools.partial(_rounds, flow), lambda r: r >= 30)
            finally:
                await flow.stop()
        mesh.shard.kill()
        mesh.shard.start_serving()
    async with aio_channel(mesh.shard.address) as shard_channel:
        await _check_database_against_egress(mesh, ShardClient(shard_channel))
    async with aio_channel(mesh.persister.address) as channel:
        counters = await PersisterClient(channel).counters()
    assert counters["egress_connects"] >= 3 and counters["egress_breaks"] >= 2


async def _rounds(flow: OrderFlow) -> int:
    return flow.rounds


async def _served(flow: OrderFlow) -> int:
    return len(flow.served)


def _moved_on(now: shard_pb2.ShardStatus, *, before: shard_pb2.ShardStatus) -> bool:
    """The shard went on without its persister: more commands, or a hydration waiting."""
    return (
        now.counters["commands_applied"] > before.counters["commands_applied"] + 20
        or now.counters["hydrations_requested"] > before.counters["hydrations_requested"]
        # Every worker may have been parked behind a read the dead persister took with it:
        # the shard asking again (after 5 s of consensus time) is going on too.
        or now.counters["hydrations_redriven"] > before.counters["hydrations_redriven"]
    )
