"""An async client for the persister under test, plus direct SQL for assertions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import grpc

from protos.oms.v1 import persister_pb2, persister_pb2_grpc, shard_pb2, status_pb2, status_pb2_grpc
from tests.shard_service.shard_client import WAIT_S

REASON_KEY = "x-oms-reason"


class PersisterClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = persister_pb2_grpc.PersisterStub(channel)
        self.status_stub = status_pb2_grpc.StatusStub(channel)

    async def create_user(
        self,
        user_id: int = 0,
        *,
        tier: int = shard_pb2.USER_TIER_NORMAL,
        limits: shard_pb2.RiskLimits | None = None,
    ) -> persister_pb2.CreatedUser:
        request = persister_pb2.NewUser(user_id=user_id, tier=tier)  # type: ignore[arg-type]
        if limits is not None:
            request.risk_limits.CopyFrom(limits)
        created = await self.stub.CreateUser(request, timeout=WAIT_S)
        assert isinstance(created, persister_pb2.CreatedUser)
        return created

    async def stored_user(self, user_id: int) -> persister_pb2.StoredUser:
        stored = await self.stub.GetStoredUser(
            persister_pb2.UserQuery(user_id=user_id), timeout=WAIT_S
        )
        assert isinstance(stored, persister_pb2.StoredUser)
        return stored

    async def stored_order(self, order_id: str, user_id: int = 0) -> persister_pb2.StoredOrder:
        order = await self.stub.GetStoredOrder(
            persister_pb2.StoredOrderQuery(order_id=order_id, user_id=user_id), timeout=WAIT_S
        )
        assert isinstance(order, persister_pb2.StoredOrder)
        return order

    async def credential(self, api_key: str) -> persister_pb2.Credential:
        credential = await self.stub.GetCredential(
            persister_pb2.CredentialQuery(api_key=api_key), timeout=WAIT_S
        )
        assert isinstance(credential, persister_pb2.Credential)
        return credential

    async def prefetch(self, user_ids: Sequence[int]) -> None:
        await self.stub.Prefetch(persister_pb2.PrefetchRequest(user_ids=user_ids), timeout=WAIT_S)

    async def counters(self) -> dict[str, int]:
        report = await self.status_stub.GetStatus(status_pb2.StatusRequest(), timeout=WAIT_S)
        assert isinstance(report, status_pb2.StatusReport)
        return dict(report.counters)


def reason_of(error: grpc.aio.AioRpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == REASON_KEY:
            return str(value)
    return ""


@contextlib.asynccontextmanager
async def sql(database_url: str) -> AsyncIterator[Any]:
    """A direct connection for assertions and for crafting rows the persister must meet."""
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()
