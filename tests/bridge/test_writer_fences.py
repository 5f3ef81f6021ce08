"""The shard and the matcher check the fencing token of a leader-only writer (a shard's
bridge, its reconciler): a real shard and a real matcher process, the role's leader key
in a real etcd, and `Execute` calls carrying `x-oms-writer` as the holder's would.

A stream of the holder's term is served; once the key is taken by a newer term and a
call of that term has been admitted, the old term's next batch ends its stream with
FAILED_PRECONDITION (what it sent before is answered), and no new stream of it opens;
a term etcd does not name, or one whose key is gone, is refused; a malformed token is
INVALID_ARGUMENT; a call without a token (the gateway's) is served as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys
from services.coordination.writer_tokens import (
    WRITER_METADATA_KEY,
    WriterFenced,
    WriterFences,
    WriterToken,
)
from tests.matcher_service.matcher_messages import OrderFactory, batch, cancel
from tests.matcher_service.matcher_process import MatcherProcess
from tests.shard_service.shard_client import ExecuteStream, wait_until
from tests.shard_service.shard_client import cancel as shard_cancel
from tests.shard_service.shard_process import ShardProcess, aio_channel

SHARD = "s1"
ANSWER_TIMEOUT_S = 10.0


@pytest.fixture
def mesh_id() -> str:
    return "fence-" + secrets.token_hex(4)


@pytest.fixture
def environment(etcd_endpoints: tuple[str, ...], mesh_id: str) -> dict[str, str]:
    """A receiver that checks tokens against this test's mesh in the session's etcd."""
    return {"OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints), "OMS_MESH_ID": mesh_id}


@pytest.fixture
async def etcd(etcd_endpoints: tuple[str, ...], mesh_id: str) -> AsyncIterator[EtcdSession]:
    async with EtcdSession(etcd_endpoints) as session:
        yield session
        prefix = GroupKeys.of(mesh_id, "bridge", SHARD).prefix
        await session.transaction((), deletes=((prefix, prefix + b"\xff"),))
        prefix = GroupKeys.of(mesh_id, "reconciler", SHARD).prefix
        await session.transaction((), deletes=((prefix, prefix + b"\xff"),))


async def _take_role(etcd: EtcdSession, mesh_id: str, role: str) -> WriterToken:
    """Hand the role to a new term, as a campaign after the holder's lease ran out."""
    leader = GroupKeys.of(mesh_id, role, SHARD).leader
    await etcd.delete(leader)
    created, entry = await etcd.create(leader, b"test", lease=0)
    assert created and entry is not None
    return WriterToken(role, SHARD, entry.create_revision)


def _writer(token: WriterToken) -> tuple[tuple[str, str], ...]:
    return (token.header(),)


# --- the matcher: the bridge's term -----------------------------------------------------


async def _probe_matcher(
    call: grpc.aio.StreamStreamCall[object, object],
) -> grpc.aio.StreamStreamCall[object, object]:
    """One batch on `call`, its answer read (a cancel of an order the matcher never saw:
    refused, nothing changes)."""
    order = OrderFactory(SHARD).limit(1, 1, 100)
    await call.write(batch(cancel(order)))
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        answer = await call.read()
    assert isinstance(answer, matcher_pb2.MatcherResultBatch), answer
    assert len(answer.results) == 1
    return call


async def _refused_at_opening(call: grpc.aio.StreamStreamCall[object, object]) -> grpc.StatusCode:
    """The status the matcher ended a new call with, before anything was sent on it."""
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        return await call.code()


async def _refused_on_next_batch(
    call: grpc.aio.StreamStreamCall[object, object],
) -> grpc.StatusCode:
    """Send a batch on an admitted call; the status the matcher ended it with."""
    order = OrderFactory(SHARD).limit(1, 1, 100)
    await call.write(batch(cancel(order)))
    with contextlib.suppress(grpc.aio.AioRpcError):
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            answer = await call.read()
        assert answer is grpc.aio.EOF, answer
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        return await call.code()


async def test_the_matcher_serves_only_the_bridge_s_current_term(
    tmp_path: Path, environment: dict[str, str], etcd: EtcdSession, mesh_id: str
) -> None:
    with MatcherProcess(tmp_path / "matcher", environment=environment) as matcher:
        await _matcher_fences(matcher, etcd, mesh_id)


async def _matcher_fences(matcher: MatcherProcess, etcd: EtcdSession, mesh_id: str) -> None:
    first = await _take_role(etcd, mesh_id, "bridge")
    async with aio_channel(matcher.address) as channel:
        stub = matcher_pb2_grpc.MatcherStub(channel)
        old = await _probe_matcher(stub.Execute(metadata=_writer(first)))
        await _probe_matcher(old)  # every batch of the holder's term

        second = await _take_role(etcd, mesh_id, "bridge")
        new = await _probe_matcher(stub.Execute(metadata=_writer(second)))
        assert await _refused_on_next_batch(old) == grpc.StatusCode.FAILED_PRECONDITION
        assert await _refused_at_opening(stub.Execute(metadata=_writer(first))) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        await _probe_matcher(new)

        unknown = WriterToken("bridge", SHARD, second.term + 1_000)
        assert await _refused_at_opening(stub.Execute(metadata=_writer(unknown))) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        malformed = ((WRITER_METADATA_KEY, "bridge/s1/not-a-term"),)
        assert await _refused_at_opening(stub.Execute(metadata=malformed)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        await _probe_matcher(stub.Execute())  # no token: not a leader-only writer


# --- the shard: the reconciler's (and the bridge's) term ---------------------------------


async def test_the_shard_serves_only_the_reconciler_s_current_term(
    tmp_path: Path, environment: dict[str, str], etcd: EtcdSession, mesh_id: str
) -> None:
    with ShardProcess(tmp_path / "shard", environment=environment) as shard:
        await _shard_fences(shard, etcd, mesh_id)


async def _shard_fences(shard: ShardProcess, etcd: EtcdSession, mesh_id: str) -> None:
    first = await _take_role(etcd, mesh_id, "reconciler")
    async with aio_channel(shard.address) as channel:
        old = ExecuteStream(channel, _writer(first))
        probe = shard_cancel(0, "probe")  # refused statically: nothing changes
        assert not (await old.run(probe))[0].accepted

        second = await _take_role(etcd, mesh_id, "reconciler")
        new = ExecuteStream(channel, _writer(second))
        assert not (await new.run(shard_cancel(0, "probe")))[0].accepted

        old.send(shard_cancel(0, "probe"))
        await wait_until(lambda: old.closed, timeout_s=ANSWER_TIMEOUT_S)
        assert old.error is not None
        assert old.error.code() == grpc.StatusCode.FAILED_PRECONDITION, old.error

        again = ExecuteStream(channel, _writer(first))  # refused as it opens
        await wait_until(lambda: again.closed, timeout_s=ANSWER_TIMEOUT_S)
        assert again.error is not None
        assert again.error.code() == grpc.StatusCode.FAILED_PRECONDITION, again.error

        # The key gone (the holder resigned, nobody holds the role): its term is over.
        await etcd.delete(GroupKeys.of(mesh_id, "reconciler", SHARD).leader)
        gone = ExecuteStream(channel, _writer(WriterToken("reconciler", SHARD, second.term + 1)))
        await wait_until(lambda: gone.closed, timeout_s=ANSWER_TIMEOUT_S)
        assert gone.error is not None
        assert gone.error.code() == grpc.StatusCode.FAILED_PRECONDITION, gone.error

        assert not (await new.run(shard_cancel(0, "probe")))[0].accepted
        plain = ExecuteStream(channel)  # the gateway's: no token
        assert not (await plain.run(shard_cancel(0, "probe")))[0].accepted
        for stream in (new, plain):
            stream.cancel()


async def test_without_etcd_a_newer_term_still_fences_out_the_older() -> None:
    fences = WriterFences((), "test")  # a receiver with no etcd endpoints
    old, new = WriterToken("bridge", SHARD, 5), WriterToken("bridge", SHARD, 9)
    await fences.admit(old)
    fences.check(old)
    await fences.admit(new)
    with pytest.raises(WriterFenced):
        fences.check(old)
    with pytest.raises(WriterFenced):
        await fences.admit(old)
    fences.check(new)
    assert (fences.admitted, fences.refused) == (2, 2)
