"""SIGKILL of each service of the whole mesh under a running trading load through the gateway.

Each test starts its own mesh, runs the load (tests/e2e/gateway_load.py: several users,
orders and cancels, every failed call retried with the same client order id), kills
one process mid-load, keeps the load going while it is gone, restarts it, and lets the
load run on. Then, from outside: the mesh's invariants (tests/e2e/invariants.py) with
every acknowledged order, and every acknowledged order existing exactly once in the
shard, PostgreSQL and its matcher (tests/e2e/exactly_once.py); then every user's kill
switch, and the independent auditor (tests/e2e/independent_audit.py) on the flat mesh;
plus what each fault specifically promises.

Partial-mesh versions of these faults, not repeated here: tests/bridge/test_faults.py
(bridge, matcher and shard kills with the load sent to the shard directly),
tests/persister/test_crash_recovery.py (persister and shard kills against the shard's
egress); and on this same full mesh but without these checks, tests/gateway/test_faults.py
(a 1,000-order Trade stream in flight at a gateway kill, retried: exactly once; the shard
unreachable behind a gateway).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest

from gateway.client import OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2
from tests.bridge.bridge_process import service_status
from tests.e2e.exactly_once import check_orders_exactly_once
from tests.e2e.gateway_load import (
    GatewayOrderLoad,
    PlacedOrder,
    TradeBurst,
    load_accounts,
    run_load_until,
)
from tests.e2e.independent_audit import audit_from_outside, cancel_everything
from tests.e2e.invariants import check_full_mesh
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, Account, eventually, open_account
from tests.persister.egress_rows import egress_through, ledger_rows, table_ledger
from tests.persister.persister_client import PersisterClient
from tests.service_process import ServiceProcess, aio_channel
from tests.shard_service.shard_client import ShardClient

pytestmark = pytest.mark.slow
NewMesh = Callable[..., Awaitable[FullMesh]]
LOAD_USERS = 4
BEFORE_FAULT = 120  # orders acknowledged before the kill
DURING_FAULT = 40  # ... while the process is gone (when the mesh can still take orders)
AFTER_FAULT = 120  # ... after it is back
SETTLE_S = 30.0
BURST_ORDERS = 600
MAX_KILLS = 4
# A burst's orders reach the shard as many small batches, so the kill finds some of its
# log records durable and their answers not yet sent. (The gateway's default holds the
# orders that arrive while a batch is unanswered: a burst becomes one or two batches,
# all answered before the kill, and no answer is ever lost to it.)
BURST_GATEWAY = {"OMS_GATEWAY_SHARD_UNANSWERED_BATCHES": "0"}
COLOCATED_KILL_ROUNDS = 3


def resting_bids(client: OmsClient, round_number: int) -> list[gateway_pb2.PlaceOrderRequest]:
    """One-lot BTC-USDT bids below every ask of the load: they rest."""
    return [
        client.place_request(
            f"burst-{round_number}-{n}",
            BTC,
            common_pb2.SIDE_BUY,
            price_ticks=6_000_000,
            quantity_lots=1,
        )
        for n in range(BURST_ORDERS)
    ]


async def loaded_mesh(
    new_mesh: NewMesh, seed: int, **options: Any
) -> tuple[FullMesh, GatewayOrderLoad]:
    """A started mesh (options as `FullMesh.create`) and a load for it, not yet running."""
    mesh = await new_mesh(**options)
    async with mesh.admin() as admin:
        accounts = await load_accounts(admin, LOAD_USERS)
    return mesh, GatewayOrderLoad(mesh.gateway.address, accounts, seed=seed)


async def kill_and_restart(
    load: GatewayOrderLoad,
    process: ServiceProcess,
    *,
    while_down: Callable[[], Awaitable[None]],
    before_kill: Callable[[], Awaitable[None]] | None = None,
    bursting: OmsClient | None = None,
    rounds: int = 1,
) -> list[TradeBurst]:
    """Under the load: kill `process`, run `while_down`, restart it, let the load go on.

    With `bursting`, the kill lands while a burst of that client's orders is in flight,
    and the burst is retried once the process is back. Whether one of them was applied
    with its answer lost at the kill is a matter of timing (in about one kill in six,
    none was), so the kill is repeated, at most MAX_KILLS times, until that happened;
    `rounds` times over, the load going on between rounds.
    """
    bursts: list[TradeBurst] = []

    async def fault() -> None:
        await load.wait_accepted(BEFORE_FAULT)
        if before_kill is not None:
            await before_kill()
        for _ in range(rounds):
            kills = 0
            while True:
                kills += 1
                killed_at = time.monotonic()
                if bursting is None:
                    process.kill()
                else:
                    burst = TradeBurst(bursting, resting_bids(bursting, len(bursts)))
                    bursts.append(burst)
                    await burst.send(process.kill)
                await while_down()
                started_at = time.monotonic()
                await asyncio.to_thread(process.start_serving)
                recovery_s = time.monotonic() - started_at
                if bursting is None:
                    break
                await burst.retry()
                burst.check_answers()
                if burst.lost_answers_applied or kills == MAX_KILLS:
                    break
            await load.wait_accepted(len(load.acknowledged) + AFTER_FAULT)
            # Shown with -s: the README's figures. The process is started again as soon
            # as `while_down` saw what it waits for.
            print(
                f"{process.subcommand} killed: down {started_at - killed_at:.2f} s, started"
                f" to serving {recovery_s:.2f} s, longest wait for an accepted order"
                f" {load.longest_pause_s(killed_at):.2f} s"
            )

    await run_load_until(load, fault)
    if bursts:
        print(
            "bursts: "
            + ", ".join(
                f"{len(b.first)} answered before the kill and {b.lost_answers_applied} applied"
                " with the answer lost"
                for b in bursts
            )
        )
        assert bursts[-1].lost_answers_applied >= 1, f"{MAX_KILLS} kills: no answer lost"
    return bursts


async def burst_account(mesh: FullMesh) -> Account:
    async with mesh.admin() as admin:
        (account,) = await load_accounts(admin, 1)
    return account


async def check_after_fault(
    mesh: FullMesh, load: GatewayOrderLoad, also: Sequence[PlacedOrder] = ()
) -> None:
    # Shown with -s or on failure: how hard the fault hit the clients.
    print(
        f"load: {len(load.acknowledged)} orders acknowledged, cancels {dict(load.cancels)},"
        f" {load.retries} retries ({load.duplicates_on_retry} answered as duplicates),"
        f" failures {dict(load.failures)}"
    )
    assert not load.refused, load.refused[:3]
    placed = [*load.acknowledged.values(), *also]
    await check_full_mesh(mesh, [p.ack.order_id for p in placed])
    await check_orders_exactly_once(mesh, placed)
    # Then from outside, as an auditor would: every resting order cancelled, every
    # acknowledged order found final, every balance recomputed from transfers and fills.
    async with mesh.admin() as admin:
        await cancel_everything(admin)
        await audit_from_outside(mesh.database_url, admin=admin, placed=placed, flat=True)


async def shard_counters(mesh: FullMesh) -> dict[str, int]:
    async with aio_channel(mesh.shard.address) as channel:
        return dict((await ShardClient(channel).status()).counters)


async def persister_counters(mesh: FullMesh) -> dict[str, int]:
    async with aio_channel(mesh.persister.address) as channel:
        return await PersisterClient(channel).counters()


def log_events(process: ServiceProcess, event: str, incarnation: int) -> list[dict[str, Any]]:
    """The structured log lines named `event` that incarnation `incarnation` wrote."""
    text = process.log_path.read_text(errors="replace")
    start = text.index(f"--- incarnation {incarnation}:")
    end = text.find(f"--- incarnation {incarnation + 1}:", start)
    lines = text[start : end if end >= 0 else len(text)].splitlines()
    return [json.loads(line) for line in lines if f'"event": "{event}"' in line]


# --- the shard ---------------------------------------------------------------------------

# The persister's counters of reads the shard asks for (hydrations and DB dedup lookups).
SHARD_ASKED_READS = ("hydration_requests", "dedup_lookups")


async def test_shard_kill_9_recovers_from_snapshot_and_log_without_reading_the_database(
    new_mesh: NewMesh,
) -> None:
    # A snapshot every 200 log entries: recovery starts from one and replays the rest.
    mesh, load = await loaded_mesh(
        new_mesh,
        1,
        shard_environment={"OMS_SHARD_SNAPSHOT_ENTRIES": "200"},
        gateway_environment=BURST_GATEWAY,
    )
    before: dict[str, dict[str, int]] = {}

    async def before_kill() -> None:
        await eventually(
            lambda: _published(mesh.shard), lambda published: published, timeout_s=SETTLE_S
        )
        before["shard"] = await shard_counters(mesh)
        before["persister"] = await persister_counters(mesh)

    async def while_down() -> None:
        # The load's calls in flight at the kill came back UNAVAILABLE: they are retried.
        await load.wait_retries(load.retries + 1)

    async with (await burst_account(mesh)).client(mesh.gateway.address) as client:
        bursts = await kill_and_restart(
            load, mesh.shard, while_down=while_down, before_kill=before_kill, bursting=client
        )
    await check_after_fault(mesh, load, [p for burst in bursts for p in burst.placed()])

    for incarnation in range(2, len(bursts) + 2):
        (recovered,) = log_events(mesh.shard, "runtime.recovered", incarnation)
        assert recovered["replayed_entries"] > 0, recovered
        # From the newest snapshot; or, when the persister's cursor as the log last heard
        # it (reported once a second; a snapshot every 200 entries here) was behind it,
        # again from the snapshot kept at or before that cursor, or from the log's start
        # (services/runtime/core/snapshot_policy.py).
        again = log_events(mesh.shard, "runtime.replaying_for_egress", incarnation)
        if again:
            assert recovered["snapshot_position"] == again[0]["from_snapshot"], (again, recovered)
            assert again[0]["from_snapshot"] <= again[0]["egress_floor"], again
        else:
            assert recovered["snapshot_position"] > 0, recovered
    # Recovery read no database: the shard asked the persister for nothing because of it
    # (every user was resident, so nothing else would ask either).
    after_persister = await persister_counters(mesh)
    for name in SHARD_ASKED_READS:
        assert after_persister[name] == before["persister"][name], (name, after_persister)
    after_shard = await shard_counters(mesh)
    assert after_shard["hydrations_requested"] == before["shard"]["hydrations_requested"]
    assert after_shard["dedup_lookups_sent"] == before["shard"]["dedup_lookups_sent"]


async def _published(process: ServiceProcess) -> bool:
    """A snapshot was written (the shard logs each one it publishes)."""
    return '"event": "snapshot.published"' in process.log_path.read_text(errors="replace")


# --- the bridge --------------------------------------------------------------------------


async def test_bridge_kill_9_redrives_and_loses_or_doubles_nothing(new_mesh: NewMesh) -> None:
    mesh, load = await loaded_mesh(new_mesh, 2)

    async def while_down() -> None:
        # The shard still accepts orders: they wait as sagas in flight for the bridge.
        await load.wait_accepted(len(load.acknowledged) + DURING_FAULT)

    await kill_and_restart(load, mesh.bridge, while_down=while_down)
    await check_after_fault(mesh, load)
    report = await service_status(mesh.bridge.address)
    assert report.counters["redriven"] >= DURING_FAULT, report


# --- the persister -----------------------------------------------------------------------

# Flat users leave after one idle second, so flushes happen while the persister is gone.
EVICTING_SHARD = {"OMS_SHARD_IDLE_TTL_MS": "1000", "OMS_SHARD_TIMER_MS": "50"}
IDLE_USERS = 3


async def test_persister_kill_9_loses_and_doubles_no_flush_and_no_row(new_mesh: NewMesh) -> None:
    mesh, load = await loaded_mesh(new_mesh, 3, shard_environment=EVICTING_SHARD)
    idle: list[int] = []
    evictions: dict[str, int] = {}

    async def while_down() -> None:
        # Users funded just before the kill go idle now: their flushes wait for the persister.
        await eventually(
            lambda: shard_counters(mesh),
            lambda c: c["evictions_started"] >= evictions["started"] + IDLE_USERS,
            timeout_s=SETTLE_S,
        )
        await load.wait_accepted(len(load.acknowledged) + DURING_FAULT)

    async def before_kill() -> None:
        async with mesh.admin() as admin:
            for _ in range(IDLE_USERS):
                idle.append((await open_account(admin, {"USDT": 5_000_000})).user_id)
        counters = await shard_counters(mesh)
        evictions["started"] = counters["evictions_started"]
        evictions["completed"] = counters["evictions_completed"]

    await kill_and_restart(load, mesh.persister, while_down=while_down, before_kill=before_kill)
    await check_after_fault(mesh, load)

    counters = await eventually(
        lambda: shard_counters(mesh),
        lambda c: c["evictions_completed"] >= evictions["completed"] + IDLE_USERS,
        timeout_s=SETTLE_S,
    )
    assert counters["flushes_refused"] == 0, counters  # no flush stale or written twice
    async with aio_channel(mesh.persister.address) as channel:
        persister = PersisterClient(channel)
        for user_id in idle:
            stored = await persister.stored_user(user_id)
            assert [(b.asset, b.total) for b in stored.state.balances] == [("USDT", 5_000_000)]
    connection = await asyncpg.connect(mesh.database_url)
    try:
        versions = await connection.fetch(
            "SELECT user_id, version FROM users WHERE user_id = ANY($1::bigint[]) ORDER BY 1", idle
        )
    finally:
        await connection.close()
    # Each was flushed once: begun while the persister was gone, written once it was back.
    assert [(row["user_id"], row["version"]) for row in versions] == [(u, 1) for u in idle]
    await check_ledger_is_the_shards_egress(mesh)


async def check_ledger_is_the_shards_egress(mesh: FullMesh) -> None:
    """PostgreSQL's ledger holds every ledger item of the shard's egress exactly once."""
    async with aio_channel(mesh.shard.address) as channel, mesh.admin() as admin:
        shard = ShardClient(channel)
        fence = await admin.create_user()
        # Its result names a log position the persister's cursor must pass.
        ack = await admin.deposit(fence.user_id, "USDT", 1, "ledger-fence")
        assert ack.accepted, ack
        position = ack.stamp.position
        await eventually(
            lambda: persister_counters(mesh),
            lambda c: c["committed_position"] >= position,
            timeout_s=SETTLE_S,
        )
        egress = await egress_through(shard, ["ledger"], position)
    connection = await asyncpg.connect(mesh.database_url)
    try:
        stored = [row for row in await table_ledger(connection) if row[0] <= position]
    finally:
        await connection.close()
    assert stored == ledger_rows(egress)


# --- a matcher ---------------------------------------------------------------------------


async def test_matcher_kill_9_resumes_from_sequence(new_mesh: NewMesh) -> None:
    mesh, load = await loaded_mesh(new_mesh, 4)

    async def while_down() -> None:
        # BTC-USDT orders wait in flight for g1; SOL-USDT ones trade on g2 meanwhile
        # (tests/bridge/test_faults.py shows g2's sequence moving on while g1 is down).
        await load.wait_accepted(len(load.acknowledged) + DURING_FAULT)

    await kill_and_restart(load, mesh.matchers["g1"], while_down=while_down)
    await check_after_fault(mesh, load)
    report = await service_status(mesh.bridge.address)
    assert report.counters["reconnects"] >= 1, report
    assert report.counters["sequence_out_of_range"] == 0, report
    assert (await shard_counters(mesh))["matcher_sequence_gaps"] == 0


# --- the gateway -------------------------------------------------------------------------


async def test_gateway_kill_9_clients_retry_and_get_the_original_acks(new_mesh: NewMesh) -> None:
    mesh, load = await loaded_mesh(new_mesh, 5, gateway_environment=BURST_GATEWAY)

    async def while_down() -> None:
        # The clients' calls in flight failed: they are retried.
        await load.wait_retries(load.retries + 1)

    async with (await burst_account(mesh)).client(mesh.gateway.address) as client:
        bursts = await kill_and_restart(load, mesh.gateway, while_down=while_down, bursting=client)
    await check_after_fault(mesh, load, [p for burst in bursts for p in burst.placed()])


# --- a co-located shard cluster ------------------------------------------------------------


async def test_a_colocated_cluster_killed_under_load_loses_or_doubles_nothing(
    new_mesh: NewMesh,
) -> None:
    """`oms shard --colocate`: the shard, its persister, bridge and reconciler in one
    process, SIGKILLed together with a burst in flight, in three rounds (each until an order
    applied before the kill lost its answer, at most MAX_KILLS kills): each incarnation recovers
    the shard from its snapshot and log, and the roles resume from the shard's durable
    state (the persister from its cursor, the bridge from the in-flight sagas)."""
    mesh, load = await loaded_mesh(
        new_mesh,
        6,
        colocated=True,
        shard_environment={"OMS_SHARD_SNAPSHOT_ENTRIES": "200"},
        gateway_environment=BURST_GATEWAY,
    )

    async def while_down() -> None:
        await load.wait_retries(load.retries + 1)

    async with (await burst_account(mesh)).client(mesh.gateway.address) as client:
        bursts = await kill_and_restart(
            load,
            mesh.shard,
            while_down=while_down,
            bursting=client,
            rounds=COLOCATED_KILL_ROUNDS,
        )
    await asyncio.to_thread(mesh.wait_roles_serving)
    await check_after_fault(mesh, load, [p for burst in bursts for p in burst.placed()])
    assert mesh.shard.incarnations == len(bursts) + 1 >= COLOCATED_KILL_ROUNDS + 1
