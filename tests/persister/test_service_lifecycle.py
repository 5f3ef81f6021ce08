"""The persister as a service: health, a graceful stop that commits what it holds, and one
persister per shard (a second one waits for the shard's lock instead of writing too)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from grpc_health.v1 import health_pb2

from tests.persister.conftest import Mesh
from tests.persister.persister_client import PersisterClient, sql
from tests.persister.persister_process import PersisterProcess
from tests.service_process import POLL_INTERVAL_S
from tests.shard_service.shard_client import ShardClient, deposit
from tests.shard_service.shard_process import aio_channel

WAIT_S = 20.0


def _wait_for_log(process: PersisterProcess, event: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while event not in process.log_path.read_text(errors="replace"):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{event} not logged within {WAIT_S:g} s\n{process.log_tail()}")
        time.sleep(POLL_INTERVAL_S)


async def test_sigterm_commits_what_is_complete_and_exits_cleanly(
    start_mesh: Callable[..., Mesh],
) -> None:
    mesh = start_mesh(persister_environment={"OMS_PERSISTER_WRITE_INTERVAL_MS": "200"})
    assert mesh.persister.health() == health_pb2.HealthCheckResponse.SERVING
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        persister = PersisterClient(persister_channel)
        user = (await persister.create_user()).user_id
        results = await ShardClient(shard_channel).run(*(deposit(user, 10 + n) for n in range(20)))
        # Held: received from the shard (the feed is paced to the write interval, so
        # within one), not yet written (the interval is long).
        last = results[-1].stamp.position
        deadline = time.monotonic() + WAIT_S
        while (await persister.counters())["complete_position"] < last:
            assert time.monotonic() < deadline, "the persister never received the deposits"
            await asyncio.sleep(POLL_INTERVAL_S)
    assert all(result.accepted for result in results)
    assert mesh.persister.terminate() == 0
    async with sql(mesh.database_url) as connection:
        rows = await connection.fetchval("SELECT count(*) FROM ledger WHERE user_id = $1", user)
        cursor = await connection.fetchval("SELECT position FROM persister_cursor")
    assert rows == 20
    assert cursor >= results[-1].stamp.position


async def test_a_second_persister_of_the_same_shard_waits_for_the_first(
    start_mesh: Callable[..., Mesh], tmp_path: Path
) -> None:
    mesh = start_mesh()
    second = PersisterProcess(
        tmp_path / "second-persister",
        shard_address=mesh.shard.address,
        database_url=mesh.database_url,
    )
    standby = PersisterProcess(
        tmp_path / "standby-persister",
        shard_address=mesh.shard.address,
        database_url=mesh.database_url,
    )
    try:
        second.start()
        _wait_for_log(second, "persister.shard_lock_busy")
        assert mesh.persister.terminate() == 0
        second.wait_serving()
        _wait_for_log(second, "persister.shard_lock_held")
        # A standby asked to stop while it waits for the lock stops at once, cleanly.
        standby.start()
        _wait_for_log(standby, "persister.shard_lock_busy")
        assert standby.terminate() == 0
        _wait_for_log(standby, "persister.stopped_before_serving")
    finally:
        second.stop()
        standby.stop()
