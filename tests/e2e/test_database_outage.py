"""Authentication through the loss of PostgreSQL and the persister.

The gateway learns API keys from the persister, which reads them from PostgreSQL.
Its cache once dropped a key when the key's TTL ran out and asked again, so every
user was refused (UNAVAILABLE) within a TTL of the database going away, although
nothing on the trading path needs the database. Now a known key is checked again in
the background and keeps working while the check cannot be answered; a key never seen
waits for the database; a key disabled in the database is refused once the persister
can say so, within a TTL.

The mesh here has a PostgreSQL server of its own, so the test can take it away: it
is frozen (SIGSTOP on the server and every backend: it accepts nothing and answers
nothing, the way a hung or partitioned database behaves) while the persister is
SIGKILLed, then thawed. It is not stopped and started again: starting it forks the
server from this process, whose gRPC threads are busy with the load then, and a
full suite once saw that child die of SIGSEGV with nothing in PostgreSQL's log (the
suspect, not proved: it forks, rather than vforks, to change user, and gRPC's fork
handlers are skipped while other threads are inside gRPC).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from gateway.client import GatewayCallError
from protos.oms.v1 import common_pb2, gateway_pb2
from services.infra.embedded_postgres import EmbeddedPostgres
from tests.e2e.gateway_load import GatewayOrderLoad, load_accounts
from tests.e2e.test_faults import check_after_fault
from tests.full_mesh import FullMesh, gateway_counters
from tests.gateway.accounts import Account, open_account
from tests.server_folders import server_reachable_folder

TTL_MS = 1_000
OUTAGE_S = 4 * TTL_MS / 1000  # every key's TTL runs out several times while it lasts
DURING_OUTAGE = 300  # orders acknowledged while PostgreSQL and the persister are gone
WAIT_S = 60.0


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    with (
        server_reachable_folder("oms-outage-postgres-") as data_dir,
        EmbeddedPostgres(data_dir, fast_unsafe=True) as postgres,
    ):
        yield postgres


@pytest.fixture
async def mesh(
    own_postgres: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FullMesh]:
    mesh = FullMesh.create(
        tmp_path_factory.mktemp("outage-mesh"),
        own_postgres.url,
        gateway_environment={
            "OMS_GATEWAY_CREDENTIAL_TTL_MS": str(TTL_MS),
            "OMS_GATEWAY_CREDENTIAL_RETRY_MS": "200",
        },
    )
    await asyncio.to_thread(mesh.start)
    try:
        yield mesh
    finally:
        mesh.stop()


def freeze(postgres: EmbeddedPostgres) -> list[int]:
    """SIGSTOP the server and its backends; the pids stopped."""
    assert postgres.pid is not None
    stopped = [postgres.pid, *children(postgres.pid)]
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return stopped


def thaw(stopped: list[int]) -> None:
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


async def place_one(mesh: FullMesh, account: Account, client_order_id: str) -> gateway_pb2.OrderAck:
    async with account.client(mesh.gateway.address, timeout_s=5.0) as client:
        request = client.place_request(
            client_order_id, "BTC-USDT", common_pb2.SIDE_BUY, price_ticks=6_400_000, quantity_lots=1
        )
        ack: gateway_pb2.OrderAck = await client.place_order(request)
        return ack


async def test_known_keys_trade_through_a_database_outage_and_a_revocation_wins_after(
    own_postgres: EmbeddedPostgres, mesh: FullMesh
) -> None:
    async with mesh.admin() as admin:
        accounts = await load_accounts(admin, 6)
        newcomer = await open_account(admin, {"USDT": 10**12})  # its key is never used before
    load = GatewayOrderLoad(mesh.gateway.address, accounts, seed=17, workers=4, pause_s=0.002)
    running = asyncio.create_task(load.run())
    frozen: list[int] = []
    try:
        await load.wait_accepted(200)
        before = len(load.acknowledged)
        failures_before = sum(load.failures.values())

        mesh.persister.kill()
        frozen = freeze(own_postgres)
        outage_began = time.monotonic()
        # Trading goes on: nothing on its path reads the database, keys included.
        await load.wait_accepted(before + DURING_OUTAGE, timeout_s=WAIT_S)
        while time.monotonic() - outage_began < OUTAGE_S:
            await load.wait_accepted(len(load.acknowledged) + 20, timeout_s=WAIT_S)
        during = len(load.acknowledged) - before
        elapsed_s = time.monotonic() - outage_began
        print(f"outage: {during} orders acknowledged in {elapsed_s:.1f} s")  # shown with -s
        assert sum(load.failures.values()) == failures_before, dict(load.failures)
        counters = await gateway_counters(mesh.gateway.address)
        assert counters["credential_refresh_failures"] > 0, counters
        assert counters["credential_stale_hits"] > 0, counters
        # A key the gateway never saw waits for the database.
        with pytest.raises(GatewayCallError) as unknown:
            await place_one(mesh, newcomer, "newcomer-during-outage")
        assert unknown.value.reason == "GATEWAY_ERROR_REASON_UNAVAILABLE", unknown.value

        thaw(frozen)
        frozen = []
        await asyncio.to_thread(mesh.persister.start_serving)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                ack = await place_one(mesh, newcomer, "newcomer-after-outage")
                break
            except GatewayCallError as error:
                assert error.reason == "GATEWAY_ERROR_REASON_UNAVAILABLE", error
                assert time.monotonic() < deadline, "the newcomer's key never worked"
                await asyncio.sleep(0.1)
        assert ack.accepted, ack
        await load.wait_accepted(len(load.acknowledged) + 100, timeout_s=WAIT_S)
    finally:
        thaw(frozen)
        load.stop.set()
        await running
    await check_after_fault(mesh, load)

    # Revoked in the database: refused within a TTL and one persister answer.
    revoked = accounts[0]
    connection = await asyncpg.connect(mesh.database_url)
    try:
        await connection.execute(
            "UPDATE api_keys SET enabled = false WHERE user_id = $1", revoked.user_id
        )
    finally:
        await connection.close()
    revoked_at = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            await place_one(mesh, revoked, f"revoked-{attempt}")
        except GatewayCallError as error:
            assert error.reason == "GATEWAY_ERROR_REASON_UNKNOWN_KEY", error
            break
        assert time.monotonic() - revoked_at < TTL_MS / 1000 + 5.0, "the revoked key still works"
        await asyncio.sleep(0.05)
    still = await place_one(mesh, accounts[1], "still-trading")
    assert still.accepted, still
