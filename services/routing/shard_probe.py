"""What a wave controller asks of each cluster's shard, over its public gRPC queries.

Which epoch the shard has logged and how many resident users it is letting go of
(`GetStatus`: `routing_epoch`, `leaving_users`), whether it still holds given users
(`GetActor`: resident, which includes a user whose flush is under way), and who is
resident (`ListUsers`). Every answer comes from the shard's applied state: what the
shard decided at a log position, not what a cache believes. A cluster's address is
given (`s1=host:port`) or found by its leader's key in etcd.

With `leader_wait_s` (omsctl's: `LEADER_WAIT_S`), a question asked during an
election (the leader gone, its key not yet expired or not yet taken, or a follower
answering "not the leader") waits for the new leader, asking again every
`LEADER_RETRY_S` for at most that long, and says once that it waits ("waiting for a
leader of s2", through `on_wait`), rather than failing at once. The wave controller
and the operator keep 0, the default: they have their own deadlines and retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from protos.oms.v1 import shard_pb2, shard_pb2_grpc
from services.clients.call_failures import call_failure
from services.clients.channels import mesh_channel
from services.coordination.addresses import (
    FROM_ETCD,
    AddressSource,
    NoLeaderError,
    address_source,
)
from services.coordination.errors import CoordinationUnavailable

T = TypeVar("T")
CALL_TIMEOUT_S = 5.0
PAGE = 1_000
LEADER_WAIT_S = 20.0  # a 2 s lease, the election, and a loaded machine
LEADER_RETRY_S = 0.2
# What a shard group answers while it has no leader to answer: no process at the
# address, a follower ("not the leader"), or an old leader that is stopped or cut off
# and answers nothing (its key lingers until its lease runs out).
_ELECTION_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class ShardUnreachableError(RuntimeError):
    """A cluster's shard did not answer (the message says which and why)."""


def _page_after(
    after_user_id: int,
) -> Callable[[shard_pb2_grpc.UserShardStub], Awaitable[shard_pb2.UserPage]]:
    request = shard_pb2.UserPageRequest(after_user_id=after_user_id, limit=PAGE)
    return lambda stub: stub.ListUsers(request, timeout=CALL_TIMEOUT_S)


class ShardProbe:
    def __init__(
        self,
        addresses: Mapping[str, str],
        *,
        etcd_endpoints: Sequence[str],
        mesh_id: str,
        leader_wait_s: float = 0.0,
        on_wait: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.addresses = dict(addresses)
        self.leader_wait_s = leader_wait_s
        self.on_wait = on_wait
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.mesh_id = mesh_id
        self._sources: dict[str, AddressSource] = {}
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}

    async def routing_state(self, cluster_id: str) -> tuple[int, int]:
        """(the newest routing epoch the shard has logged, its leaving users)."""
        status = await self._ask(
            cluster_id,
            lambda stub: stub.GetStatus(shard_pb2.ShardStatusRequest(), timeout=CALL_TIMEOUT_S),
        )
        return int(status.counters["routing_epoch"]), int(status.counters["leaving_users"])

    async def holds(self, cluster_id: str, user_ids: Sequence[int]) -> set[int]:
        """Those of `user_ids` resident in the shard (a flush under way included)."""

        def actor(user: int) -> Callable[[shard_pb2_grpc.UserShardStub], Awaitable[Any]]:
            return lambda stub: stub.GetActor(
                shard_pb2.ActorQuery(user_id=user, orders_only=True), timeout=CALL_TIMEOUT_S
            )

        views = await asyncio.gather(*(self._ask(cluster_id, actor(user)) for user in user_ids))
        return {user for user, view in zip(user_ids, views, strict=True) if view.resident}

    async def residents(self, cluster_id: str) -> list[int]:
        """Every resident user, by id."""
        users: list[int] = []
        after = 0
        while True:
            page = await self._ask(cluster_id, _page_after(after))
            users.extend(page.user_ids)
            if not page.next_after_user_id:
                return users
            after = page.next_after_user_id

    async def close(self) -> None:
        for _, channel in self._channels.values():
            await channel.close()
        for source in self._sources.values():
            await source.close()

    async def _stub(self, cluster_id: str) -> shard_pb2_grpc.UserShardStub:
        source = self._sources.get(cluster_id)
        if source is None:
            setting = self.addresses.get(cluster_id, FROM_ETCD)
            if setting == FROM_ETCD and not self.etcd_endpoints:
                raise ShardUnreachableError(f"no address for cluster {cluster_id}")
            source = self._sources[cluster_id] = address_source(
                setting,
                kind="shard",
                name=cluster_id,
                etcd_endpoints=self.etcd_endpoints,
                mesh_id=self.mesh_id,
            )
        try:
            address = await source.resolve()
        except NoLeaderError:
            raise  # an election: `_ask` waits for its end
        except CoordinationUnavailable as error:
            raise ShardUnreachableError(f"cluster {cluster_id}: {error}") from error
        known = self._channels.get(cluster_id)
        if known is None or known[0] != address:
            if known is not None:
                await known[1].close()
            known = self._channels[cluster_id] = (address, mesh_channel(address))
        return shard_pb2_grpc.UserShardStub(known[1])

    async def _ask(
        self,
        cluster_id: str,
        call: Callable[[shard_pb2_grpc.UserShardStub], Awaitable[T]],
    ) -> T:
        """`call` on the cluster's leader, waiting through an election (bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.leader_wait_s
        said = False
        while True:
            try:
                return await call(await self._stub(cluster_id))
            except grpc.aio.AioRpcError as error:
                failure = ShardUnreachableError(
                    f"cluster {cluster_id}'s shard: {call_failure(error, CALL_TIMEOUT_S)}"
                )
                if error.code() not in _ELECTION_CODES:
                    raise failure from error
            except NoLeaderError as error:
                failure = ShardUnreachableError(f"cluster {cluster_id}: {error}")
            if loop.time() >= deadline:
                raise failure
            if not said:
                self.on_wait(f"waiting for a leader of {cluster_id} ({failure})")
                said = True
            await self._forget(cluster_id)  # the next try looks the leader up again
            await asyncio.sleep(LEADER_RETRY_S)

    async def _forget(self, cluster_id: str) -> None:
        known = self._channels.pop(cluster_id, None)
        if known is not None:
            await known[1].close()
        source = self._sources.pop(cluster_id, None)
        if source is not None:
            await source.close()
