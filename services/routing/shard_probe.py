"""What a wave controller asks of each cluster's shard, over its public gRPC queries.

Which epoch the shard has logged and how many resident users it is letting go of
(`GetStatus`: `routing_epoch`, `leaving_users`), whether it still holds given users
(`GetActor`: resident, which includes a user whose flush is under way), and who is
resident (`ListUsers`). Every answer comes from the shard's applied state: what the
shard decided at a log position, not what a cache believes. A cluster's address is
given (`s1=host:port`) or found by its leader's key in etcd.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import TypeVar

import grpc

from protos.oms.v1 import shard_pb2, shard_pb2_grpc
from services.clients.channels import mesh_channel
from services.coordination.addresses import FROM_ETCD, AddressSource, address_source
from services.coordination.errors import CoordinationUnavailable

T = TypeVar("T")
CALL_TIMEOUT_S = 5.0
PAGE = 1_000


class ShardUnreachableError(RuntimeError):
    """A cluster's shard did not answer (the message says which and why)."""


class ShardProbe:
    def __init__(
        self, addresses: Mapping[str, str], *, etcd_endpoints: Sequence[str], mesh_id: str
    ) -> None:
        self.addresses = dict(addresses)
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.mesh_id = mesh_id
        self._sources: dict[str, AddressSource] = {}
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}

    async def routing_state(self, cluster_id: str) -> tuple[int, int]:
        """(the newest routing epoch the shard has logged, its leaving users)."""
        stub = await self._stub(cluster_id)
        status = await self._call(
            cluster_id, stub.GetStatus(shard_pb2.ShardStatusRequest(), timeout=CALL_TIMEOUT_S)
        )
        return int(status.counters["routing_epoch"]), int(status.counters["leaving_users"])

    async def holds(self, cluster_id: str, user_ids: Sequence[int]) -> set[int]:
        """Those of `user_ids` resident in the shard (a flush under way included)."""
        stub = await self._stub(cluster_id)
        views = await asyncio.gather(
            *(
                self._call(
                    cluster_id,
                    stub.GetActor(
                        shard_pb2.ActorQuery(user_id=user, orders_only=True),
                        timeout=CALL_TIMEOUT_S,
                    ),
                )
                for user in user_ids
            )
        )
        return {user for user, view in zip(user_ids, views, strict=True) if view.resident}

    async def residents(self, cluster_id: str) -> list[int]:
        """Every resident user, by id."""
        stub = await self._stub(cluster_id)
        users: list[int] = []
        after = 0
        while True:
            page = await self._call(
                cluster_id,
                stub.ListUsers(
                    shard_pb2.UserPageRequest(after_user_id=after, limit=PAGE),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
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
        except CoordinationUnavailable as error:
            raise ShardUnreachableError(f"cluster {cluster_id}: {error}") from error
        known = self._channels.get(cluster_id)
        if known is None or known[0] != address:
            if known is not None:
                await known[1].close()
            known = self._channels[cluster_id] = (address, mesh_channel(address))
        return shard_pb2_grpc.UserShardStub(known[1])

    @staticmethod
    async def _call(cluster_id: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except grpc.aio.AioRpcError as error:
            raise ShardUnreachableError(
                f"cluster {cluster_id}: {error.code().name} {error.details() or ''}".strip()
            ) from error
