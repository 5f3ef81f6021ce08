"""A small asyncio client of the gateway: signs every call, speaks both APIs.

    async with OmsClient(address, user_id=7, api_key=key, api_secret=secret) as oms:
        ack = await oms.place("c-1", "BTC-USDT", SIDE_BUY, price_ticks=6_500_000, quantity_lots=3)
        async with oms.order_updates() as updates:     # live once entered
            update = await updates.next()
        async with oms.trade() as stream:              # the batched Trade stream
            answers = await stream.submit([place_request, cancel_request, ...])

A refusal by the gateway raises `GatewayCallError` carrying the status code and
the contract's reason name (`x-oms-reason`); a refusal by the shard is an ack
with `accepted = false`, as the contract says. `AdminClient` does the same for
the admin API with the admin key.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
from google.protobuf.message import Message

from gateway.signing import REASON_TRAILER, signed_metadata
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from services.clients.channels import mesh_channel

ORDER_SERVICE = "/oms.v1.OrderGateway/"
ADMIN_SERVICE = "/oms.v1.AdminGateway/"
MAX_TRADE_BATCH = 1_000
DEFAULT_TIMEOUT_S = 15.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GatewayCallError(Exception):
    """The gateway refused a call: status code, reason name (gateway.proto) and detail."""

    def __init__(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        super().__init__(f"{code.name} {reason or '-'}: {detail}")
        self.code = code
        self.reason = reason
        self.detail = detail

    @classmethod
    def of(cls, error: grpc.aio.AioRpcError) -> GatewayCallError:
        reason = ""
        for key, value in error.trailing_metadata() or ():
            if key == REASON_TRAILER:
                reason = str(value)
        return cls(error.code(), reason, error.details() or "")


class _SignedChannel:
    """One channel and one key: every call carries fresh signed metadata."""

    def __init__(
        self,
        address: str,
        api_key: str,
        api_secret: str,
        *,
        channel: grpc.aio.Channel | None,
        clock_ms: Callable[[], int],
        timeout_s: float,
    ) -> None:
        self.address = address
        self.api_key = api_key
        self.api_secret = api_secret
        self.clock_ms = clock_ms
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self.channel = channel if channel is not None else mesh_channel(address)

    def metadata(self, method: str, request: Message | None) -> tuple[tuple[str, str], ...]:
        return signed_metadata(self.api_key, self.api_secret, method, request, self.clock_ms())

    async def unary(self, method: str, request: Message, response_type: type[Any]) -> Any:
        call = self.channel.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            return await call(
                request, metadata=self.metadata(method, request), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise GatewayCallError.of(error) from error

    async def close(self) -> None:
        if self._own_channel:
            await self.channel.close()


class OmsClient:
    """The public API, for one user's key."""

    def __init__(
        self,
        address: str,
        *,
        user_id: int,
        api_key: str,
        api_secret: str,
        channel: grpc.aio.Channel | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.user_id = user_id
        self._signed = _SignedChannel(
            address, api_key, api_secret, channel=channel, clock_ms=clock_ms, timeout_s=timeout_s
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._signed.close()

    # --- orders ---------------------------------------------------------------------------

    def place_request(
        self,
        client_order_id: str,
        symbol: str,
        side: int,
        *,
        order_type: int = common_pb2.ORDER_TYPE_LIMIT,
        time_in_force: int = common_pb2.TIME_IN_FORCE_GTC,
        price_ticks: int = 0,
        quantity_lots: int = 0,
        quote_amount: int = 0,
        expire_at_ms: int = 0,
        self_trade_prevention: int = 0,
    ) -> gateway_pb2.PlaceOrderRequest:
        return gateway_pb2.PlaceOrderRequest(
            user_id=self.user_id,
            client_order_id=client_order_id,
            symbol=symbol,
            side=side,  # type: ignore[arg-type]
            order_type=order_type,  # type: ignore[arg-type]
            time_in_force=time_in_force,  # type: ignore[arg-type]
            price_ticks=price_ticks,
            quantity_lots=quantity_lots,
            quote_amount=quote_amount,
            expire_at_ms=expire_at_ms,
            self_trade_prevention=self_trade_prevention,  # type: ignore[arg-type]
        )

    async def place(
        self, client_order_id: str, symbol: str, side: int, **fields: Any
    ) -> gateway_pb2.OrderAck:
        return await self.place_order(self.place_request(client_order_id, symbol, side, **fields))

    async def place_order(self, request: gateway_pb2.PlaceOrderRequest) -> gateway_pb2.OrderAck:
        ack: gateway_pb2.OrderAck = await self._signed.unary(
            ORDER_SERVICE + "PlaceOrder", request, gateway_pb2.OrderAck
        )
        return ack

    async def cancel(
        self, *, order_id: str = "", client_order_id: str = ""
    ) -> gateway_pb2.CancelAck:
        request = gateway_pb2.CancelOrderRequest(
            user_id=self.user_id, order_id=order_id, client_order_id=client_order_id
        )
        ack: gateway_pb2.CancelAck = await self._signed.unary(
            ORDER_SERVICE + "CancelOrder", request, gateway_pb2.CancelAck
        )
        return ack

    # --- queries --------------------------------------------------------------------------

    async def get_order(
        self, *, order_id: str = "", client_order_id: str = ""
    ) -> gateway_pb2.OrderView:
        request = gateway_pb2.GetOrderRequest(
            user_id=self.user_id, order_id=order_id, client_order_id=client_order_id
        )
        view: gateway_pb2.OrderView = await self._signed.unary(
            ORDER_SERVICE + "GetOrder", request, gateway_pb2.OrderView
        )
        return view

    async def open_orders(self, symbol: str = "") -> list[gateway_pb2.OrderView]:
        request = gateway_pb2.GetOpenOrdersRequest(user_id=self.user_id, symbol=symbol)
        answer: gateway_pb2.OpenOrders = await self._signed.unary(
            ORDER_SERVICE + "GetOpenOrders", request, gateway_pb2.OpenOrders
        )
        return list(answer.orders)

    async def balances(self) -> dict[str, shard_pb2.AssetBalance]:
        request = gateway_pb2.GetBalancesRequest(user_id=self.user_id)
        answer: gateway_pb2.Balances = await self._signed.unary(
            ORDER_SERVICE + "GetBalances", request, gateway_pb2.Balances
        )
        return {balance.asset: balance for balance in answer.balances}

    async def positions(self) -> gateway_pb2.Positions:
        request = gateway_pb2.GetPositionsRequest(user_id=self.user_id)
        answer: gateway_pb2.Positions = await self._signed.unary(
            ORDER_SERVICE + "GetPositions", request, gateway_pb2.Positions
        )
        return answer

    # --- streams --------------------------------------------------------------------------

    def order_updates(self) -> OrderUpdateStream:
        return OrderUpdateStream(self._signed, self.user_id)

    def trade(self) -> TradeStream:
        return TradeStream(self._signed)


class OrderUpdateStream:
    """The user's order updates; entering waits until the gateway has subscribed."""

    METHOD = ORDER_SERVICE + "StreamOrderUpdates"

    def __init__(self, signed: _SignedChannel, user_id: int) -> None:
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

    def __init__(self, signed: _SignedChannel) -> None:
        self._signed = signed
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
                await asyncio.wait_for(asyncio.shield(self._ended.wait()), DEFAULT_TIMEOUT_S)
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._call is not None:
            self._call.cancel()

    def request(
        self, order: gateway_pb2.PlaceOrderRequest | gateway_pb2.CancelOrderRequest
    ) -> gateway_pb2.TradeRequest:
        request = gateway_pb2.TradeRequest(request_id=next(self._ids))
        if isinstance(order, gateway_pb2.PlaceOrderRequest):
            request.place.CopyFrom(order)
        else:
            request.cancel.CopyFrom(order)
        return request

    async def submit(
        self,
        orders: Sequence[gateway_pb2.PlaceOrderRequest | gateway_pb2.CancelOrderRequest],
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
        self._outgoing.put_nowait(batch)

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


class AdminClient:
    """The admin API, with the admin key."""

    def __init__(
        self,
        address: str,
        *,
        api_key: str,
        api_secret: str,
        channel: grpc.aio.Channel | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._signed = _SignedChannel(
            address, api_key, api_secret, channel=channel, clock_ms=clock_ms, timeout_s=timeout_s
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._signed.close()

    async def create_user(
        self,
        user_id: int = 0,
        *,
        tier: int = shard_pb2.USER_TIER_NORMAL,
        risk_limits: shard_pb2.RiskLimits | None = None,
    ) -> gateway_pb2.CreateUserResponse:
        request = gateway_pb2.CreateUserRequest(user_id=user_id, tier=tier)  # type: ignore[arg-type]
        if risk_limits is not None:
            request.risk_limits.CopyFrom(risk_limits)
        created: gateway_pb2.CreateUserResponse = await self._signed.unary(
            ADMIN_SERVICE + "CreateUser", request, gateway_pb2.CreateUserResponse
        )
        return created

    async def deposit(
        self, user_id: int, asset: str, amount: int, transfer_id: str
    ) -> gateway_pb2.TransferAck:
        return await self._transfer("Deposit", user_id, asset, amount, transfer_id)

    async def withdraw(
        self, user_id: int, asset: str, amount: int, transfer_id: str
    ) -> gateway_pb2.TransferAck:
        return await self._transfer("Withdraw", user_id, asset, amount, transfer_id)

    async def halt_symbol(
        self, symbol: str, *, cancel_resting: bool = False
    ) -> gateway_pb2.AdminAck:
        request = gateway_pb2.HaltSymbolRequest(symbol=symbol, cancel_resting=cancel_resting)
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "HaltSymbol", request, gateway_pb2.AdminAck
        )
        return ack

    async def resume_symbol(self, symbol: str) -> gateway_pb2.AdminAck:
        request = gateway_pb2.ResumeSymbolRequest(symbol=symbol)
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "ResumeSymbol", request, gateway_pb2.AdminAck
        )
        return ack

    async def kill_switch(self, user_id: int, *, enable: bool) -> gateway_pb2.AdminAck:
        request = gateway_pb2.KillSwitchRequest(user_id=user_id, enable=enable)
        ack: gateway_pb2.AdminAck = await self._signed.unary(
            ADMIN_SERVICE + "KillSwitch", request, gateway_pb2.AdminAck
        )
        return ack

    async def _transfer(
        self, call: str, user_id: int, asset: str, amount: int, transfer_id: str
    ) -> gateway_pb2.TransferAck:
        request = gateway_pb2.TransferRequest(
            user_id=user_id, asset=asset, amount=amount, transfer_id=transfer_id
        )
        ack: gateway_pb2.TransferAck = await self._signed.unary(
            ADMIN_SERVICE + call, request, gateway_pb2.TransferAck
        )
        return ack
