"""A shard leader cut from etcd but not from its clients stops serving before another leads.

Three replicas over the etcd log under the deposit load of `test_shard_failover.py`.
The leader's link to etcd is cut while its clients still reach it (a partition, not a
crash): by the kernel where the test may (the leader runs in a network namespace of
its own, joined to the host by a veth pair; nftables drops what arrives over that
link for etcd's port: one way, silently, as between two machines), else through a
proxy of its own that freezes every connection and every new one. The followers and
the callers reach etcd directly, and the leader over its link. What the fencing story
promises, seen from outside:

- the cut leader answers no caller from the cut on: under load an append of its is
  stuck behind the cut, and a read waits for the state it would show to be durable
  (which it never is), until the replica stops serving and refuses it UNAVAILABLE;
  idle, it would serve reads until unsure of its lease (a renewal etcd answered sent
  over a TTL ago) and refuse them after. A reader asks it for an actor all along: no
  answer comes from it after another replica is seen leading;
- a follower leads a newer term once the lease expires, and the load goes on there;
- healed, the old leader has ended or ends (crash-only), is started again as a
  follower, and every acknowledged deposit is in the balances exactly once, every
  replica at one position with one state hash.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from services.infra.embedded_etcd import EmbeddedEtcd
from services.infra.ports import free_port
from tests.partitions.network_namespace import NetworkNamespace
from tests.partitions.network_namespace import unavailable as namespace_unavailable
from tests.replication.replica_set import LEASE_TTL_S, ReplicaProcess, ReplicaSet, status_of
from tests.replication.test_shard_failover import SERVE_AGAIN_S, _finish, _started_load
from tests.shard_service.shard_client import ShardClient
from tests.shard_service.shard_process import aio_channel
from tests.sharding.freezing_proxy import FreezingProxy

pytestmark = pytest.mark.slow
PROBE_S = 0.02
ENDS_S = 3 * LEASE_TTL_S + 10.0  # it gives up on its lease, then its process ends
ENDINGS = ("leadership.lost", "LogFencedError", "LogUnavailableError")


class Observer:
    """When the cut leader last answered a caller, and when another leader was first seen."""

    def __init__(self, cut: ReplicaProcess, others: list[ReplicaProcess], term: int) -> None:
        self.cut, self.others, self.term = cut, others, term
        self.last_answer = 0.0
        self.refusals: set[str] = set()
        self.new_leader_seen = 0.0

    async def run(self) -> None:
        async with aio_channel(self.cut.address) as channel:
            shard = ShardClient(channel)
            while not self.new_leader_seen:
                try:
                    await shard.actor(1)
                    self.last_answer = time.monotonic()
                except grpc.aio.AioRpcError as error:
                    self.refusals.add(f"{error.code().name}: {error.details()}"[:120])
                for other in self.others:
                    try:
                        status = await asyncio.to_thread(status_of, other.address, 0.5)
                    except grpc.RpcError:
                        continue
                    if status.leading and status.term > self.term:
                        self.new_leader_seen = time.monotonic()
                await asyncio.sleep(PROBE_S)


async def test_a_leader_cut_from_etcd_stops_serving_before_another_leads(
    tmp_path: Path, etcd_endpoints: tuple[str, ...]
) -> None:
    """By the kernel where it can (the leader in a namespace of its own, nftables
    dropping what it sends over its link to etcd's port: one way), else by a proxy
    that freezes its connections to etcd and every new one."""
    if namespace_unavailable() is None:
        with NetworkNamespace() as namespace:
            # An etcd of the test's own, listening on the host's side of the link too.
            etcd = EmbeddedEtcd(
                tmp_path / "etcd",
                unsafe_no_fsync=True,
                extra_client_urls=[f"http://{namespace.outside}:{free_port()}"],
            )
            etcd.start()
            try:
                replicas = ReplicaSet(tmp_path, (etcd.endpoint,), 3)
                leader = replicas.replicas[0]
                leader.host = namespace.inside
                leader.environment["OMS_SHARD_ADVERTISE"] = leader.address
                outside = etcd.extra_client_urls[0].removeprefix("http://")
                leader.environment["OMS_ETCD_ENDPOINTS"] = outside
                leader.command_prefix = namespace.command_prefix()
                port = int(outside.rpartition(":")[2])
                await leader_cut_and_healed(
                    replicas, lambda: namespace.drop_to(port), namespace.heal
                )
            finally:
                etcd.stop()
        return
    print(f"cut by a proxy: {namespace_unavailable()}")
    replicas = ReplicaSet(tmp_path, etcd_endpoints, 3)
    proxy = FreezingProxy(etcd_endpoints[0])
    await proxy.start()
    replicas.replicas[0].environment["OMS_ETCD_ENDPOINTS"] = proxy.endpoint
    try:
        await leader_cut_and_healed(replicas, proxy.partition, proxy.heal)
    finally:
        await proxy.close()


async def leader_cut_and_healed(
    replicas: ReplicaSet, partition: Callable[[], None], heal: Callable[[], None]
) -> None:
    """Replica 0 leads; it is cut from etcd (`partition`) under the load, watched until
    another leads, healed, and back as a follower; the checks of the module's docstring."""
    cut, *others = replicas.replicas
    try:
        # It starts alone, so it leads; then the followers.
        cut.start()
        await asyncio.to_thread(cut.wait_serving)
        assert await asyncio.to_thread(replicas.wait_leader) is cut
        for replica in others:
            replica.start()
        for replica in others:
            await asyncio.to_thread(replica.wait_serving)
        term = status_of(cut.address).term
        link, load, running = await _started_load(replicas)
        try:
            await load.wait_successes(300)
            observer = Observer(cut, others, term)
            partition()
            cut_at = time.monotonic()
            async with asyncio.timeout(SERVE_AGAIN_S + 10.0):
                await observer.run()
            await load.wait_successes(300, timeout_s=SERVE_AGAIN_S + 10.0)
            answered = observer.last_answer - cut_at
            print(
                "cut leader: "
                + (f"last answer {answered:.2f} s after the cut" if answered >= 0 else "no answer")
                + f", refusals {sorted(observer.refusals)}; a new leader seen"
                f" {observer.new_leader_seen - cut_at:.2f} s after the cut"
            )
            assert observer.last_answer < observer.new_leader_seen, observer.__dict__
            assert observer.refusals, "the cut leader never refused a caller"
            heal()
            # It ends (crash-only) once its lease is found gone or an append of its term
            # fails, whichever comes first (an append in flight at the cut outlives its
            # deadline).
            deadline = time.monotonic() + ENDS_S
            while cut.running():
                assert time.monotonic() < deadline, cut.log_tail()
                await asyncio.sleep(0.05)
            tail = cut.log_tail(80)
            assert any(reason in tail for reason in ENDINGS), tail
            # Started again where it ran (its namespace, healed), as its supervisor would.
            await asyncio.to_thread(cut.start_serving)
            await load.wait_successes(300)
        finally:
            await _finish(link, load, running)
        await replicas.check_deposits(load)
    finally:
        await asyncio.to_thread(replicas.stop)
