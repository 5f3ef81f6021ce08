"""`oms.v1.Persister`: the persister's small synchronous side, over gRPC.

Errors are gRPC status codes with the machine-readable reason (a
`PersisterErrorReason` name) in the trailing metadata key `x-oms-reason`:
ALREADY_EXISTS/USER_EXISTS, NOT_FOUND/UNKNOWN_KEY, UNKNOWN_USER or UNKNOWN_ORDER,
FAILED_PRECONDITION/KEY_REVOKED (a revoked key is not rotated), INTERNAL for a
credential that does not open under this persister's master key,
INVALID_ARGUMENT/INVALID_FIELD (the detail names the field), UNAVAILABLE when
PostgreSQL cannot be reached, UNAVAILABLE/BEHIND when a read's `as_of_position`
is not written within `read_wait_ms`. A refused call changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeAlias

import grpc
import structlog

from persister import answers
from persister.accounts import UserExistsError, create_user, new_user_problem
from persister.admin_reads import (
    audit_row,
    key_problem,
    page_size,
    read_audit_page,
    read_user_page,
    stored_user,
)
from persister.answers import AnswerSink
from persister.api_keys import (
    KeyRevokedError,
    UnknownKeyError,
    UnknownUserError,
    create_api_key,
    list_api_keys,
    new_key_of,
    new_key_problem,
    read_credential,
    revoke_api_key,
    rotate_api_key,
)
from persister.candle_reads import candle_problem, read_candles
from persister.counters import Counters
from persister.errors import StoreError, StoreUnavailable
from persister.history_reads import page_problem, read_fill_page, read_order_page, stored_fill
from persister.order_rows import read_order, read_order_by_client_id
from persister.secret_seal import MasterKey, SealError
from persister.store import Store
from persister.unknown_users import UnknownUsers
from persister.user_rows import INT64_MAX, StoredStateError, read_users, stored_state
from protos.oms.v1 import persister_pb2

log = structlog.get_logger(__name__)

SERVICE_NAME = "oms.v1.Persister"
REASON_KEY = "x-oms-reason"
MAX_PREFETCH_USERS = 10_000
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
Reason: TypeAlias = persister_pb2.PersisterErrorReason.ValueType

COUNTERS = (
    "users_created",
    "credential_reads",
    "credentials_unopened",
    "api_keys_created",
    "api_keys_revoked",
    "api_keys_rotated",
    "prefetch_requests",
    "prefetch_offers",
    "history_pages",
    "candle_reads",
    "reads_behind",
)


async def abort(context: Context, code: grpc.StatusCode, reason: Reason, message: str) -> NoReturn:
    name = persister_pb2.PersisterErrorReason.Name(reason)
    await context.abort(code, message, trailing_metadata=((REASON_KEY, name),))
    raise AssertionError("unreachable: abort raises")


class PersisterApi:
    def __init__(
        self,
        store: Store,
        shard: AnswerSink,
        unknown: UnknownUsers,
        counters: Counters,
        *,
        master: MasterKey,
        committed_through: Callable[[], int],
        wait_committed: Callable[[int], Awaitable[None]],
        read_wait_s: float,
    ) -> None:
        self.store = store
        self.shard = shard
        self.unknown = unknown
        self.counters = counters
        self.master = master
        self.committed_through = committed_through
        self.wait_committed = wait_committed
        self.read_wait_s = read_wait_s

    async def create_user(
        self, request: persister_pb2.NewUser, context: Context
    ) -> persister_pb2.CreatedUser:
        problem = new_user_problem(request)
        if problem:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, problem)
        try:
            created = await create_user(
                self.store, self.master, request, actor=request.actor or "unknown"
            )
        except UserExistsError as error:
            await abort(context, grpc.StatusCode.ALREADY_EXISTS, _USER_EXISTS, str(error))
        self.unknown.forget(created.user_id)
        self.counters.add("users_created")
        log.info("persister.user_created", user_id=created.user_id, tier=request.tier)
        return created

    async def get_credential(
        self, request: persister_pb2.CredentialQuery, context: Context
    ) -> persister_pb2.Credential:
        if not request.api_key:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, "api_key is empty"
            )
        try:
            async with self.store.session() as session:
                credential = await read_credential(session, self.master, request.api_key)
        except SealError as error:
            # Sealed under another master key, or damaged: no gateway may use it, and an
            # operator must look (the persister's master key is the likely cause).
            self.counters.add("credentials_unopened")
            log.error("persister.credential_unopened", error=str(error))
            await abort(context, grpc.StatusCode.INTERNAL, _UNSPECIFIED, str(error))
        self.counters.add("credential_reads")
        if credential is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, _UNKNOWN_KEY, "unknown api key")
        return credential

    async def create_api_key(
        self, request: persister_pb2.NewApiKey, context: Context
    ) -> persister_pb2.CreatedApiKey:
        problem = new_key_problem(
            request.kind,
            request.public_key,
            request.scopes,
            request.expires_at_ms,
            request.label,
        )
        if not 0 < request.user_id <= INT64_MAX:
            problem = "user_id out of range"
        if problem:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, problem)
        try:
            created = await create_api_key(self.store, self.master, new_key_of(request))
        except UnknownUserError as error:
            await abort(context, grpc.StatusCode.NOT_FOUND, _UNKNOWN_USER, str(error))
        self.counters.add("api_keys_created")
        log.info("persister.api_key_created", api_key=created.key.api_key, actor=request.actor)
        return created

    async def list_api_keys(
        self, request: persister_pb2.ApiKeyListQuery, context: Context
    ) -> persister_pb2.ApiKeyList:
        return await list_api_keys(self.store, request.user_id)

    async def revoke_api_key(
        self, request: persister_pb2.ApiKeyRevocation, context: Context
    ) -> persister_pb2.ApiKeyInfo:
        try:
            revoked = await revoke_api_key(self.store, request.api_key, request.actor)
        except UnknownKeyError as error:
            await abort(context, grpc.StatusCode.NOT_FOUND, _UNKNOWN_KEY, str(error))
        self.counters.add("api_keys_revoked")
        log.info("persister.api_key_revoked", api_key=request.api_key, actor=request.actor)
        return revoked

    async def rotate_api_key(
        self, request: persister_pb2.ApiKeyRotation, context: Context
    ) -> persister_pb2.CreatedApiKey:
        try:
            rotated = await rotate_api_key(
                self.store, self.master, request.api_key, request.public_key, request.actor
            )
        except UnknownKeyError as error:
            await abort(context, grpc.StatusCode.NOT_FOUND, _UNKNOWN_KEY, str(error))
        except KeyRevokedError as error:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, _KEY_REVOKED, str(error))
        except ValueError as error:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, str(error))
        self.counters.add("api_keys_rotated")
        log.info(
            "persister.api_key_rotated",
            api_key=request.api_key,
            successor=rotated.key.api_key,
            actor=request.actor,
        )
        return rotated

    async def get_stored_user(
        self, request: persister_pb2.UserQuery, context: Context
    ) -> persister_pb2.StoredUser:
        if not 0 < request.user_id <= INT64_MAX:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, "user_id out of range"
            )
        async with self.store.session() as session:
            rows = await read_users(session, [request.user_id])
        row = rows.get(request.user_id)
        if row is None:
            return persister_pb2.StoredUser(known=False)
        try:
            return persister_pb2.StoredUser(known=True, state=stored_state(row))
        except StoredStateError as error:
            await abort(context, grpc.StatusCode.DATA_LOSS, _UNSPECIFIED, str(error))

    async def get_stored_order(
        self, request: persister_pb2.StoredOrderQuery, context: Context
    ) -> persister_pb2.StoredOrder:
        if not request.order_id and not (request.client_order_id and request.user_id):
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                _INVALID_FIELD,
                "order_id, or client_order_id with user_id, is required",
            )
        await self._written_through(request.as_of_position, context)
        async with self.store.session() as session:
            if request.order_id:
                row = await read_order(session, request.order_id)
            else:
                row = await read_order_by_client_id(
                    session, request.user_id, request.client_order_id
                )
        # Another user's order is "not found", never "not yours".
        if row is None or (request.user_id and row["user_id"] != request.user_id):
            await abort(context, grpc.StatusCode.NOT_FOUND, _UNKNOWN_ORDER, "unknown order")
        return persister_pb2.StoredOrder(**row)

    async def list_orders(
        self, request: persister_pb2.OrderPageQuery, context: Context
    ) -> persister_pb2.OrderPage:
        problem = page_problem(request.user_id, request.limit, request.from_ms, request.to_ms)
        if problem:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, problem)
        await self._written_through(request.as_of_position, context)
        async with self.store.session() as session:
            page = await read_order_page(session, request)
        self.counters.add("history_pages")
        return persister_pb2.OrderPage(
            orders=[persister_pb2.StoredOrder(**row) for row in page.rows], more=page.more
        )

    async def list_stored_users(
        self, request: persister_pb2.StoredUserPageQuery, context: Context
    ) -> persister_pb2.StoredUserPage:
        size = page_size(request.limit)
        problem = key_problem(request.after_user_id, "after_user_id")
        if size is None or problem:
            detail = problem or "limit must be at most 1000"
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, detail)
        async with self.store.session() as session:
            page = await read_user_page(session, request.after_user_id, size)
        try:
            users = [stored_user(row) for row in page.rows]
        except StoredStateError as error:
            await abort(context, grpc.StatusCode.DATA_LOSS, _UNSPECIFIED, str(error))
        return persister_pb2.StoredUserPage(users=users, more=page.more)

    async def list_admin_audit(
        self, request: persister_pb2.AdminAuditQuery, context: Context
    ) -> persister_pb2.AdminAuditPage:
        size = page_size(request.limit)
        problem = key_problem(request.user_id, "user_id") or key_problem(
            request.before_audit_id, "before_audit_id"
        )
        if size is None or problem:
            detail = problem or "limit must be at most 1000"
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, detail)
        async with self.store.session() as session:
            page = await read_audit_page(session, request.user_id, request.before_audit_id, size)
        return persister_pb2.AdminAuditPage(
            rows=[audit_row(row) for row in page.rows], more=page.more
        )

    async def list_fills(
        self, request: persister_pb2.FillPageQuery, context: Context
    ) -> persister_pb2.FillPage:
        problem = page_problem(request.user_id, request.limit, request.from_ms, request.to_ms)
        if problem:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, problem)
        await self._written_through(request.as_of_position, context)
        async with self.store.session() as session:
            page = await read_fill_page(session, request)
        self.counters.add("history_pages")
        return persister_pb2.FillPage(fills=[stored_fill(row) for row in page.rows], more=page.more)

    async def read_candles(
        self, request: persister_pb2.CandleQuery, context: Context
    ) -> persister_pb2.CandlePage:
        if problem := candle_problem(request):
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, _INVALID_FIELD, problem)
        async with self.store.session() as session:
            page = await read_candles(session, request)
        self.counters.add("candle_reads")
        return page

    async def _written_through(self, position: int, context: Context) -> None:
        """Wait (bounded) until every write of the shard's log through `position` is
        committed: a read then sees everything the caller saw in the shard, and more."""
        if position <= self.committed_through():
            return
        try:
            async with asyncio.timeout(self.read_wait_s):
                await self.wait_committed(position)
        except TimeoutError:
            self.counters.add("reads_behind")
            await abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                _BEHIND,
                f"written through {self.committed_through()}, not yet {position}",
            )

    async def prefetch(
        self, request: persister_pb2.PrefetchRequest, context: Context
    ) -> persister_pb2.PrefetchAck:
        if len(request.user_ids) > MAX_PREFETCH_USERS:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                _INVALID_FIELD,
                f"at most {MAX_PREFETCH_USERS} users per prefetch",
            )
        wanted = [user for user in dict.fromkeys(request.user_ids) if 0 < user <= INT64_MAX]
        self.counters.add("prefetch_requests")
        if not wanted:
            return persister_pb2.PrefetchAck()
        async with self.store.session() as session:
            rows = await read_users(session, wanted)
        offers = []
        for user_id, row in rows.items():
            try:
                offers.append(answers.hydrate_user(user_id, 0, stored_state(row)))
            except StoredStateError as error:
                log.error("persister.stored_state_unreadable", user_id=user_id, error=str(error))
        if offers:
            await self.shard.send(offers)
        self.counters.add("prefetch_offers", len(offers))
        return persister_pb2.PrefetchAck()

    # --- wiring ---------------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        def unary(
            handler: Callable[[Any, Context], Awaitable[Any]], request_type: Any, response: Any
        ) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                _store_errors_as_status(handler),
                request_deserializer=request_type.FromString,
                response_serializer=response.SerializeToString,
            )

        handlers = {
            "CreateUser": unary(self.create_user, persister_pb2.NewUser, persister_pb2.CreatedUser),
            "GetCredential": unary(
                self.get_credential, persister_pb2.CredentialQuery, persister_pb2.Credential
            ),
            "GetStoredUser": unary(
                self.get_stored_user, persister_pb2.UserQuery, persister_pb2.StoredUser
            ),
            "GetStoredOrder": unary(
                self.get_stored_order, persister_pb2.StoredOrderQuery, persister_pb2.StoredOrder
            ),
            "ListOrders": unary(
                self.list_orders, persister_pb2.OrderPageQuery, persister_pb2.OrderPage
            ),
            "ReadCandles": unary(
                self.read_candles, persister_pb2.CandleQuery, persister_pb2.CandlePage
            ),
            "ListFills": unary(
                self.list_fills, persister_pb2.FillPageQuery, persister_pb2.FillPage
            ),
            "ListStoredUsers": unary(
                self.list_stored_users,
                persister_pb2.StoredUserPageQuery,
                persister_pb2.StoredUserPage,
            ),
            "ListAdminAudit": unary(
                self.list_admin_audit, persister_pb2.AdminAuditQuery, persister_pb2.AdminAuditPage
            ),
            "Prefetch": unary(
                self.prefetch, persister_pb2.PrefetchRequest, persister_pb2.PrefetchAck
            ),
            "CreateApiKey": unary(
                self.create_api_key, persister_pb2.NewApiKey, persister_pb2.CreatedApiKey
            ),
            "ListApiKeys": unary(
                self.list_api_keys, persister_pb2.ApiKeyListQuery, persister_pb2.ApiKeyList
            ),
            "RevokeApiKey": unary(
                self.revoke_api_key, persister_pb2.ApiKeyRevocation, persister_pb2.ApiKeyInfo
            ),
            "RotateApiKey": unary(
                self.rotate_api_key, persister_pb2.ApiKeyRotation, persister_pb2.CreatedApiKey
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )


_UNSPECIFIED = persister_pb2.PERSISTER_ERROR_REASON_UNSPECIFIED
_INVALID_FIELD = persister_pb2.PERSISTER_ERROR_REASON_INVALID_FIELD
_USER_EXISTS = persister_pb2.PERSISTER_ERROR_REASON_USER_EXISTS
_UNKNOWN_KEY = persister_pb2.PERSISTER_ERROR_REASON_UNKNOWN_KEY
_UNKNOWN_USER = persister_pb2.PERSISTER_ERROR_REASON_UNKNOWN_USER
_KEY_REVOKED = persister_pb2.PERSISTER_ERROR_REASON_KEY_REVOKED
_UNKNOWN_ORDER = persister_pb2.PERSISTER_ERROR_REASON_UNKNOWN_ORDER
_BEHIND = persister_pb2.PERSISTER_ERROR_REASON_BEHIND


def _store_errors_as_status(
    handler: Callable[[Any, Context], Awaitable[Any]],
) -> Callable[[Any, Context], Awaitable[Any]]:
    """PostgreSQL trouble as UNAVAILABLE (retry) or INTERNAL, with the reason unspecified."""

    async def handle(request: Any, context: Context) -> Any:
        try:
            return await handler(request, context)
        except StoreUnavailable as error:
            log.warning("persister.rpc_store_unavailable", error=str(error))
            await abort(context, grpc.StatusCode.UNAVAILABLE, _UNSPECIFIED, "database unavailable")
        except StoreError as error:
            log.error("persister.rpc_store_error", error=str(error))
            await abort(context, grpc.StatusCode.INTERNAL, _UNSPECIFIED, "database error")

    return handle
