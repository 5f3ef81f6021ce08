"""Authentication and authorization of every gateway call, in one server interceptor.

The interceptor wraps each handler of the two gateway services: it checks the
signed metadata (gateway.proto header), refuses a user key acting on another
account and a non-admin key calling the admin service, publishes the caller in
the `caller` context variable for the handler, counts the call, and turns any
`GatewayError` into its status code with the reason in `x-oms-reason`. Handlers
hold no security code of their own; the Trade stream checks each request's
account with `authorize_account`, the same rule.

Order of checks: credentials present, timestamp inside the window (before any
lookup, so replayed junk costs no persister call), key known, signature valid
(constant-time), then the account.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog
from google.protobuf.message import Message
from opentelemetry import context as trace_context

from gateway.credentials import CredentialDirectory, KeyHolder
from gateway.errors import GatewayError
from gateway.signing import (
    API_KEY_HEADER,
    REASON_TRAILER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
    signature_matches,
    signed_body,
)
from gateway.statistics import GatewayCounters
from protos.oms.v1 import gateway_pb2
from services.observability.tracing import context_from_metadata

log = structlog.get_logger(__name__)

ORDER_SERVICE_PREFIX = "/oms.v1.OrderGateway/"
ADMIN_SERVICE_PREFIX = "/oms.v1.AdminGateway/"
G = gateway_pb2

AUTH_REASONS = frozenset(
    {
        G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
        G.GATEWAY_ERROR_REASON_UNKNOWN_KEY,
        G.GATEWAY_ERROR_REASON_BAD_SIGNATURE,
        G.GATEWAY_ERROR_REASON_STALE_TIMESTAMP,
        G.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT,
        G.GATEWAY_ERROR_REASON_ADMIN_REQUIRED,
    }
)
VALIDATION_REASONS = frozenset(
    {
        G.GATEWAY_ERROR_REASON_INVALID_FIELD,
        G.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL,
        G.GATEWAY_ERROR_REASON_UNKNOWN_ASSET,
        G.GATEWAY_ERROR_REASON_OUT_OF_RANGE,
        G.GATEWAY_ERROR_REASON_BATCH_TOO_LARGE,
    }
)

# The authenticated key of the call being served (set by the interceptor).
caller: contextvars.ContextVar[KeyHolder] = contextvars.ContextVar("caller")


def count_error(counters: GatewayCounters, error: GatewayError) -> None:
    counters.add(f"errors.{error.reason_name.removeprefix('GATEWAY_ERROR_REASON_')}")
    if error.reason in AUTH_REASONS:
        counters.add("auth_failures")
    elif error.reason in VALIDATION_REASONS:
        counters.add("validation_failures")


def authorize_account(holder: KeyHolder, user_id: int) -> None:
    """A user key acts only on its own account; the admin key has no account."""
    if holder.admin or user_id != holder.user_id:
        raise GatewayError(
            G.GATEWAY_ERROR_REASON_NOT_YOUR_ACCOUNT,
            f"user_id {user_id} is not the account of key {holder.api_key}",
        )


class Authenticator:
    def __init__(
        self,
        credentials: CredentialDirectory,
        *,
        timestamp_window_ms: int,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.credentials = credentials
        self.timestamp_window_ms = timestamp_window_ms
        self.wall_clock_ms = wall_clock_ms

    async def authenticate(
        self, method: str, metadata: Sequence[tuple[str, Any]], request: Message | None
    ) -> KeyHolder:
        headers = _headers(metadata)
        api_key = headers.get(API_KEY_HEADER, "")
        timestamp_text = headers.get(TIMESTAMP_HEADER, "")
        offered = headers.get(SIGNATURE_HEADER, "")
        if not api_key or not timestamp_text or not offered:
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
                f"every call needs {API_KEY_HEADER}, {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}",
            )
        if not (timestamp_text.isascii() and timestamp_text.isdigit() and len(timestamp_text) < 19):
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_MISSING_CREDENTIALS,
                f"{TIMESTAMP_HEADER} must be the client's wall time in ms",
            )
        timestamp_ms = int(timestamp_text)
        skew_ms = timestamp_ms - self.wall_clock_ms()
        if abs(skew_ms) > self.timestamp_window_ms:
            raise GatewayError(
                G.GATEWAY_ERROR_REASON_STALE_TIMESTAMP,
                f"timestamp is {skew_ms} ms from the gateway's clock "
                f"(window {self.timestamp_window_ms} ms)",
            )
        holder = await self.credentials.holder(api_key)
        if holder is None:
            raise GatewayError(G.GATEWAY_ERROR_REASON_UNKNOWN_KEY, "unknown or disabled api key")
        expected = signature(holder.secret, timestamp_ms, method, signed_body(method, request))
        if not signature_matches(expected, offered):
            raise GatewayError(G.GATEWAY_ERROR_REASON_BAD_SIGNATURE, "signature does not match")
        return holder


class RefusalLog:
    """Security refusals in the log, at most one line per reason per second.

    A flood of bad requests must not become a flood of log lines; the counters
    still count every refusal, and each line says how many it stands for.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[int, tuple[float, int]] = {}  # reason -> (last line, refusals since)

    def note(self, method: str, error: GatewayError) -> None:
        now = self.clock()
        last, since = self._last.get(error.reason, (float("-inf"), 0))
        if now - last < 1.0:
            self._last[error.reason] = (last, since + 1)
            return
        self._last[error.reason] = (now, 0)
        log.info(
            "gateway.refused",
            method=method,
            reason=error.reason_name,
            detail=error.detail,
            unlogged_since_last=since,
        )


def _headers(metadata: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """The first value of each of our headers (text only; binary values are ignored)."""
    found: dict[str, str] = {}
    for key, value in metadata or ():
        wanted = key in (API_KEY_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
        if wanted and key not in found and isinstance(value, str):
            found[key] = value
    return found


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: GatewayError) -> None:
    trailer = ((REASON_TRAILER, error.reason_name),) if error.reason else ()
    await context.abort(error.code, error.detail, trailing_metadata=trailer)


class GatewayInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every OrderGateway and AdminGateway call passes here; health and status do not.

    Each method's handler is wrapped once and reused: the wrapper reads the call's
    metadata from its context, so nothing is built per call but the call itself.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        counters: GatewayCounters,
        on_user_authenticated: Callable[[int], None],
    ) -> None:
        self.authenticator = authenticator
        self.counters = counters
        self.on_user_authenticated = on_user_authenticated
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}
        self.refusals = RefusalLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None or not method.startswith((ORDER_SERVICE_PREFIX, ADMIN_SERVICE_PREFIX)):
            return handler
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **serializers
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(method, handler.unary_stream), **serializers
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream_stream(method, handler.stream_stream), **serializers
            )
        raise TypeError(f"the gateway serves no client-streaming call like {method}")

    # --- admission ------------------------------------------------------------------------

    async def _admit(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any], request: Message | None
    ) -> KeyHolder:
        self.counters.add(self._request_counter(method))
        metadata = context.invocation_metadata() or ()
        holder = await self.authenticator.authenticate(method, metadata, request)
        if method.startswith(ADMIN_SERVICE_PREFIX):
            if not holder.admin:
                raise GatewayError(
                    G.GATEWAY_ERROR_REASON_ADMIN_REQUIRED, "the admin API needs the admin key"
                )
        else:
            # Unary calls name their account in the request; a stream's requests are
            # checked one by one by its handler (the stream was signed with no body).
            authorize_account(holder, getattr(request, "user_id", holder.user_id))
            self.on_user_authenticated(holder.user_id)
        caller.set(holder)
        trace_parent = context_from_metadata(metadata)
        if trace_parent is not None:
            # The client's trace: spans the handler starts become its children.
            trace_context.attach(trace_parent)
        return holder

    @staticmethod
    def _request_counter(method: str) -> str:
        return "requests." + method.rsplit("/", 1)[1]

    def _failed(self, method: str, error: GatewayError) -> None:
        count_error(self.counters, error)
        if error.reason in AUTH_REASONS:
            log.info(
                "gateway.refused", method=method, reason=error.reason_name, detail=error.detail
            )

    def _unary(
        self, method: str, inner: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                await self._admit(method, context, request)
                return await inner(request, context)
            except GatewayError as error:
                self._failed(method, error)
                await _abort(context, error)

        return behaviour

    def _unary_stream(
        self, method: str, inner: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def behaviour(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            try:
                await self._admit(method, context, request)
                async for response in inner(request, context):
                    yield response
            except GatewayError as error:
                self._failed(method, error)
                await _abort(context, error)

        return behaviour

    def _stream_stream(
        self, method: str, inner: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def behaviour(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            try:
                await self._admit(method, context, None)
                async for response in inner(requests, context):
                    yield response
            except GatewayError as error:
                self._failed(method, error)
                await _abort(context, error)

        return behaviour
