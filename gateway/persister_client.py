"""The gateway's calls to one shard's persister: credentials, accounts, cold reads,
hydrate-ahead.

Every call has a deadline; a persister that cannot answer becomes
`GatewayError(UNAVAILABLE)` (the client retries), and the persister's own
NOT_FOUND / ALREADY_EXISTS become `None` or the contract's reasons. Its address is a
fixed one or its leader's in etcd, resolved when a call needs a (new) channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from gateway.core.refusals import GatewayError, unavailable
from protos.oms.v1 import gateway_pb2, persister_pb2, persister_pb2_grpc
from services.clients.channels import mesh_channel
from services.coordination.addresses import AddressSource, FixedAddress
from services.coordination.errors import CoordinationUnavailable

AnswerT = TypeVar("AnswerT", bound=Message)


class PersisterClient:
    def __init__(self, address: AddressSource | str, *, timeout_s: float) -> None:
        self.source = FixedAddress(address) if isinstance(address, str) else address
        self.address = self.source.describe()
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._channel_address = ""
        self._stub_now: persister_pb2_grpc.PersisterStub | None = None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        await self.source.close()

    async def _stub(self) -> persister_pb2_grpc.PersisterStub:
        try:
            address = await self.source.resolve()
        except CoordinationUnavailable as error:
            raise unavailable(f"persister {self.address}: {error}") from error
        if self._stub_now is None or address != self._channel_address:
            if self._channel is not None:
                await self._channel.close()
            self._channel = mesh_channel(address)
            self._channel_address = self.address = address
            self._stub_now = persister_pb2_grpc.PersisterStub(self._channel)
        return self._stub_now

    async def credential(self, api_key: str) -> persister_pb2.Credential | None:
        """The key's credential, or None when the persister does not know the key."""
        try:
            stub = await self._stub()
            credential: persister_pb2.Credential = await stub.GetCredential(
                persister_pb2.CredentialQuery(api_key=api_key), timeout=self.timeout_s
            )
            return credential
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._unavailable("GetCredential", error) from error

    async def create_user(self, new_user: persister_pb2.NewUser) -> persister_pb2.CreatedUser:
        try:
            stub = await self._stub()
            created: persister_pb2.CreatedUser = await stub.CreateUser(
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
            stub = await self._stub()
            stored: persister_pb2.StoredUser = await stub.GetStoredUser(
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
            stub = await self._stub()
            order: persister_pb2.StoredOrder = await stub.GetStoredOrder(
                query, timeout=self.timeout_s
            )
            return order
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._refused("GetStoredOrder", error) from error

    async def order_page(self, query: persister_pb2.OrderPageQuery) -> persister_pb2.OrderPage:
        try:
            stub = await self._stub()
            page: persister_pb2.OrderPage = await stub.ListOrders(query, timeout=self.timeout_s)
            return page
        except grpc.aio.AioRpcError as error:
            raise self._refused("ListOrders", error) from error

    async def fill_page(self, query: persister_pb2.FillPageQuery) -> persister_pb2.FillPage:
        try:
            stub = await self._stub()
            page: persister_pb2.FillPage = await stub.ListFills(query, timeout=self.timeout_s)
            return page
        except grpc.aio.AioRpcError as error:
            raise self._refused("ListFills", error) from error

    async def candles(self, query: persister_pb2.CandleQuery) -> persister_pb2.CandlePage:
        try:
            stub = await self._stub()
            page: persister_pb2.CandlePage = await stub.ReadCandles(query, timeout=self.timeout_s)
            return page
        except grpc.aio.AioRpcError as error:
            raise self._refused("ReadCandles", error) from error

    async def prefetch(self, user_ids: Sequence[int]) -> None:
        try:
            stub = await self._stub()
            await stub.Prefetch(
                persister_pb2.PrefetchRequest(user_ids=user_ids), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise self._unavailable("Prefetch", error) from error

    async def admin_call(
        self, call: str, request: Message, response_type: type[AnswerT]
    ) -> AnswerT:
        """One of the persister's admin calls (CreateApiKey, ListApiKeys, RevokeApiKey,
        RotateApiKey, ListStoredUsers, ListAdminAudit), its refusals as the gateway's
        reasons. Not retried elsewhere: a create that timed out may have made a key,
        which ListApiKeys shows."""
        try:
            stub = await self._stub()
            answer: AnswerT = await getattr(stub, call)(request, timeout=self.timeout_s)
            return answer
        except grpc.aio.AioRpcError as error:
            code, detail = error.code(), error.details() or ""
            if code == grpc.StatusCode.NOT_FOUND:
                trailers = dict(error.trailing_metadata() or ())
                unknown_user = trailers.get("x-oms-reason") == "PERSISTER_ERROR_REASON_UNKNOWN_USER"
                reason = (
                    gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_USER
                    if unknown_user
                    else gateway_pb2.GATEWAY_ERROR_REASON_KEY_NOT_FOUND
                )
                raise GatewayError(reason, detail) from error
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                raise GatewayError(gateway_pb2.GATEWAY_ERROR_REASON_KEY_REVOKED, detail) from error
            raise self._refused(call, error) from error

    def _refused(self, call: str, error: grpc.aio.AioRpcError) -> GatewayError:
        """A read the persister refused: a field the gateway let through, or unavailable."""
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            return GatewayError(
                gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD, error.details() or ""
            )
        return self._unavailable(call, error)

    def _unavailable(self, call: str, error: grpc.aio.AioRpcError) -> GatewayError:
        return unavailable(f"persister {call}: {error.code().name} {error.details() or ''}".strip())
