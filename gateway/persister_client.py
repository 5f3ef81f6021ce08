"""The gateway's calls to the persister: credentials, accounts, cold reads, hydrate-ahead.

Every call has a deadline; a persister that cannot answer becomes
`GatewayError(UNAVAILABLE)` (the client retries), and the persister's own
NOT_FOUND / ALREADY_EXISTS become `None` or the contract's reasons.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from gateway.errors import GatewayError, unavailable
from protos.oms.v1 import gateway_pb2, persister_pb2, persister_pb2_grpc
from services.clients.channels import mesh_channel


class PersisterClient:
    def __init__(self, address: str, *, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = mesh_channel(address)
        self._stub = persister_pb2_grpc.PersisterStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def credential(self, api_key: str) -> persister_pb2.Credential | None:
        """The key's credential, or None when the persister does not know the key."""
        try:
            credential: persister_pb2.Credential = await self._stub.GetCredential(
                persister_pb2.CredentialQuery(api_key=api_key), timeout=self.timeout_s
            )
            return credential
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._unavailable("GetCredential", error) from error

    async def create_user(self, new_user: persister_pb2.NewUser) -> persister_pb2.CreatedUser:
        try:
            created: persister_pb2.CreatedUser = await self._stub.CreateUser(
                new_user, timeout=self.timeout_s
            )
            return created
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.ALREADY_EXISTS:
                raise GatewayError(
                    gateway_pb2.GATEWAY_ERROR_REASON_USER_EXISTS,
                    f"user {new_user.user_id} already exists",
                ) from error
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # The gateway's own checks should have caught it; pass the persister's word on.
                raise GatewayError(
                    gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD, error.details() or ""
                ) from error
            raise self._unavailable("CreateUser", error) from error

    async def stored_user(self, user_id: int) -> persister_pb2.StoredUser:
        try:
            stored: persister_pb2.StoredUser = await self._stub.GetStoredUser(
                persister_pb2.UserQuery(user_id=user_id), timeout=self.timeout_s
            )
            return stored
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return persister_pb2.StoredUser(known=False)
            raise self._unavailable("GetStoredUser", error) from error

    async def stored_order(
        self, query: persister_pb2.StoredOrderQuery
    ) -> persister_pb2.StoredOrder | None:
        """The order by id or client order id, as of `query.as_of_position`; None if unknown."""
        try:
            order: persister_pb2.StoredOrder = await self._stub.GetStoredOrder(
                query, timeout=self.timeout_s
            )
            return order
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._refused("GetStoredOrder", error) from error

    async def order_page(self, query: persister_pb2.OrderPageQuery) -> persister_pb2.OrderPage:
        try:
            page: persister_pb2.OrderPage = await self._stub.ListOrders(
                query, timeout=self.timeout_s
            )
            return page
        except grpc.aio.AioRpcError as error:
            raise self._refused("ListOrders", error) from error

    async def fill_page(self, query: persister_pb2.FillPageQuery) -> persister_pb2.FillPage:
        try:
            page: persister_pb2.FillPage = await self._stub.ListFills(query, timeout=self.timeout_s)
            return page
        except grpc.aio.AioRpcError as error:
            raise self._refused("ListFills", error) from error

    async def prefetch(self, user_ids: Sequence[int]) -> None:
        try:
            await self._stub.Prefetch(
                persister_pb2.PrefetchRequest(user_ids=user_ids), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise self._unavailable("Prefetch", error) from error

    def _refused(self, call: str, error: grpc.aio.AioRpcError) -> GatewayError:
        """A read the persister refused: a field the gateway let through, or unavailable."""
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            return GatewayError(
                gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD, error.details() or ""
            )
        return self._unavailable(call, error)

    def _unavailable(self, call: str, error: grpc.aio.AioRpcError) -> GatewayError:
        return unavailable(f"persister {call}: {error.code().name} {error.details() or ''}".strip())
