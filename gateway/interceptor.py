"""The one server interceptor: every OrderGateway and AdminGateway call passes here.

It authenticates the call (`Authenticator`), refuses a user key acting on
another account and a non-admin key calling the admin service, publishes the
caller in the `caller` context variable, continues the client's trace, counts
the call, and turns any `GatewayError` into its status code with the reason in
the trailing metadata `x-oms-reason`. A unary call gets its answer within the
request deadline (TIMEOUT when nothing else came first; `call_deadlines.py`). Handlers hold no
security code of their own. Health and status calls are not intercepted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from google.protobuf.message import Message
from opentelemetry import context as trace_context

from gateway.authentication import (
    ADMIN_SERVICE_PREFIX,
    AUTH_REASONS,
    ORDER_SERVICE_PREFIX,
    Authenticator,
    authorize_account,
    caller,
    count_error,
)
from gateway.call_deadlines import CallDeadlines
from gateway.core.refusals import GatewayError, deadline_passed
from gateway.credentials import KeyHolder
from gateway.signing import REASON_TRAILER
from gateway.statistics import GatewayCounters
from protos.oms.v1 import gateway_pb2
from services.observability.tracing import context_from_metadata

log = structlog.get_logger(__name__)
G = gateway_pb2


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


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: GatewayError) -> None:
    trailer = ((REASON_TRAILER, error.reason_name),) if error.reason else ()
    await context.abort(grpc.StatusCode[error.status], error.detail, trailing_metadata=trailer)


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
        *,
        deadline_s: float,
    ) -> None:
        self.authenticator = authenticator
        self.deadline_s = deadline_s
        # Unary calls: one sweep for every call's deadline (streams use asyncio.timeout
        # for their admission only, once per stream).
        self.deadlines = CallDeadlines(deadline_s)
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

    async def _admit_in_time(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any], request: Message | None
    ) -> None:
        """A stream is admitted (or refused) within the request deadline."""
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._admit(method, context, request)
        except TimeoutError as timeout:
            raise deadline_passed(self.deadline_s) from timeout

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
        deadlines = self.deadlines

        async def behaviour(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            watched = deadlines.watch()
            try:
                try:
                    await self._admit(method, context, request)
                    return await inner(request, context)
                except asyncio.CancelledError:
                    if not watched.expired:
                        raise  # the client went away, or the server stops
                    watched.task.uncancel()
                    raise deadline_passed(self.deadline_s) from None
                finally:
                    watched.finished = True
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
                await self._admit_in_time(method, context, request)
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
                await self._admit_in_time(method, context, None)
                async for response in inner(requests, context):
                    yield response
            except GatewayError as error:
                self._failed(method, error)
                await _abort(context, error)

        return behaviour
