"""Replicas of one shard group as real `oms shard` processes over the test session's etcd.

Every replica runs with `OMS_SHARD_LOG=etcd` under one group name no other test
uses, on its own data folder and loopback port. A follower serves health and
status but refuses the shard's calls, so a replica counts as up once the server
as a whole is SERVING; the leader is whichever one says so in its status.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from protos.oms.v1 import status_pb2, status_pb2_grpc
from services.transport.tls import MeshTransport
from tests.service_process import CHANNEL_OPTIONS, ServiceProcessError
from tests.shard_service.deposit_load import DepositLoad
from tests.shard_service.shard_client import USDT, ShardClient, balance
from tests.shard_service.shard_process import ShardProcess, aio_channel

_groups = itertools.count(1)
MESH_ID = "test-replicas"
LEASE_TTL_S = 2


class ReplicaProcess(ShardProcess):
    service_name = ""  # the server: a follower serves health and status, not the shard


@dataclass(frozen=True)
class ReplicaStatus:
    counters: dict[str, int]
    leading: bool
    term: int
    applied_position: int
    checkpoints_verified: int
    records_followed: int
    state_hash: str
    leader: str
    checkpoints: str = ""  # "position:hash,..." as the replica reports them


def status_of(
    address: str, timeout_s: float = 2.0, transport: MeshTransport | None = None
) -> ReplicaStatus:
    """A replica's status, asked in plaintext (as the suite runs) or over `transport`."""
    channel = (
        transport.blocking_channel(address, CHANNEL_OPTIONS)
        if transport is not None
        else grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    )
    with channel:
        report = status_pb2_grpc.StatusStub(channel).GetStatus(
            status_pb2.StatusRequest(), timeout=timeout_s
        )
    counters = report.counters
    return ReplicaStatus(
        counters=dict(counters),
        leading=bool(counters["leading"]),
        term=counters["term"],
        applied_position=counters["applied_position"],
        checkpoints_verified=counters["checkpoints_verified"],
        records_followed=counters["records_followed"],
        state_hash=report.info["state_hash"],
        leader=report.info["leader"],
        checkpoints=report.info.get("checkpoints", ""),
    )


class ReplicaSet:
    def __init__(
        self,
        folder: Path,
        etcd_endpoints: tuple[str, ...],
        size: int,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.shard_id = f"rep{os.getpid()}-{next(_groups)}"
        # A test that looks at a whole mesh (`oms upgrade status`) gives one of its own:
        # other tests' groups stay registered until their leases lapse.
        self.mesh_id = (environment or {}).get("OMS_MESH_ID", MESH_ID)
        environment = {
            "OMS_MESH_ID": self.mesh_id,  # whatever the caller's shell exports
            "OMS_SHARD_LOG": "etcd",
            "OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints),
            "OMS_SHARD_LEASE_TTL_S": str(LEASE_TTL_S),
            # Checkpoints often, so followers verify the leader's hashes many times.
            "OMS_SHARD_CHECKPOINT_ENTRIES": "16",
            **(environment or {}),
        }
        self.etcd_endpoints = etcd_endpoints
        self.replicas = [
            ReplicaProcess(
                folder / f"{self.shard_id}-{index}", shard_id=self.shard_id, environment=environment
            )
            for index in range(size)
        ]
        for replica in self.replicas:
            replica.environment["OMS_SHARD_ADVERTISE"] = replica.address

    def start(self) -> None:
        try:
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_serving()
            self.wait_leader()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def running(self) -> list[ReplicaProcess]:
        return [replica for replica in self.replicas if replica.running()]

    def restart_exited(self) -> list[ReplicaProcess]:
        """Start again every replica whose process ended, as its supervisor would (a
        replica is crash-only: it ends when it can no longer lead, or cannot reach
        etcd at its start); the ones restarted. It does not wait for them to serve
        (`wait_serving`)."""
        exited = [
            replica
            for replica in self.replicas
            if replica.process is not None and not replica.running()
        ]
        for replica in exited:
            replica.start()
        return exited

    def statuses(self) -> dict[ReplicaProcess, ReplicaStatus]:
        found = {}
        for replica in self.running():
            try:
                found[replica] = status_of(replica.address)
            except grpc.RpcError:
                continue  # starting, or stopped by a test
        return found

    def wait_leader(self, timeout_s: float = 30.0, *, other_than: int = 0) -> ReplicaProcess:
        """The replica leading a term newer than `other_than`, once there is one."""
        deadline = time.monotonic() + timeout_s
        while True:
            for replica, status in self.statuses().items():
                if status.leading and status.term > other_than:
                    return replica
            if time.monotonic() > deadline:
                tails = "\n".join(replica.log_tail(15) for replica in self.replicas)
                raise ServiceProcessError(f"no leader within {timeout_s:g} s\n{tails}")
            time.sleep(0.05)

    async def wait_agreed(self, timeout_s: float = 30.0) -> list[ReplicaStatus]:
        """Once every running replica is at one position, their statuses (hashes compared
        by the caller): the load must have stopped."""
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = await asyncio.to_thread(self.statuses)
            positions = {status.applied_position for status in statuses.values()}
            if len(statuses) == len(self.running()) and len(positions) == 1:
                return list(statuses.values())
            if time.monotonic() > deadline:
                raise AssertionError(f"replicas never reached one position: {statuses}")
            await asyncio.sleep(0.05)

    async def check_deposits(self, load: DepositLoad) -> list[ReplicaStatus]:
        """Every acknowledged deposit once on the leader; then one position and one hash
        on every running replica, followers having verified the leader's hashes. The
        load must have stopped. The replicas' statuses."""
        leader = await asyncio.to_thread(self.wait_leader)
        async with aio_channel(leader.address) as channel:
            shard = ShardClient(channel)
            for user_id in load.users:
                view = await shard.actor(user_id)
                assert balance(view, USDT).total == load.accepted[user_id], user_id
        statuses = await self.wait_agreed()
        assert len({status.state_hash for status in statuses}) == 1, statuses
        followers = [status for status in statuses if not status.leading]
        assert followers and all(status.checkpoints_verified > 0 for status in followers), statuses
        return statuses
