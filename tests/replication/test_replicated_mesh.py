"""The replicated mesh (`oms up --replicas 3`) under a steady order load, through the
SIGKILL of the shard's leader and then of a matcher group's leader.

Twelve users trade on Trade streams through the gateway (tests/e2e/stream_load.py:
about 480 orders/s, re-sending unanswered requests with the same client order id).
Each kill: a follower serves within seconds, the supervisor restarts the killed
replica as a follower. Afterwards, from the public API: every request had an answer
in time; every accepted order is found and final, each user's order ids run 1..n,
the histories agree with the balances (so every acknowledged order and transfer is
present with its effects, and none twice); the mesh's invariants hold (nothing
reached a matcher twice or is missing there, PostgreSQL agrees, the books balance);
and every group's replicas share their state hash at a checkpoint after the failover.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.client import AdminClient
from protos.oms.v1 import shard_pb2
from services.coordination.addresses import FROM_ETCD, address_source
from tests.e2e.invariants import MeshAddresses, check_mesh_invariants
from tests.e2e.stream_load import ANSWER_MARGIN_S, FUNDS, StreamLoad
from tests.e2e.test_client_contract import audit_accounts
from tests.gateway.accounts import open_account
from tests.replication.replicated_mesh import (
    ReplicatedMesh,
    kill_replica,
    leader_of,
    wait_new_term,
    wait_same_checkpoint,
)

pytestmark = pytest.mark.slow
USERS = 12
DEADLINE_S = 5.0
BATCH = 4  # per user every 0.1 s: about 480 orders/s
BETWEEN_FAULTS = 1_000
SERVE_AGAIN_S = 8.0  # a 2 s lease, the election, the gateway finding the new leader
# Checkpoints often, so replicas share hashes soon after the failover.
OFTEN = {"OMS_SHARD_CHECKPOINT_ENTRIES": "64", "OMS_MATCHER_CHECKPOINT_ENTRIES": "64"}


@pytest.fixture(params=["processes", "colocated"])
def mesh(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str
) -> Iterator[ReplicatedMesh]:
    """Both forms: a process per service, and a persister, bridge and reconciler beside
    each shard replica (`oms up --colocate`: the shard leader's process holds them, so
    killing it kills the active roles too, and the new leader's take over)."""
    colocated = request.param == "colocated"
    with ReplicatedMesh(tmp_path / "state", database_url, OFTEN, colocated=colocated) as running:
        yield running


async def test_leaders_killed_under_an_order_load_lose_and_double_nothing(
    mesh: ReplicatedMesh,
) -> None:
    record = mesh.record
    admin = AdminClient(
        record.gateway, api_key=record.admin_api_key, api_secret=record.admin_api_secret
    )
    async with admin:
        accounts = [
            await open_account(admin, FUNDS, tier=shard_pb2.USER_TIER_WHALE) for _ in range(USERS)
        ]
    load = StreamLoad.of(record.gateway, accounts, deadline_s=DEADLINE_S, batch=BATCH)
    groups = {"shard": record.shard_replicas(), "matcher g1": record.matcher_replicas("g1")}
    failovers: dict[str, float] = {}
    load.start()
    try:
        await load.wait_accepted(BETWEEN_FAULTS)
        for name, replicas in groups.items():
            leader, term = await asyncio.to_thread(leader_of, replicas)
            await asyncio.to_thread(kill_replica, leader)
            killed_at = time.monotonic()
            await asyncio.to_thread(wait_new_term, replicas, term)
            await load.wait_accepted(load.accepted + BETWEEN_FAULTS)
            first = load.first_accepted_after(killed_at)
            assert first is not None
            failovers[name] = first - killed_at
        await load.drain()
    finally:
        await load.close()
    print(
        f"first acceptance after each kill: {failovers}; {load.accepted} orders accepted,"
        f" answers {dict(load.answers)}, slowest answer {load.slowest_answer_s:.3f} s"
    )
    assert load.late == 0, f"{load.late} requests without an answer in time"
    assert load.slowest_answer_s <= DEADLINE_S + ANSWER_MARGIN_S
    # A matcher's failover holds up only fills; acceptance never stops for it.
    assert failovers["shard"] < SERVE_AGAIN_S, failovers

    order_ids = await audit_accounts(record.gateway, load)
    shard_leader, _ = leader_of(record.shard_replicas())
    persister = record.persister
    if mesh.colocated:
        # The active persister is the one beside the shard's leader; its lease says where.
        source = address_source(
            FROM_ETCD,
            kind="persister",
            name=record.shard_id,
            etcd_endpoints=(mesh.etcd.endpoint,),
            mesh_id=record.mesh_id,
        )
        try:
            persister = await source.resolve()
        finally:
            await source.close()
        assert persister in record.clusters()[0].role_addresses("persister")
        (shard_beside,) = [
            replica
            for index, replica in enumerate(record.shard_replicas())
            if record.clusters()[0].roles_of_replica(index)[0] == persister
        ]
        assert shard_beside == shard_leader, (shard_beside, shard_leader)
    addresses = MeshAddresses.single(
        shard=shard_leader,
        persister=persister,
        matchers={group: leader_of(record.matcher_replicas(group))[0] for group in record.matchers},
        shard_id=record.shard_id,
    )
    await check_mesh_invariants(addresses, mesh.database_url, order_ids)
    for replicas in (record.shard_replicas(), *map(record.matcher_replicas, record.matchers)):
        await asyncio.to_thread(wait_same_checkpoint, replicas)
    assert mesh.stop() == 0
