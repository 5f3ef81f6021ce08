"""The batched bidirectional Trade stream for high-rate clients.

Each `TradeRequestBatch` (at most `MAX_BATCH` requests, else the stream ends
with BATCH_TOO_LARGE after answering what it had accepted) is checked request
by request — the account against the stream's key, then the fields — and every
valid request goes to the shard at once through the shared `ShardLink`. Answers
leave as they are ready: whatever completed during one loop turn goes out in one
`TradeResponseBatch`, matched by `request_id`, one answer per request, within
`deadline_s` of reading it (a TIMEOUT error when nothing else came first). At most
`max_in_flight` requests are unanswered per stream; past that, reading pauses,
which is how gRPC flow control pushes back on the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.authentication import authorize_account, count_error
from gateway.core.refusals import GatewayError, deadline_passed, invalid_field
from gateway.credentials import KeyHolder
from gateway.direct_orders import DirectOrder
from gateway.disconnect_sessions import DisconnectSession
from gateway.statistics import GatewayCounters
from protos.oms.v1 import gateway_pb2
from services.observability.metrics import ACK_LATENCY

MAX_BATCH = 1_000
DEADLINE = "the request's deadline passed"  # the message a late request is cancelled with

# A place, and the id of the cancel-on-disconnect session it is placed on (0: none).
PlaceHandler = Callable[[gateway_pb2.PlaceOrderRequest, int], Awaitable[gateway_pb2.OrderAck]]
CancelHandler = Callable[[gateway_pb2.CancelOrderRequest], Awaitable[gateway_pb2.CancelAck]]
CancelAllHandler = Callable[
    [gateway_pb2.CancelAllOrdersRequest], Awaitable[gateway_pb2.CancelAllAck]
]
Check = Callable[[gateway_pb2.TradeRequest], None]
# Puts a checked request straight into its shard's link (deadline in loop time), or
# None: answer it through `place` / `cancel` (gateway/direct_orders.py).
Submit = Callable[[gateway_pb2.TradeRequest, float, int], DirectOrder | None]
# Makes the stream's cancel-on-disconnect session: (user id, timeout ms).
OpenSession = Callable[[int, int], DisconnectSession]


class TradeSession:
    def __init__(
        self,
        holder: KeyHolder,
        *,
        check: Check,
        place: PlaceHandler,
        cancel: CancelHandler,
        cancel_all: CancelAllHandler,
        counters: GatewayCounters,
        max_in_flight: int,
        deadline_s: float,
        submit: Submit | None = None,
        open_session: OpenSession | None = None,
    ) -> None:
        self.holder = holder
        self.check = check
        self.place = place
        self.cancel = cancel
        self.cancel_all = cancel_all
        self.submit = submit
        self.open_session = open_session
        # Cancel on disconnect, when the first batch asks for it; its id rides on every
        # place of the stream, and `run` ends it: cleanly only after a clean close.
        self.disconnect: DisconnectSession | None = None
        self.session_id = 0
        self.clean = False
        self._first_batch = True
        self.counters = counters
        self.deadline_s = deadline_s
        self.slots = asyncio.Semaphore(max_in_flight)
        self.ready: deque[gateway_pb2.TradeResponse] = deque()
        self.changed = asyncio.Event()
        self.unanswered = 0
        self.reading_done = False
        self.refusal: GatewayError | None = None
        self.failure: BaseException | None = None  # a bug answering a request ends the stream
        self._tasks: set[asyncio.Task[None]] = set()
        # The requests being answered, oldest first, with their deadlines: one deadline
        # for every request of the stream, so arrival order is deadline order, and one
        # sweep (`_expire`) ends the late ones, instead of a timer per request.
        self._deadlines: deque[tuple[float, asyncio.Task[None] | DirectOrder]] = deque()
        self._closing = False  # the stream is ending: answers are no longer sent
        self._sweeper: asyncio.Task[None] | None = None

    async def run(
        self, requests: AsyncIterator[gateway_pb2.TradeRequestBatch]
    ) -> AsyncIterator[gateway_pb2.TradeResponseBatch]:
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                if self.failure is not None:
                    raise self.failure
                if not self.ready:
                    if reader.done() and not reader.cancelled() and reader.exception():
                        raise reader.exception()  # type: ignore[misc]
                    if self.reading_done and self.unanswered == 0:
                        break
                    self.changed.clear()
                    await self.changed.wait()
                    continue
                # Let answers completing in this loop turn join the batch.
                await asyncio.sleep(0)
                batch = gateway_pb2.TradeResponseBatch(responses=self.ready)
                self.ready.clear()
                self.unanswered -= len(batch.responses)
                yield batch
                for _ in batch.responses:
                    self.slots.release()
            await reader
            if self.refusal is not None:
                raise self.refusal
            self.clean = True  # the client half-closed and has every answer
        finally:
            self.ended()
            self._closing = True
            reader.cancel()
            if self._sweeper is not None:
                self._sweeper.cancel()
            for task in list(self._tasks):
                task.cancel()
            for _, handle in self._deadlines:
                if isinstance(handle, DirectOrder):
                    handle.cancel("the stream ended")  # not sent, if not sent yet
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader  # reaped only: a failure of it was raised above

    def ended(self) -> None:
        """The stream is over (its handler's end, or the call's done-callback should the
        handler never be finalized): its session ends, cleanly only after a clean close."""
        if self.disconnect is not None:
            self.disconnect.end(clean=self.clean)

    def _put(self, response: gateway_pb2.TradeResponse) -> None:
        self.ready.append(response)
        self.changed.set()

    async def _read(self, requests: AsyncIterator[gateway_pb2.TradeRequestBatch]) -> None:
        try:
            async for batch in requests:
                if self._first_batch:
                    self._first_batch = False
                    if batch.cancel_on_disconnect_ms and not await self._open_session(
                        batch.cancel_on_disconnect_ms
                    ):
                        return
                if len(batch.requests) > MAX_BATCH:
                    self.refusal = GatewayError(
                        gateway_pb2.GATEWAY_ERROR_REASON_BATCH_TOO_LARGE,
                        f"{len(batch.requests)} requests in one batch; at most {MAX_BATCH}",
                    )
                    count_error(self.counters, self.refusal)
                    return
                for request in batch.requests:
                    await self.slots.acquire()
                    self.unanswered += 1
                    self._start(request)
        finally:
            self.reading_done = True
            self.changed.set()

    async def _open_session(self, timeout_ms: int) -> bool:
        """Open the stream's session before any of its orders; False: the stream ends."""
        if self.open_session is None:
            return True  # not offered here (tests of the session's other parts)
        session = self.open_session(self.holder.user_id, timeout_ms)
        try:
            await session.open()
        except GatewayError as error:
            self.refusal = error
            count_error(self.counters, error)
            return False
        self.disconnect = session
        self.session_id = session.session_id
        return True

    def _start(self, request: gateway_pb2.TradeRequest) -> None:
        kind = request.WhichOneof("request") or "empty"
        self.counters.add(f"trade_requests.{kind}")
        try:
            if kind == "place":
                authorize_account(self.holder, request.place.user_id)
            elif kind == "cancel":
                authorize_account(self.holder, request.cancel.user_id)
            elif kind == "cancel_all":
                authorize_account(self.holder, request.cancel_all.user_id)
            else:
                raise invalid_field(
                    "request", "a TradeRequest holds a place, a cancel or a cancel_all"
                )
            self.check(request)
        except GatewayError as error:
            self._put(self._error(request.request_id, error))
            return
        deadline = asyncio.get_running_loop().time() + self.deadline_s
        direct = None if self.submit is None else self.submit(request, deadline, self.session_id)
        if direct is not None:
            direct.future.add_done_callback(
                functools.partial(self._answered_directly, direct, kind, time.perf_counter())
            )
            self._deadlines.append((deadline, direct))
        else:
            self._deadlines.append((deadline, self._answer_in_task(request, kind)))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._expire())

    def _answer_in_task(self, request: gateway_pb2.TradeRequest, kind: str) -> asyncio.Task[None]:
        task = asyncio.create_task(self._answer(request, kind))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _answered_directly(
        self, direct: DirectOrder, kind: str, started: float, future: asyncio.Future[object]
    ) -> None:
        if self._closing:
            return
        request_id = direct.request.request_id
        outcome = "error"
        if future.cancelled():
            outcome = "timeout"  # the sweep, at the deadline
            response = self._error(request_id, deadline_passed(self.deadline_s))
        else:
            try:
                answer = direct.response(self.counters)
            except GatewayError as error:
                response = self._error(request_id, error)
            except Exception as error:
                self.failure = error  # as in `_answer`: the stream fails, the client retries
                self.changed.set()
                return
            else:
                if answer is None and asyncio.get_running_loop().time() < direct.deadline:
                    # Not the owner any more: the routed path follows the routing; the
                    # sweep still ends it at the same deadline, through `direct`.
                    direct.fallback = self._answer_in_task(direct.request, kind)
                    return
                if answer is None:
                    outcome = "timeout"
                    response = self._error(request_id, deadline_passed(self.deadline_s))
                else:
                    response = answer
                    if kind == "place":
                        outcome = "accepted" if response.place.accepted else "refused"
        direct.answered = True
        if kind == "place":
            ACK_LATENCY.labels("trade", outcome).observe(time.perf_counter() - started)
        self._put(response)

    async def _expire(self) -> None:
        """Cancel each request still unanswered at its deadline (it answers TIMEOUT);
        runs while requests are being answered, sleeping until the oldest one's."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        while deadlines:
            deadline, handle = deadlines[0]
            if handle.done():
                deadlines.popleft()
                continue
            wait_s = deadline - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
                continue
            deadlines.popleft()
            handle.cancel(DEADLINE)

    async def _answer(self, request: gateway_pb2.TradeRequest, kind: str) -> None:
        response = gateway_pb2.TradeResponse(request_id=request.request_id)
        started = time.perf_counter()
        outcome = "error"
        try:
            if kind == "place":
                response.place.CopyFrom(await self.place(request.place, self.session_id))
                outcome = "accepted" if response.place.accepted else "refused"
            elif kind == "cancel":
                response.cancel.CopyFrom(await self.cancel(request.cancel))
            else:
                response.cancel_all.CopyFrom(await self.cancel_all(request.cancel_all))
        except GatewayError as error:
            response = self._error(request.request_id, error)
        except asyncio.CancelledError as cancelled:
            if cancelled.args != (DEADLINE,):
                raise  # the stream is going away
            outcome = "timeout"
            response = self._error(request.request_id, deadline_passed(self.deadline_s))
        except Exception as error:
            self.failure = error  # raised by the writer: the stream fails, the client retries
            self.changed.set()
            return
        if kind == "place":
            ACK_LATENCY.labels("trade", outcome).observe(time.perf_counter() - started)
        self._put(response)

    def _error(self, request_id: int, error: GatewayError) -> gateway_pb2.TradeResponse:
        count_error(self.counters, error)
        response = gateway_pb2.TradeResponse(request_id=request_id)
        response.error.reason = error.reason  # type: ignore[assignment]
        response.error.detail = error.detail
        return response
