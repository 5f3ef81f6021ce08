"""A trading load on the batched Trade stream, run as a high-rate client would run it.

Each user trades on a Trade stream of its own, written from gateway.proto as a
client in another language would (signed metadata, `TradeRequestBatch` out,
`TradeResponseBatch` in, matched by request id). Every `interval_s` a user sends
a batch of new one-lot BTC-USDT orders at one price: half the users buy and half
sell, so orders cross and fill all the time.

Every request is timed from the moment it is sent, and the client follows the
retry rules of gateway.proto:
- an ack that is not retryable ends the order (accepted, or refused for good);
- a retryable ack, a `TradeError` UNAVAILABLE or TIMEOUT, or the stream ending
  (the gateway died) sends the order again, with the same client order id;
- no answer within the documented deadline (plus a margin for this machine) is
  a broken promise: counted in `late`, and the order is sent again on a new
  stream, the old one abandoned.
Re-sends back off (50 ms doubling to 1 s) while answers are refusals. `stop`
ends new orders; `drain` waits until every order has a final answer.

With `cancel_all_every` (ticks), each user also sends a `CancelAllOrders` that often,
retried by the same rules until it has a final answer (`LoadUser.cancel_all_acks`):
what `check_cancelled_all` holds the mesh to afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from gateway.client import OmsClient
from gateway.signed_channel import wall_clock_ms
from gateway.signing import signed_metadata
from protos.oms.v1 import common_pb2, gateway_pb2
from services.clients.channels import mesh_channel
from tests.gateway.accounts import BTC, PRICE, Account, eventually

TRADE_METHOD = "/oms.v1.OrderGateway/Trade"
ANSWER_MARGIN_S = 1.0  # scheduling on a loaded 2-core machine, beyond the gateway's deadline
RETRY_PAUSE_S = 0.05
MAX_RETRY_PAUSE_S = 1.0
MAX_SEND = 200  # requests per TradeRequestBatch
RETRYABLE_ERRORS = (
    gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE,
    gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT,
)
FUNDS = {"USDT": 10**14, "BTC": 10**12}
LOOKUPS_AT_ONCE = 64  # order lookups in flight at once, per user
CANCELLED_OR_FILLED = (common_pb2.ORDER_STATUS_CANCELLED, common_pb2.ORDER_STATUS_FILLED)


@dataclass
class _Sent:
    client_order_id: str
    sent_at: float


@dataclass
class LoadUser:
    account: Account
    side: int
    orders: dict[str, gateway_pb2.PlaceOrderRequest] = field(default_factory=dict)
    acks: dict[str, gateway_pb2.OrderAck] = field(default_factory=dict)  # final answers
    to_send: deque[str] = field(default_factory=deque)
    sequence: int = 0
    cancel_alls: dict[str, gateway_pb2.CancelAllOrdersRequest] = field(default_factory=dict)
    cancel_all_acks: dict[str, gateway_pb2.CancelAllAck] = field(default_factory=dict)
    ticks: int = 0
    pause_s: float = RETRY_PAUSE_S
    send_after: float = 0.0  # re-sends wait until then (monotonic)

    def new_orders(self, count: int) -> None:
        for _ in range(count):
            self.sequence += 1
            client_order_id = f"{self.account.user_id}-{self.sequence}"
            self.orders[client_order_id] = gateway_pb2.PlaceOrderRequest(
                user_id=self.account.user_id,
                client_order_id=client_order_id,
                symbol=BTC,
                side=self.side,  # type: ignore[arg-type]
                order_type=common_pb2.ORDER_TYPE_LIMIT,
                time_in_force=common_pb2.TIME_IN_FORCE_GTC,
                price_ticks=PRICE,
                quantity_lots=1,
            )
            self.to_send.append(client_order_id)

    def new_cancel_all(self) -> None:
        key = f"cancel-all-{len(self.cancel_alls) + 1}"
        self.cancel_alls[key] = gateway_pb2.CancelAllOrdersRequest(user_id=self.account.user_id)
        self.to_send.append(key)

    @property
    def unfinished(self) -> int:
        return len(self.orders) - len(self.acks) + len(self.cancel_alls) - len(self.cancel_all_acks)


@dataclass
class StreamLoad:
    address: str
    users: Sequence[LoadUser]
    deadline_s: float  # the gateway's documented request deadline
    batch: int = 5
    interval_s: float = 0.1
    cancel_all_every: int = 0  # ticks between a user's cancel-alls (0: none)
    answers: Counter[str] = field(default_factory=Counter)
    late: int = 0  # requests with no answer within deadline + margin on a live stream
    slowest_answer_s: float = 0.0
    stream_errors: Counter[str] = field(default_factory=Counter)
    accepted_at: list[float] = field(default_factory=list)  # monotonic time of each acceptance
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def of(cls, address: str, accounts: Sequence[Account], **options: float) -> StreamLoad:
        sides = (common_pb2.SIDE_BUY, common_pb2.SIDE_SELL)
        users = [LoadUser(account, sides[n % 2]) for n, account in enumerate(accounts)]
        return cls(address, users, **options)  # type: ignore[arg-type]

    @property
    def accepted(self) -> int:
        return len(self.accepted_at)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._trade(user)) for user in self.users]

    async def wait_accepted(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.accepted < count:
            self._raise_failures()
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"load: {self.accepted} accepted, not {count}, in {timeout_s:g} s;"
                    f" answers {dict(self.answers)}, stream errors {dict(self.stream_errors)}"
                )
            await asyncio.sleep(0.02)

    @property
    def events(self) -> int:
        """Answers of every kind, and streams that ended: what the clients have seen."""
        return sum(self.answers.values()) + sum(self.stream_errors.values())

    async def wait_events(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.events < count:
            self._raise_failures()
            if time.monotonic() >= deadline:
                raise AssertionError(f"load: {self.events} events, not {count}")
            await asyncio.sleep(0.02)

    async def drain(self, timeout_s: float = 90.0) -> None:
        """Stop new orders; return once every order has its final answer."""
        self.stop.set()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*self._tasks)
        except TimeoutError as error:
            unfinished = sum(user.unfinished for user in self.users)
            raise AssertionError(f"{unfinished} orders without a final answer") from error

    async def close(self) -> None:
        self.stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def first_accepted_after(self, moment: float) -> float | None:
        return next((t for t in self.accepted_at if t >= moment), None)

    def _raise_failures(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError("a load stream failed") from task.exception()

    # --- one user's stream ---------------------------------------------------------------

    async def _trade(self, user: LoadUser) -> None:
        channel = mesh_channel(self.address)
        try:
            while not (self.stop.is_set() and not user.unfinished):
                if not await self._session(channel, user):
                    # The stream failed (the gateway is away): open another after a pause.
                    await asyncio.sleep(user.pause_s)
                    user.pause_s = min(user.pause_s * 2, MAX_RETRY_PAUSE_S)
        finally:
            await channel.close()

    async def _session(self, channel: grpc.aio.Channel, user: LoadUser) -> bool:
        """One stream, until the work is done (True), or it fails or is abandoned (False)."""
        account = user.account
        outgoing: asyncio.Queue[gateway_pb2.TradeRequestBatch | None] = asyncio.Queue()
        metadata = signed_metadata(
            account.api_key, account.api_secret, TRADE_METHOD, None, wall_clock_ms()
        )

        async def requests() -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
            while (batch := await outgoing.get()) is not None:
                yield batch

        call = channel.stream_stream(
            TRADE_METHOD,
            request_serializer=gateway_pb2.TradeRequestBatch.SerializeToString,
            response_deserializer=gateway_pb2.TradeResponseBatch.FromString,
        )(requests(), metadata=metadata)
        outstanding: dict[int, _Sent] = {}
        ids = itertools.count(1)

        async def read() -> None:
            async for batch in call:
                now = time.monotonic()
                for response in batch.responses:
                    sent = outstanding.pop(response.request_id, None)
                    if sent is None:
                        raise AssertionError(f"an answer to no request: {response}")
                    self.slowest_answer_s = max(self.slowest_answer_s, now - sent.sent_at)
                    self._answered(user, sent.client_order_id, response, now)

        reader = asyncio.create_task(read())
        next_tick = time.monotonic()
        try:
            while True:
                if reader.done():
                    reader.result()  # raises what ended the stream
                    self.stream_errors["closed by the gateway"] += 1
                    return False
                now = time.monotonic()
                overdue = [s for s in outstanding.values() if now - s.sent_at > self._limit_s]
                if overdue:
                    self.late += len(overdue)
                    self.stream_errors["abandoned: no answer in time"] += 1
                    return False
                if self.stop.is_set() and not user.unfinished:
                    return True
                if now >= next_tick:
                    next_tick = now + self.interval_s
                    if not self.stop.is_set():
                        user.new_orders(self.batch)
                        user.ticks += 1
                        every = self.cancel_all_every
                        if every and user.ticks % every == 0:
                            user.new_cancel_all()
                    if user.to_send and now >= user.send_after:
                        self._send(user, outgoing, outstanding, ids, now)
                await asyncio.sleep(min(0.01, max(0.0, next_tick - time.monotonic())))
        except grpc.aio.AioRpcError as error:
            self.stream_errors[error.code().name] += 1
            return False
        finally:
            outgoing.put_nowait(None)
            call.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            # Unanswered on this stream: sent again, first, on the next one.
            user.to_send.extendleft(reversed([s.client_order_id for s in outstanding.values()]))

    @property
    def _limit_s(self) -> float:
        return self.deadline_s + ANSWER_MARGIN_S

    def _send(
        self,
        user: LoadUser,
        outgoing: asyncio.Queue[gateway_pb2.TradeRequestBatch | None],
        outstanding: dict[int, _Sent],
        ids: itertools.count[int],
        now: float,
    ) -> None:
        batch = gateway_pb2.TradeRequestBatch()
        while user.to_send and len(batch.requests) < MAX_SEND:
            client_order_id = user.to_send.popleft()
            if client_order_id in user.acks or client_order_id in user.cancel_all_acks:
                continue
            request_id = next(ids)
            request = batch.requests.add(request_id=request_id)
            cancel_all = user.cancel_alls.get(client_order_id)
            if cancel_all is not None:
                request.cancel_all.CopyFrom(cancel_all)
            else:
                request.place.CopyFrom(user.orders[client_order_id])
            outstanding[request_id] = _Sent(client_order_id, now)
        if batch.requests:
            outgoing.put_nowait(batch)

    def _answered(
        self, user: LoadUser, client_order_id: str, response: gateway_pb2.TradeResponse, now: float
    ) -> None:
        kind = response.WhichOneof("response")
        if kind == "place" and not response.place.retryable:
            ack = response.place
            if ack.client_order_id != client_order_id:
                raise AssertionError(f"answer for {client_order_id} names {ack.client_order_id}")
            if not ack.accepted:
                raise AssertionError(f"{client_order_id} refused for good: {ack}")
            if client_order_id not in user.acks:
                user.acks[client_order_id] = ack
                self.accepted_at.append(now)
            self.answers["duplicate" if ack.duplicate else "accepted"] += 1
            user.pause_s = RETRY_PAUSE_S
            return
        if kind == "cancel_all" and not response.cancel_all.retryable:
            every = response.cancel_all
            if client_order_id not in user.cancel_alls:
                raise AssertionError(f"a cancel-all answer to {client_order_id}: {every}")
            if not every.accepted:
                raise AssertionError(f"{client_order_id} refused for good: {every}")
            user.cancel_all_acks.setdefault(client_order_id, every)
            self.answers["cancel-all accepted"] += 1
            user.pause_s = RETRY_PAUSE_S
            return
        if kind in ("place", "cancel_all"):
            self.answers["retryable ack"] += 1
        elif kind == "error" and response.error.reason in RETRYABLE_ERRORS:
            self.answers[gateway_pb2.GatewayErrorReason.Name(response.error.reason)] += 1
        else:
            raise AssertionError(f"{client_order_id}: an answer no client should get: {response}")
        # Sent again with the same client order id, after a pause that grows while
        # answers are refusals.
        user.to_send.append(client_order_id)
        user.send_after = now + user.pause_s
        user.pause_s = min(user.pause_s * 2, MAX_RETRY_PAUSE_S)


async def check_cancelled_all(address: str, load: StreamLoad) -> int:
    """Nothing rests that its owner cancelled: once the load is drained, no order a
    user's shard accepted before the user's last accepted cancel-all is still open, and
    every order a cancel-all listed ended CANCELLED or FILLED. The accepted cancel-alls."""
    checked = 0
    for user in load.users:
        acks = list(user.cancel_all_acks.values())
        if not acks:
            continue
        checked += len(acks)
        last_position = max(ack.stamp.position for ack in acks)
        async with user.account.client(address) as client:
            # A place's ack stamp is where its shard accepted it (a duplicate's is later:
            # such an order is not held to the cancel-all, a weaker check, never a false one).
            placed_at = {ack.order_id: ack.stamp.position for ack in user.acks.values()}

            # The last cancels may still be on their way when the last answer came.
            await eventually(
                functools.partial(_cancelled_yet_open, client, placed_at, last_position),
                lambda still_open: not still_open,
            )
            listed = sorted({order_id for ack in acks for order_id in ack.cancelled_order_ids})
            for start in range(0, len(listed), LOOKUPS_AT_ONCE):
                await asyncio.gather(
                    *(
                        _ended_cancelled_or_filled(client, order_id)
                        for order_id in listed[start : start + LOOKUPS_AT_ONCE]
                    )
                )
    return checked


async def _cancelled_yet_open(
    client: OmsClient, placed_at: dict[str, int], cancelled_at: int
) -> list[str]:
    """Open orders placed before the log position of a cancel-all."""
    return [
        order.order_id
        for order in await client.open_orders()
        if placed_at.get(order.order_id, cancelled_at) < cancelled_at
    ]


async def _ended_cancelled_or_filled(client: OmsClient, order_id: str) -> None:
    view = await eventually(
        functools.partial(client.get_order, order_id=order_id),
        lambda view: view.status in CANCELLED_OR_FILLED,
    )
    assert view.order_id == order_id
