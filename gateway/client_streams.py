"""The gateway's two streams from the client side: order updates, and batched Trade."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Self

import grpc

from gateway.signed_channel import DEFAULT_TIMEOUT_S, GatewayCallError, SignedChannel
from gateway.signing import REASON_TRAILER
from protos.oms.v1 import gateway_pb2, shard_pb2

ORDER_SERVICE = "/oms.v1.OrderGateway/"
MAX_TRADE_BATCH = 1_000


# What one TradeRequest carries.
TradeOrder = (
    gateway_pb2.PlaceOrderRequest
    | gateway_pb2.CancelOrderRequest
    | gateway_pb2.CancelAllOrdersRequest
)


class OrderUpdateStream:
    """The user's order updates; entering waits until the gateway has subscribed."""

    METHOD = ORDER_SERVICE + "StreamOrderUpdates"

    def __init__(self, signed: SignedChannel, user_id: int) -> None:
        self._signed = signed
        self._user_id = user_id
        self._call: Any = None

    async def __aenter__(self) -> Self:
        request = gateway_pb2.StreamOrderUpdatesRequest(user_id=self._user_id)
        call = self._signed.channel.unary_stream(
            self.METHOD,
            request_serializer=gateway_pb2.StreamOrderUpdatesRequest.SerializeToString,
            response_deserializer=shard_pb2.OrderUpdate.FromString,
        )(request, metadata=self._signed.metadata(self.METHOD, request))
        self._call = call
        await call.initial_metadata()
        if call.done():
            await self._raise_status()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._call is not None:
            self._call.cancel()

    async def next(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> shard_pb2.OrderUpdate:
        """The next update (TimeoutError if none comes in time)."""
        async with asyncio.timeout(timeout_s):
            try:
                update = await self._call.read()
            except grpc.aio.AioRpcError as error:
                raise GatewayCallError.of(error) from error
        if update is grpc.aio.EOF:
            await self._raise_status()
            raise GatewayCallError(grpc.StatusCode.OK, "", "the stream ended")
        message: shard_pb2.OrderUpdate = update
        return message

    def __aiter__(self) -> AsyncIterator[shard_pb2.OrderUpdate]:
        return self._updates()

    async def _updates(self) -> AsyncIterator[shard_pb2.OrderUpdate]:
        try:
            async for update in self._call:
                yield update
        except grpc.aio.AioRpcError as error:
            raise GatewayCallError.of(error) from error

    async def _raise_status(self) -> None:
        code = await self._call.code()
        if code != grpc.StatusCode.OK:
            reason = ""
            for key, value in await self._call.trailing_metadata() or ():
                if key == REASON_TRAILER:
                    reason = str(value)
            raise GatewayCallError(code, reason, await self._call.details() or "")


class TradeStream:
    """One Trade call: requests go out in batches, answers are filed by request id."""

    METHOD = ORDER_SERVICE + "Trade"

    def __init__(self, signed: SignedChannel, cancel_on_disconnect_ms: int = 0) -> None:
        self._signed = signed
        # Asked for on the first batch: the orders placed on this stream are cancelled
        # if it ends without a clean close (`close`, which `async with` does).
        self._cancel_on_disconnect_ms = cancel_on_disconnect_ms
        self._outgoing: asyncio.Queue[gateway_pb2.TradeRequestBatch | None] = asyncio.Queue()
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[gateway_pb2.TradeResponse]] = {}
        self.answers: Counter[int] = Counter()  # request id -> answers received
        self.error: GatewayCallError | None = None
        self._ended = asyncio.Event()
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._call = self._signed.channel.stream_stream(
            self.METHOD,
            request_serializer=gateway_pb2.TradeRequestBatch.SerializeToString,
            response_deserializer=gateway_pb2.TradeResponseBatch.FromString,
        )(self._requests(), metadata=self._signed.metadata(self.METHOD, None))
        # Nothing is written before the gateway admits the stream (its initial metadata):
        # a refusal racing a write could otherwise reach us as INTERNAL (grpc/grpc#36066).
        try:
            async with asyncio.timeout(DEFAULT_TIMEOUT_S):
                await self._call.initial_metadata()
        except grpc.aio.AioRpcError as error:
            raise GatewayCallError.of(error) from error
        except TimeoutError as error:
            self._call.cancel()
            raise GatewayCallError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "", "the gateway did not open the stream"
            ) from error
        if self._call.done():
            try:
                await self._call.read()
            except grpc.aio.AioRpcError as error:
                raise GatewayCallError.of(error) from error
            raise GatewayCallError(grpc.StatusCode.OK, "", "the stream ended at its start")
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Half-close, wait for the answers still owed (bounded), then end the call."""
        self._outgoing.put_nowait(None)
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DEFAULT_TIMEOUT_S):
                    await self._ended.wait()
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._call is not None:
            self._call.cancel()

    def request(self, order: TradeOrder) -> gateway_pb2.TradeRequest:
        request = gateway_pb2.TradeRequest(request_id=next(self._ids))
        if isinstance(order, gateway_pb2.PlaceOrderRequest):
            request.place.CopyFrom(order)
        elif isinstance(order, gateway_pb2.CancelAllOrdersRequest):
            request.cancel_all.CopyFrom(order)
        else:
            request.cancel.CopyFrom(order)
        return request

    async def submit(
        self,
        orders: Sequence[TradeOrder],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[gateway_pb2.TradeResponse]:
        """Send `orders` (in batches of at most 1,000) and return their answers in order."""
        requests = [self.request(order) for order in orders]
        for start in range(0, len(requests), MAX_TRADE_BATCH):
            self.send(
                gateway_pb2.TradeRequestBatch(requests=requests[start : start + MAX_TRADE_BATCH])
            )
        return await self.wait([request.request_id for request in requests], timeout_s)

    def send(self, batch: gateway_pb2.TradeRequestBatch) -> None:
        """Queue one batch as is (request ids are the caller's)."""
        loop = asyncio.get_running_loop()
        for request in batch.requests:
            self._waiting.setdefault(request.request_id, loop.create_future())
        if self._cancel_on_disconnect_ms:
            batch.cancel_on_disconnect_ms = self._cancel_on_disconnect_ms
            self._cancel_on_disconnect_ms = 0  # the first batch only
        self._outgoing.put_nowait(batch)

    def abort(self) -> None:
        """End the call at once, without a clean close (as a client that dies does)."""
        if self._call is not None:
            self._call.cancel()

    async def wait(
        self, request_ids: Sequence[int], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[gateway_pb2.TradeResponse]:
        async with asyncio.timeout(timeout_s):
            return [await self._waiting[request_id] for request_id in request_ids]

    async def ended(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> GatewayCallError | None:
        """Wait for the call to end; the error it ended with, if any."""
        async with asyncio.timeout(timeout_s):
            await self._ended.wait()
        return self.error

    async def _requests(self) -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
        while (batch := await self._outgoing.get()) is not None:
            yield batch

    async def _read(self) -> None:
        try:
            async for batch in self._call:
                for response in batch.responses:
                    self.answers[response.request_id] += 1
                    future = self._waiting.get(response.request_id)
                    if future is not None and not future.done():
                        future.set_result(response)
        except grpc.aio.AioRpcError as error:
            self.error = GatewayCallError.of(error)
        finally:
            self._ended.set()
            failure = self.error or GatewayCallError(grpc.StatusCode.OK, "", "the stream ended")
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(failure)
                    future.exception()
