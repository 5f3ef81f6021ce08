"""The in-process channel answers as a gRPC server would: the same handlers and
interceptors, metadata both ways, statuses as `AioRpcError`, deadlines, cancellation,
and messages in the form each side uses (objects, or wire bytes on one side).

Each case runs the same calls against a real `grpc.aio` server with the same handlers,
so a difference between the two would show as a failure here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest as Request

from services.clients.in_process import (
    InProcessChannel,
    InProcessServer,
    channel_for,
    serve_in_process,
    stop_serving_in_process,
)

SERVICE = "test.Echo"


class EchoServicer:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def echo(self, request: Request, context: Any) -> Request:
        if request.service == "abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "told to")
        if request.service == "slow":
            await asyncio.sleep(30)
        key = dict(context.invocation_metadata()).get("x-key", "")
        return Request(service=f"{request.service}:{key}")

    async def count(self, request: Request, context: Any) -> AsyncIterator[bytes]:
        await context.send_initial_metadata((("x-opened", "yes"),))
        try:
            for number in range(int(request.service)):
                yield Request(service=str(number)).SerializeToString()
                await asyncio.sleep(0)
            if int(request.service) == 3:
                await context.abort(grpc.StatusCode.OUT_OF_RANGE, "three is too many")
            await asyncio.sleep(30)  # never ends by itself
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def total(self, requests: AsyncIterator[Request], context: Any) -> Request:
        seen = [request.service async for request in requests]
        return Request(service="+".join(seen))

    async def chat(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Request]:
        async for payload in requests:
            yield Request(service=Request.FromString(payload).service.upper())

    def register(self, server: Any) -> None:
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(
                self.echo,
                request_deserializer=Request.FromString,
                response_serializer=Request.SerializeToString,
            ),
            "Count": grpc.unary_stream_rpc_method_handler(
                self.count, request_deserializer=Request.FromString, response_serializer=None
            ),
            "Total": grpc.stream_unary_rpc_method_handler(
                self.total,
                request_deserializer=Request.FromString,
                response_serializer=Request.SerializeToString,
            ),
            "Chat": grpc.stream_stream_rpc_method_handler(
                self.chat, request_deserializer=None, response_serializer=Request.SerializeToString
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


class RefuseMarked(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls whose metadata says `x-refuse` (as the LeaderGate refuses)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if "x-refuse" not in dict(details.invocation_metadata or ()):
            return handler

        async def refuse(request: Any, context: Any) -> Any:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "refused", (("x-why", "marked"),))

        return grpc.unary_unary_rpc_method_handler(
            refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@asynccontextmanager
async def channel(kind: str, servicer: EchoServicer) -> AsyncIterator[Any]:
    if kind == "grpc":
        server = grpc.aio.server(interceptors=(RefuseMarked(),))
        servicer.register(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as real:
                yield real
        finally:
            await server.stop(0)
        return
    local = InProcessServer(interceptors=(RefuseMarked(),))
    servicer.register(local)
    serve_in_process(["test-address:1"], local)
    try:
        found = channel_for("test-address:1")
        assert isinstance(found, InProcessChannel)
        yield found
    finally:
        stop_serving_in_process(local)
    assert channel_for("test-address:1") is None


KINDS = ("grpc", "in-process")


def method(open_channel: Any, name: str, kind: str, *, raw_request: bool = False) -> Any:
    serializer = None if raw_request else Request.SerializeToString
    factory = getattr(open_channel, kind)
    return factory(
        f"/{SERVICE}/{name}",
        request_serializer=serializer,
        response_deserializer=Request.FromString,
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_unary_calls_metadata_aborts_interceptors_and_deadlines(kind: str) -> None:
    servicer = EchoServicer()
    async with channel(kind, servicer) as open_channel:
        echo = method(open_channel, "Echo", "unary_unary")
        answer = await echo(Request(service="hi"), metadata=(("x-key", "k1"),))
        assert answer.service == "hi:k1"
        with pytest.raises(grpc.aio.AioRpcError) as aborted:
            await echo(Request(service="abort"))
        assert aborted.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert aborted.value.details() == "told to"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await echo(Request(service="x"), metadata=(("x-refuse", "1"),))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("x-why", "marked") in tuple(refused.value.trailing_metadata() or ())
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await echo(Request(service="slow"), timeout=0.2)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        missing = open_channel.unary_unary(
            f"/{SERVICE}/Nope",
            request_serializer=Request.SerializeToString,
            response_deserializer=Request.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await missing(Request())
        assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("kind", KINDS)
async def test_a_server_stream_in_order_with_its_status_and_cancel(kind: str) -> None:
    servicer = EchoServicer()
    async with channel(kind, servicer) as open_channel:
        count = method(open_channel, "Count", "unary_stream")
        call = count(Request(service="3"))
        assert ("x-opened", "yes") in tuple(await call.initial_metadata())
        seen = []
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for message in call:
                seen.append(message.service)
        assert seen == ["0", "1", "2"]
        assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert await call.code() == grpc.StatusCode.OUT_OF_RANGE and call.done()

        endless = count(Request(service="2"))
        assert (await endless.read()).service == "0"
        assert (await endless.read()).service == "1"
        endless.cancel()
        async with asyncio.timeout(5):
            await servicer.cancelled.wait()
        assert await endless.code() == grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("kind", KINDS)
async def test_client_streams_from_iterators_and_async_generators(kind: str) -> None:
    servicer = EchoServicer()
    async with channel(kind, servicer) as open_channel:
        total = method(open_channel, "Total", "stream_unary")
        answer = await total(iter([Request(service="a"), Request(service="b")]))
        assert answer.service == "a+b"

        async def requests() -> AsyncIterator[bytes]:
            for word in ("x", "y"):
                yield Request(service=word).SerializeToString()

        chat = method(open_channel, "Chat", "stream_stream", raw_request=True)
        call = chat(requests())
        assert [message.service async for message in call] == ["X", "Y"]
        assert await call.code() == grpc.StatusCode.OK


async def test_a_stream_runs_at_most_its_window_ahead_of_its_reader() -> None:
    """Flow control: a reader that stops reading stops the producer."""
    produced = 0

    async def flood(request: Request, context: Any) -> AsyncIterator[Request]:
        nonlocal produced
        while True:
            produced += 1
            yield Request(service=str(produced))

    server = InProcessServer()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Flood": grpc.unary_stream_rpc_method_handler(
                        flood,
                        request_deserializer=Request.FromString,
                        response_serializer=Request.SerializeToString,
                    )
                },
            ),
        )
    )
    local = InProcessChannel(server, "flood")
    call = method(local, "Flood", "unary_stream")(Request())
    assert (await call.read()).service == "1"
    for _ in range(10):
        await asyncio.sleep(0)
    assert produced < 100
    call.cancel()
