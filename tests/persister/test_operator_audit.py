"""An operator's commands leave their audit rows in PostgreSQL, at their log place, once.

The shard decides each control at a log position and leaves an OperatorAudit egress
item; the persister writes it behind the shard with the cursor. Replaying the
positions (the cursor set back while the persister was down) writes nothing twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from protos.oms.v1 import shard_pb2
from tests.persister.conftest import Mesh
from tests.persister.persister_client import PersisterClient, sql
from tests.shard_service.shard_client import ShardClient, deposit, eventually
from tests.shard_service.shard_process import aio_channel

AUDIT = (
    "SELECT (extract(epoch FROM at) * 1000)::bigint AS at_ms, actor, action, user_id, detail, "
    "shard_id, position, item_index, accepted, reject_reason, note FROM admin_audit "
    "WHERE shard_id IS NOT NULL ORDER BY position, item_index"
)


def _control(user_id: int, action: int, note: str) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.user_control.user_id = user_id
    command.user_control.action = action  # type: ignore[assignment]
    command.user_control.operator = "ops-key"
    command.user_control.note = note
    return command


def _limits(user_id: int, max_open_orders: int) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.set_risk_limits.user_id = user_id
    command.set_risk_limits.limits.max_open_orders = max_open_orders
    command.set_risk_limits.operator = "ops-key"
    return command


async def _committed(persister_address: str, position: int) -> dict[str, int]:
    async with aio_channel(persister_address) as channel:
        client = PersisterClient(channel)
        return await eventually(client.counters, lambda c: c["committed_position"] >= position)


async def test_audit_rows_land_at_their_log_place_once_even_when_replayed(
    start_mesh: Callable[..., Mesh],
) -> None:
    mesh = start_mesh()
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        shard = ShardClient(shard_channel)
        user = (await PersisterClient(persister_channel).create_user()).user_id
        (funded,) = await shard.run(deposit(user, 1_000))
        assert funded.accepted
        # Two controls in one batch (one log position), then a restart (the user is flat).
        halt, limits = await shard.run(
            _control(user, shard_pb2.USER_CONTROL_ACTION_HALT_TRADING, "hold"),
            _limits(user, 2),
        )
        (restart,) = await shard.run(
            _control(user, shard_pb2.USER_CONTROL_ACTION_RESTART, "rebuild")
        )
        assert halt.accepted and limits.accepted and restart.accepted
        await _committed(mesh.persister.address, restart.stamp.position)
        async with sql(mesh.database_url) as connection:
            rows = [dict(row) for row in await connection.fetch(AUDIT)]
        assert [(r["action"], r["position"], r["item_index"]) for r in rows] == [
            ("halt_trading", halt.stamp.position, 0),
            ("set_risk_limits", limits.stamp.position, 1),
            ("restart", restart.stamp.position, 0),
        ]
        assert halt.stamp.position == limits.stamp.position  # one batch, one position
        first = rows[0]
        assert (first["actor"], first["user_id"], first["shard_id"], first["note"]) == (
            "ops-key",
            user,
            "s1",
            "hold",
        )
        assert first["at_ms"] == halt.stamp.consensus_time_ms  # when the shard decided
        assert json.loads(first["detail"])["trading_halted"] is True
        assert all(r["accepted"] and r["reject_reason"] == "" for r in rows)

        # Replay every position: the persister down, its cursor set back to the start.
        mesh.persister.kill()
        async with sql(mesh.database_url) as connection:
            await connection.execute("UPDATE persister_cursor SET position = 0")
        mesh.persister.start_serving()
        counters = await _committed(mesh.persister.address, restart.stamp.position)
        assert counters["replayed_rows"] >= len(rows)
        async with sql(mesh.database_url) as connection:
            again = [dict(row) for row in await connection.fetch(AUDIT)]
        assert again == rows
