"""Only the leader serves a replicated service's calls; a follower refuses them at once.

A server interceptor wraps the handlers of the services a host names as
leader-only: while the host does not lead, a call ends with UNAVAILABLE before
any of the service's code runs, with the leader's address (when known) in the
trailing metadata `x-oms-leader`, so a client moves on without waiting. Health
and the replicas' own calls pass through on every replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

LEADER_TRAILER = "x-oms-leader"
Context = Any  # grpc.aio.ServicerContext


class LeaderGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        services: Sequence[str],
        *,
        leading: Callable[[], bool],
        leader_address: Callable[[], str],
    ) -> None:
        self.prefixes = tuple(f"/{service}/" for service in services)
        self.leading = leading
        self.leader_address = leader_address
        self.refused = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not str(details.method).startswith(self.prefixes):
            return handler
        return self._gated(handler)

    async def _refuse(self, context: Context) -> None:
        self.refused += 1
        address = self.leader_address()
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"not the leader{f'; the leader is {address}' if address else ''}",
            trailing_metadata=((LEADER_TRAILER, address),),
        )

    def _gated(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        serializers = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: Context) -> Any:
                if not self.leading():
                    await self._refuse(context)
                return await inner_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, **serializers)
        if handler.unary_stream is not None:
            inner_unary_stream = handler.unary_stream

            async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                if not self.leading():
                    await self._refuse(context)
                async for response in inner_unary_stream(request, context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(unary_stream, **serializers)
        if handler.stream_unary is not None:
            inner_stream_unary = handler.stream_unary

            async def stream_unary(requests: Any, context: Context) -> Any:
                if not self.leading():
                    await self._refuse(context)
                return await inner_stream_unary(requests, context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, **serializers)
        inner_stream = handler.stream_stream

        async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
            if not self.leading():
                await self._refuse(context)
            async for response in inner_stream(requests, context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, **serializers)
