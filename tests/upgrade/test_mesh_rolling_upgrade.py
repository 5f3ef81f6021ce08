"""The replicated mesh (`oms up --replicas 3`) upgraded under a trading load: every shard
replica and then every matcher replica of group g1 restarted in turn on the next
release, both groups switched to the next release's versions, nothing lost, nothing
doubled.

A release is the code a process loads when it starts. Here every process of the mesh
starts through a `sitecustomize` that loads the next release
(`tests/upgrade/next_release.py`) once the test has "deployed" it (a marker file), so
a replica killed after that comes back, restarted by `oms up`'s supervisor, on the
new code, as a pod does when a StatefulSet rolls. Twelve users trade on Trade streams
meanwhile (`tests/e2e/stream_load.py`). Checked from outside afterwards: every
request answered in time, every accepted order found and final exactly once, the
histories agree with the balances (`audit_accounts`), the mesh's invariants
(`check_mesh_invariants`), and each group's replicas at its new version with one state hash
at a common checkpoint. The version's new rules hold from the switch on, not before:
the shard refuses a deposit over the cap, the matcher rejects an order over the
maximum size.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gateway.client import AdminClient, OmsClient
from protos.oms.v1 import common_pb2, shard_pb2
from services.command_line import main
from tests.e2e.invariants import MeshAddresses, check_mesh_invariants
from tests.e2e.stream_load import ANSWER_MARGIN_S, FUNDS, StreamLoad
from tests.e2e.test_client_contract import audit_accounts
from tests.gateway.accounts import BTC, PRICE, eventually, open_account
from tests.replication.replica_set import status_of
from tests.replication.replicated_mesh import (
    ROOT,
    ReplicatedMesh,
    kill_replica,
    leader_of,
    wait_new_term,
    wait_same_checkpoint,
)
from tests.upgrade.next_release import (
    DEPOSIT_CAP,
    MATCHER_VERSION,
    MAX_ORDER_LOTS,
    SHARD_VERSION,
)

pytestmark = pytest.mark.slow
OPEN, REJECTED = common_pb2.ORDER_STATUS_OPEN, common_pb2.ORDER_STATUS_REJECTED
USERS = 12
DEADLINE_S = 5.0
BATCH = 4  # per user every 0.1 s: about 480 orders/s
BETWEEN_ROLLS = 300
SERVE_AGAIN_S = 8.0  # a 2 s lease, the election, the gateway finding the new leader
OFTEN = {"OMS_SHARD_CHECKPOINT_ENTRIES": "64", "OMS_MATCHER_CHECKPOINT_ENTRIES": "64"}
SITECUSTOMIZE = """\
import os

if os.path.exists(os.environ.get("OMS_TEST_NEXT_RELEASE_DEPLOYED", "/nonexistent")):
    from tests.upgrade.next_release import install

    install()
"""


@pytest.fixture
def mesh(tmp_path: Path, database_url: str) -> Iterator[tuple[ReplicatedMesh, Path]]:
    hook = tmp_path / "release-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    deployed = tmp_path / "next-release-deployed"
    environment = {
        **OFTEN,
        "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}",
        "OMS_TEST_NEXT_RELEASE_DEPLOYED": str(deployed),
    }
    with ReplicatedMesh(tmp_path / "state", database_url, environment) as running:
        yield running, deployed


def _versions(addresses: list[str]) -> set[int]:
    return {status_of(address).counters["machine_version"] for address in addresses}


def _wait_answering(address: str, timeout_s: float = 60.0) -> None:
    """Until the replica restarted on `address` answers its status again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status_of(address)
            return
        except grpc.RpcError:  # not up yet
            assert time.monotonic() < deadline, f"{address} did not come back"
            time.sleep(0.1)


async def _roll(replicas: list[str], load: StreamLoad) -> float:
    """Each replica killed and restarted (on the next release), followers first; the
    longest from the leader's kill to the next accepted order."""
    leader, term = await asyncio.to_thread(leader_of, replicas)
    for address in [a for a in replicas if a != leader]:
        await asyncio.to_thread(kill_replica, address)
        await asyncio.to_thread(_wait_answering, address)
        await load.wait_accepted(load.accepted + BETWEEN_ROLLS)
    await asyncio.to_thread(kill_replica, leader)
    killed_at = time.monotonic()
    await asyncio.to_thread(wait_new_term, replicas, term)
    await load.wait_accepted(load.accepted + BETWEEN_ROLLS)
    first = load.first_accepted_after(killed_at)
    assert first is not None
    await asyncio.to_thread(_wait_answering, leader)
    return first - killed_at


async def _large_order_status(client: OmsClient, client_order_id: str) -> int:
    """A resting sell over the next release's maximum size: open at version 1 (then
    cancelled), rejected by the matcher at `MATCHER_VERSION`."""
    ack = await client.place(
        client_order_id,
        BTC,
        common_pb2.SIDE_SELL,
        price_ticks=PRICE + 1_000,  # above the load's one price: it rests
        quantity_lots=MAX_ORDER_LOTS + 1,
    )
    assert ack.accepted, ack
    view = await eventually(
        lambda: client.get_order(order_id=ack.order_id),
        lambda found: found.status in (OPEN, REJECTED),
    )
    if view.status == OPEN:
        assert (await client.cancel(order_id=ack.order_id)).accepted
    return int(view.status)


def _activate(state_dir: Path, group: str, version: int) -> str:
    code = main(["upgrade", "activate", group, str(version), "--state-dir", str(state_dir)])
    assert code == 0, f"upgrade activate {group}: exit {code}"
    return group


async def test_a_replicated_mesh_rolled_and_switched_under_trading_loses_nothing(
    mesh: tuple[ReplicatedMesh, Path],
) -> None:
    running, deployed = mesh
    record = running.record
    admin = AdminClient(
        record.gateway, api_key=record.admin_api_key, api_secret=record.admin_api_secret
    )
    groups = {"shard/s1": record.shard_replicas(), "matcher/g1": record.matcher_replicas("g1")}
    versions = {"shard/s1": SHARD_VERSION, "matcher/g1": MATCHER_VERSION}
    async with admin:
        accounts = [
            await open_account(admin, FUNDS, tier=shard_pb2.USER_TIER_WHALE) for _ in range(USERS)
        ]
        # Outside the load's audit: the deposits and the large orders of the new rules.
        other = await open_account(admin, {"BTC": 10**12})
        depositor = other.user_id
        load = StreamLoad.of(record.gateway, accounts, deadline_s=DEADLINE_S, batch=BATCH)
        failovers: dict[str, float] = {}
        load.start()
        try:
            await load.wait_accepted(BETWEEN_ROLLS)
            deployed.touch()  # the next release is on disk: restarts load it
            for name, replicas in groups.items():
                failovers[name] = await _roll(replicas, load)
            # Version 1 still in force, on the new code: the old decisions.
            big = await admin.deposit(depositor, "USDT", 2 * DEPOSIT_CAP, "big-before")
            assert big.accepted, big
            async with other.client(record.gateway) as client:
                assert await _large_order_status(client, "large-before") == OPEN
                for name in groups:
                    await asyncio.to_thread(_activate, running.state_dir, name, versions[name])
                refused = await admin.deposit(depositor, "USDT", 2 * DEPOSIT_CAP, "big-after")
                assert refused.reject_reason == shard_pb2.SHARD_REJECT_REASON_INVALID_AMOUNT
                assert await _large_order_status(client, "large-after") == REJECTED
            await load.wait_accepted(load.accepted + BETWEEN_ROLLS)
            await load.drain()
        finally:
            await load.close()
    print(
        f"first acceptance after each leader's restart: {failovers}; {load.accepted} orders"
        f" accepted, answers {dict(load.answers)}, slowest answer {load.slowest_answer_s:.3f} s"
    )
    assert load.late == 0, f"{load.late} requests without an answer in time"
    assert load.slowest_answer_s <= DEADLINE_S + ANSWER_MARGIN_S
    assert failovers["shard/s1"] < SERVE_AGAIN_S, failovers

    order_ids = await audit_accounts(record.gateway, load)
    addresses = MeshAddresses.single(
        shard=leader_of(record.shard_replicas())[0],
        persister=record.persister,
        matchers={group: leader_of(record.matcher_replicas(group))[0] for group in record.matchers},
        shard_id=record.shard_id,
    )
    await check_mesh_invariants(addresses, running.database_url, order_ids)
    for name, replicas in groups.items():
        assert await asyncio.to_thread(_versions, replicas) == {versions[name]}
        await asyncio.to_thread(wait_same_checkpoint, replicas)
    assert running.stop() == 0
