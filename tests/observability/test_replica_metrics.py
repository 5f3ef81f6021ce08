"""A replicated group's leadership as metrics: what `OmsNoReplicaLeading` pages on.

Three replicas of one shard over the session's etcd, each with its own scrape
endpoint: exactly one says `oms_leading{service="replica"} 1`, and once it is killed
another says so, in a newer `oms_term`, within a lease and an election.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from services.infra.ports import LOOPBACK, free_port
from tests.observability.test_metrics import scrape, value
from tests.replication.replica_set import LEASE_TTL_S, ReplicaProcess, ReplicaSet

ELECTED_WITHIN_S = LEASE_TTL_S + 10.0


def leadership(replicas: ReplicaSet) -> dict[ReplicaProcess, tuple[float, float]]:
    """(oms_leading, oms_term) of each running replica, as its endpoint says."""
    found = {}
    for replica in replicas.running():
        samples = scrape(replica.environment["OMS_METRICS_LISTEN"])
        found[replica] = (
            value(samples, "oms_leading", service="replica"),
            value(samples, "oms_term", service="replica"),
        )
    return found


async def one_leader(replicas: ReplicaSet, newer_than: float = 0) -> ReplicaProcess:
    deadline = time.monotonic() + ELECTED_WITHIN_S
    while True:
        seen = await asyncio.to_thread(leadership, replicas)
        leaders = [r for r, (leading, term) in seen.items() if leading == 1 and term > newer_than]
        if len(leaders) == 1 and sum(leading for leading, _ in seen.values()) == 1:
            return leaders[0]
        assert time.monotonic() < deadline, f"no single leader in the metrics: {seen}"
        await asyncio.sleep(0.1)


async def test_exactly_one_replica_exports_leading_and_a_failover_moves_it(
    tmp_path: Path, etcd_endpoints: tuple[str, ...]
) -> None:
    replicas = ReplicaSet(tmp_path, etcd_endpoints, 3)
    for replica in replicas.replicas:
        replica.environment["OMS_METRICS_LISTEN"] = f"{LOOPBACK}:{free_port()}"
    await asyncio.to_thread(replicas.start)
    try:
        first = await one_leader(replicas)
        term = (await asyncio.to_thread(leadership, replicas))[first][1]
        samples = await asyncio.to_thread(scrape, first.environment["OMS_METRICS_LISTEN"])
        assert ("oms_applied_position", (("service", "replica"),)) in samples
        assert ("oms_records_total", (("service", "sequencer"),)) in samples
        first.kill()
        second = await one_leader(replicas, newer_than=term)
        assert second is not first
    finally:
        await asyncio.to_thread(replicas.stop)
