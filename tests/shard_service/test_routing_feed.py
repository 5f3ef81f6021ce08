"""A real shard process follows the routing document in a real etcd: each newer epoch is
logged (`SetRouting`), a command for a user the document gives to another shard is
refused with NOT_OWNER and the shard's epoch, and a later epoch that gives the user to
this shard lets the same command through, also after a restart."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from protos.oms.v1 import shard_pb2, shard_pb2_grpc
from services.coordination.etcd_session import EtcdSession
from services.routing.core.hrw import rendezvous_owner
from services.routing.core.routing_document import Cluster, ClusterState, RoutingDocument
from services.routing.routing_store import RoutingStore, StoredRouting, routing_key
from tests.shard_service.shard_client import ExecuteStream, deposit, hydrate
from tests.shard_service.shard_process import ShardProcess, aio_channel

SHARD, OTHER = "s1", "s2"
EPOCH_TIMEOUT_S = 15.0


def _document(epoch: int, pins: dict[int, str] | None = None) -> RoutingDocument:
    clusters = [Cluster(SHARD, ClusterState.ACTIVE), Cluster(OTHER, ClusterState.ACTIVE)]
    return RoutingDocument.build(epoch, clusters, pins=pins)


@pytest.fixture
async def store(etcd_endpoints: tuple[str, ...]) -> AsyncIterator[tuple[RoutingStore, str]]:
    mesh_id = "feed-" + secrets.token_hex(4)
    async with EtcdSession(etcd_endpoints) as session:
        yield RoutingStore(session, mesh_id), mesh_id
        await session.delete(routing_key(mesh_id))


async def _deposit_answer(stream: ExecuteStream, user_id: int) -> shard_pb2.ShardResult:
    (correlation_id,) = stream.send(deposit(user_id, 5))
    return await stream.wait_final(correlation_id)


async def test_the_shard_logs_each_epoch_and_refuses_users_it_does_not_own(
    tmp_path: Path,
    etcd_endpoints: tuple[str, ...],
    store: tuple[RoutingStore, str],
) -> None:
    routing, mesh_id = store
    theirs = next(u for u in range(1, 1000) if rendezvous_owner(u, [SHARD, OTHER]) == OTHER)
    mine = next(u for u in range(1, 1000) if rendezvous_owner(u, [SHARD, OTHER]) == SHARD)
    first: StoredRouting = await routing.swap(None, _document(1))
    environment = {"OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints), "OMS_MESH_ID": mesh_id}
    shard = ShardProcess(tmp_path / "shard", environment=environment)
    with shard:
        async with aio_channel(shard.address) as channel:
            stream = ExecuteStream(channel)
            stream.send(hydrate(mine, balances=[("USDT", 100)]))
            stream.send(hydrate(theirs, balances=[("USDT", 100)]))

            answers: list[shard_pb2.ShardResult] = []

            async def refused_with_epoch(epoch: int) -> bool:
                answers.append(await _deposit_answer(stream, theirs))
                last = answers[-1]
                return last.reject_reason == shard_pb2.SHARD_REJECT_REASON_NOT_OWNER and (
                    last.routing_epoch == epoch
                )

            await _until(lambda: refused_with_epoch(1), answers)
            assert answers[-1].retryable and not answers[-1].accepted
            assert (await _deposit_answer(stream, mine)).accepted

            # Epoch 2 pins the other shard's user here: the same command goes through,
            # once the user is hydrated here (a hydration of a user this shard did not
            # own was dropped; with a persister the deposit would have asked for one).
            await routing.swap(first, _document(2, pins={theirs: SHARD}))
            # Only then hydrate: a hydration that lands before the shard logs epoch 2 is
            # dropped, and a deposit after it parks for a hydration no persister sends.
            status = shard_pb2_grpc.UserShardStub(channel)

            async def at_epoch_2() -> bool:
                reply = await status.GetStatus(shard_pb2.ShardStatusRequest(), timeout=5)
                return bool(reply.counters["routing_epoch"] == 2)

            await _until(at_epoch_2, answers)

            async def hydrated_and_accepted() -> bool:
                stream.send(hydrate(theirs, balances=[("USDT", 100)]))
                return await _accepted(stream, theirs)

            await _until(hydrated_and_accepted, answers)
            stream.cancel()

    # Restarted on its folder: it still decides with epoch 2.
    with shard:
        async with aio_channel(shard.address) as channel:
            stream = ExecuteStream(channel)
            assert (await _deposit_answer(stream, theirs)).accepted
            stream.cancel()


async def _accepted(stream: ExecuteStream, user_id: int) -> bool:
    return (await _deposit_answer(stream, user_id)).accepted


async def _until(
    check: Callable[[], Awaitable[bool]], answers: list[shard_pb2.ShardResult]
) -> None:
    """Ask `check()` again until it holds (the shard logs an epoch a moment after etcd
    has it), within EPOCH_TIMEOUT_S."""
    deadline = time.monotonic() + EPOCH_TIMEOUT_S
    while not await check():
        assert time.monotonic() < deadline, answers[-3:]
        await asyncio.sleep(0.05)
