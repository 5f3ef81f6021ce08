"""gRPC calls to a server in the same process, without gRPC: a channel that runs the
server's own handlers on this event loop.

When a shard cluster runs in one process (`oms shard --colocate`: the shard replica,
its persister, its bridge and its reconciler), the three roles still call the shard
through the same generated stubs and the same `ShardLink`, through a channel
`mesh_channel` hands out for the shard's own address. A call here costs what the
handlers cost plus a task switch per message, where gRPC spent 150 to 200 µs of CPU
per message on each side and a wake-up of each process (README, "Cost per order").

What the handlers see is what a gRPC server gives them: the same interceptors (a
follower's `LeaderGate` refuses here too), the call's metadata, `abort` ending the
call with a status the caller receives as `grpc.aio.AioRpcError`, and cancellation
when the caller cancels. Messages cross as objects where both sides use the same
message type; a side that works in wire bytes (the shard's Execute and its egress
frames) is met by encoding or decoding on the other side, never both, unless its
handler, told the call is in-process, hands over the messages themselves. Server
streams are bounded queues (`STREAM_WINDOW` messages), as HTTP/2's flow control
bounds a real stream. Only what the mesh's callers use is implemented: unary and
streaming calls, `initial_metadata`, `code`, `details`, `done`, `cancel`; a call's
`write`/`done_writing` (a request stream without an iterator) is not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

STREAM_WINDOW = 32  # messages a server stream runs ahead of its reader
Metadata = tuple[tuple[str, str | bytes], ...]
_REGISTRY: dict[str, InProcessServer] = {}


def serve_in_process(addresses: Iterable[str], server: InProcessServer) -> None:
    """Reach `server` in this process at each of `addresses` (through `channel_for`)."""
    for address in addresses:
        if address:
            _REGISTRY[address] = server


def stop_serving_in_process(server: InProcessServer) -> None:
    for address in [a for a, s in _REGISTRY.items() if s is server]:
        del _REGISTRY[address]


def channel_for(address: str) -> InProcessChannel | None:
    """An in-process channel to `address` if a server of this process is there."""
    server = _REGISTRY.get(address)
    return None if server is None else InProcessChannel(server, address)


@dataclass(frozen=True, slots=True)
class _CallDetails:
    method: str
    invocation_metadata: Metadata


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = trailing


class InProcessServer:
    """A server's handlers and interceptors, as `register` functions add them to a
    `grpc.aio.Server` (this has the one method they call)."""

    def __init__(self, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> None:
        self.interceptors = tuple(interceptors)
        self._generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    async def handler(self, method: str, metadata: Metadata) -> grpc.RpcMethodHandler | None:
        async def terminal(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            for generic in self._generic:
                found = generic.service(details)
                if found is not None:
                    return found
            return None

        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]] = terminal
        for interceptor in reversed(self.interceptors):
            continuation = _chained(interceptor, continuation)
        return await continuation(_CallDetails(method, metadata))


def _chained(
    interceptor: grpc.aio.ServerInterceptor,
    continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]],
) -> Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]]:
    async def call(details: Any) -> grpc.RpcMethodHandler | None:
        return await interceptor.intercept_service(continuation, details)

    return call


class _Context:
    """What a handler may ask of its call (`grpc.aio.ServicerContext`'s parts in use)."""

    # A handler may look at this: one whose responses are wire bytes may hand an
    # in-process caller objects that read as the messages instead (the shard's egress).
    in_process = True

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        self.initial: asyncio.Future[Metadata] = asyncio.get_running_loop().create_future()
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        if not self.initial.done():
            self.initial.set_result(tuple(metadata))

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()
    ) -> None:
        raise _Aborted(code, details, tuple(trailing_metadata))

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def peer(self) -> str:
        return "in-process"


def _error(
    code: grpc.StatusCode, details: str, initial: Metadata = (), trailing: Metadata = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code,
        grpc.aio.Metadata(*initial),
        grpc.aio.Metadata(*trailing),
        details=details,
        debug_error_string=f"in-process: {code.name}: {details}",
    )


def _failure(error: BaseException, context: _Context) -> grpc.aio.AioRpcError:
    initial = context.initial.result() if context.initial.done() else ()
    if isinstance(error, _Aborted):
        return _error(error.code, error.details, initial, error.trailing)
    if isinstance(error, grpc.aio.AioRpcError):
        return error
    return _error(grpc.StatusCode.UNKNOWN, f"{type(error).__name__}: {error}", initial)


def _converter(
    encode: Callable[[Any], bytes] | None, decode: Callable[[bytes], Any] | None
) -> Callable[[Any], Any]:
    """From one side's form of a message to the other's: bytes to a message, a message
    to bytes, or the object itself when both sides use messages (or both bytes). A
    side that declares bytes but hands an object (`_Context.in_process`) is passed
    through as it is."""
    if encode is None and decode is not None:

        def decoded(message: Any) -> Any:
            return decode(message) if isinstance(message, bytes) else message

        return decoded
    if encode is not None and decode is None:
        return encode
    return _same


def _same(message: Any) -> Any:
    return message


_END = object()  # a server stream's end, behind its messages


class _Call:
    """One call. Its server side runs in a task of its own, as on a real server; it
    ends with a status the caller can ask for (`code`, `details`)."""

    def __init__(self, metadata: Metadata, work: Callable[[_Context], Awaitable[Any]]) -> None:
        self.context = _Context(metadata)
        self._status: grpc.StatusCode | None = None
        self._details = ""
        self._task: asyncio.Task[Any] = asyncio.ensure_future(work(self.context))
        self._task.add_done_callback(self._finish)

    def _finish(self, task: asyncio.Task[Any]) -> None:
        """The call's status, once its task is done (idempotent)."""
        if self._status is not None:
            return
        if task.cancelled():
            self._status, self._details = grpc.StatusCode.CANCELLED, "cancelled"
        elif (error := task.exception()) is not None:
            failure = _failure(error, self.context)
            self._status, self._details = failure.code(), failure.details() or ""
        else:
            self._status = grpc.StatusCode.OK
        if not self.context.initial.done():
            self.context.initial.set_result(())

    def _raise_status(self) -> None:
        """Raise the call's failure (its task is done)."""
        if self._task.cancelled():
            raise _error(grpc.StatusCode.CANCELLED, "cancelled")
        error = self._task.exception()
        if error is not None:
            raise _failure(error, self.context) from error

    def cancel(self) -> bool:
        if self._task.done():
            return False
        self._task.cancel()
        return True

    def cancelled(self) -> bool:
        return self._task.cancelled()

    def done(self) -> bool:
        return self._task.done()

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata(*(await asyncio.shield(self.context.initial)))

    async def code(self) -> grpc.StatusCode:
        await asyncio.wait((self._task,))
        self._finish(self._task)  # its done callback may not have run yet
        assert self._status is not None
        return self._status

    async def details(self) -> str:
        await self.code()
        return self._details


class _UnaryResponseCall(_Call):
    """Awaited for its one response."""

    def __await__(self) -> Any:
        return self._response().__await__()

    async def _response(self) -> Any:
        try:
            await asyncio.wait((self._task,))
        except asyncio.CancelledError:
            self._task.cancel()  # the caller was cancelled: so is its call
            raise
        self._raise_status()
        return self._task.result()


class _StreamResponseCall(_Call):
    """Read (`read`, `async for`) for its responses; at most `STREAM_WINDOW` wait."""

    def __init__(
        self, metadata: Metadata, responses: Callable[[_Context], AsyncIterator[Any]]
    ) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(STREAM_WINDOW)

        async def pump(context: _Context) -> None:
            stream = responses(context)
            try:
                async for message in stream:
                    await self._queue.put(message)
            finally:
                with contextlib.suppress(BaseException):
                    await stream.aclose()  # type: ignore[attr-defined]

        super().__init__(metadata, pump)

    def _finish(self, task: asyncio.Task[Any]) -> None:
        super()._finish(task)
        # A reader blocked on an empty queue wakes to the end; with a full one, the
        # reader has messages left and sees the end (the task done) after them.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_END)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not grpc.aio.EOF:
            yield message

    async def read(self) -> Any:
        if self._queue.empty() and self._task.done():
            self._raise_status()
            return grpc.aio.EOF
        message = await self._queue.get()
        if message is _END:
            self._queue.put_nowait(_END)  # for the next read too
            self._raise_status()
            return grpc.aio.EOF
        return message


async def _requests(requests: Any, convert: Callable[[Any], Any]) -> AsyncIterator[Any]:
    if hasattr(requests, "__aiter__"):
        async for request in requests:
            yield convert(request)
    else:
        for request in requests:
            yield convert(request)


class InProcessChannel:
    """`grpc.aio.Channel`'s calls, answered by an `InProcessServer` of this process."""

    def __init__(self, server: InProcessServer, address: str) -> None:
        self.server = server
        self.address = address

    async def __aenter__(self) -> InProcessChannel:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        """Nothing to release: each call ends with its caller."""

    async def channel_ready(self) -> None:
        """Always ready: the server is this process."""

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    # grpc.aio.Channel's four kinds of call, each `(method, request_serializer,
    # response_deserializer)` giving the callable a stub keeps.
    def unary_unary(self, method: str, *codec: Any, **options: Any) -> Callable[..., _Call]:
        return self._multicallable("unary_unary", method, *codec, **options)

    def unary_stream(self, method: str, *codec: Any, **options: Any) -> Callable[..., _Call]:
        return self._multicallable("unary_stream", method, *codec, **options)

    def stream_unary(self, method: str, *codec: Any, **options: Any) -> Callable[..., _Call]:
        return self._multicallable("stream_unary", method, *codec, **options)

    def stream_stream(self, method: str, *codec: Any, **options: Any) -> Callable[..., _Call]:
        return self._multicallable("stream_stream", method, *codec, **options)

    def _multicallable(
        self,
        kind: str,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        **_: Any,
    ) -> Callable[..., Any]:
        server = self.server

        def call(
            request: Any = None,
            *,
            timeout: float | None = None,
            metadata: Sequence[tuple[str, str | bytes]] | None = None,
            **_: Any,
        ) -> _Call:
            invocation = tuple(metadata or ())

            async def resolved() -> tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]:
                handler = await server.handler(method, invocation)
                if handler is None:
                    raise _Aborted(grpc.StatusCode.UNIMPLEMENTED, f"no method {method}", ())
                inward = _converter(request_serializer, handler.request_deserializer)
                outward = _converter(handler.response_serializer, response_deserializer)
                return handler, inward, outward

            if kind in ("unary_unary", "stream_unary"):

                async def answer(context: _Context) -> Any:
                    async with _deadline(timeout):
                        handler, inward, outward = await resolved()
                        if kind == "unary_unary":
                            response = await handler.unary_unary(inward(request), context)
                        else:
                            requests = _requests(request, inward)
                            response = await handler.stream_unary(requests, context)
                        return outward(response)

                return _UnaryResponseCall(invocation, answer)

            async def responses(context: _Context) -> AsyncIterator[Any]:
                async with _deadline(timeout):
                    handler, inward, outward = await resolved()
                    if kind == "unary_stream":
                        stream = handler.unary_stream(inward(request), context)
                    else:
                        stream = handler.stream_stream(_requests(request, inward), context)
                    async for message in stream:
                        yield outward(message)

            return _StreamResponseCall(invocation, responses)

        return call


@contextlib.asynccontextmanager
async def _deadline(seconds: float | None) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as error:
        raise _Aborted(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", ()) from error
