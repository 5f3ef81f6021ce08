"""One batched Execute stream to a user shard, shared by every caller in a process.

`execute(command)` returns the command's final `ShardResult`: commands queued
during one loop turn leave in one `ShardCommandBatch`, results are matched by
correlation id, and a `parked` answer (hydration, DB dedup lookup) is kept
waiting for the final one on the same stream. `send(commands)` is for the mesh's
own commands (hydrations, flush answers, matcher events), which get no result.

Correlation ids are unique per link (a random 32-bit prefix per stream
incarnation), because the shard routes late finals by correlation id across
streams. When the stream breaks every waiting caller gets `ShardUnavailableError`;
the caller retries with the same client order id and the shard's dedup returns
the original result, so a retry never doubles an order. The link reconnects on
the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections import deque
from collections.abc import AsyncIterator, Iterable

import grpc
import structlog

from protos.oms.v1 import shard_pb2
from services.clients.channels import mesh_channel

log = structlog.get_logger(__name__)
EXECUTE_METHOD = "/oms.v1.UserShard/Execute"
MAX_COMMANDS_PER_BATCH = 1_000
MAX_QUEUED_COMMANDS = 50_000  # callers beyond this wait: backpressure, never a drop
DEFAULT_LINGER_S = 0.0005
STALL_S = 5.0  # queued this long with a live stream: the stream is wedged, replace it


class ShardUnavailableError(ConnectionError):
    """The stream to the shard broke; retry with the same ids."""


class ShardLink:
    def __init__(self, address: str, *, linger_s: float = DEFAULT_LINGER_S) -> None:
        self.address = address
        self.linger_s = linger_s
        self._channel: grpc.aio.Channel | None = None
        # Commands wait here until a stream's request iterator takes them, and it takes
        # them only to yield them at once: a stream that ended never holds one back.
        self._pending: deque[shard_pb2.ShardCommand] = deque()
        self._queued = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._waiting: dict[int, asyncio.Future[shard_pb2.ShardResult]] = {}
        self._stream_task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._prefix = 0
        self.sent_batches = 0
        self.sent_commands = 0
        self.breaks = 0  # streams that ended; mesh commands sent on them may be lost
        self.timeouts = 0
        self.stalls = 0
        self._pending_since: float | None = None  # loop time the oldest queued command arrived
        self._reader_gone = False  # the stream's request iterator ended while the call lives
        self._deadlines: deque[tuple[float, asyncio.Future[shard_pb2.ShardResult]]] = deque()
        self._expiry_task: asyncio.Task[None] | None = None
        self._broken = asyncio.Event()

    async def execute(
        self, command: shard_pb2.ShardCommand, *, timeout_s: float | None = None
    ) -> shard_pb2.ShardResult:
        """Send one client command and wait for its final result.

        With `timeout_s`, TimeoutError once that long passed without one (one sweep
        per link expires them in arrival order: a timer per command costs more than
        the command; callers of one link are expected to use one timeout).
        """
        self._ensure_stream()
        correlation_id = self._prefix | next(self._ids)
        command.correlation_id = correlation_id
        loop = asyncio.get_running_loop()
        future: asyncio.Future[shard_pb2.ShardResult] = loop.create_future()
        self._waiting[correlation_id] = future
        if timeout_s is not None:
            self._deadlines.append((loop.time() + timeout_s, future))
            if self._expiry_task is None or self._expiry_task.done():
                self._expiry_task = asyncio.create_task(self._expire(timeout_s))
        try:
            await self._enqueue(command)
            return await future
        finally:
            self._waiting.pop(correlation_id, None)

    async def send(self, commands: Iterable[shard_pb2.ShardCommand]) -> None:
        """Queue mesh commands (no result expected) on the stream."""
        self._ensure_stream()
        for command in commands:
            command.correlation_id = 0
            await self._enqueue(command)

    async def _enqueue(self, command: shard_pb2.ShardCommand) -> None:
        while len(self._pending) >= MAX_QUEUED_COMMANDS:
            self._room.clear()
            await self._room.wait()
        if not self._pending:
            self._pending_since = asyncio.get_running_loop().time()
        self._pending.append(command)
        self._queued.set()

    def _stalled(self) -> bool:
        since = self._pending_since
        return (
            bool(self._pending)
            and since is not None
            and asyncio.get_running_loop().time() - since > STALL_S
        )

    async def wait_broken(self) -> None:
        """Return once the current stream has broken.

        `send` cannot tell whether a mesh command reached the log before a break;
        its owner waits here and then re-derives what to send from the shard's
        durable state (the bridge from GetInFlight's matcher sequences).
        """
        await self._broken.wait()

    async def close(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry_task
            self._expiry_task = None
        if self._stream_task is not None:
            self._stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ShardUnavailableError):
                await self._stream_task
            self._stream_task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    # --- the stream ------------------------------------------------------------------

    def _ensure_stream(self) -> None:
        task = self._stream_task
        if task is not None and not task.done() and (self._reader_gone or self._stalled()):
            # Commands have waited for the stream's reader far longer than a batch takes:
            # the stream is wedged. Replace it once the old one has failed its waiters.
            self.stalls += 1
            log.warning("shard_link.stream_stalled", shard=self.address, queued=len(self._pending))
            task.add_done_callback(lambda _: self._ensure_stream())
            task.cancel()
            return
        if task is None or task.done():
            self._prefix = secrets.randbits(31) << 32
            self._ids = itertools.count(1)
            self._broken = asyncio.Event()
            self._stream_task = asyncio.create_task(self._run_stream())

    async def _run_stream(self) -> None:
        if self._channel is None:
            self._channel = mesh_channel(self.address)
        ended = asyncio.Event()
        call = self._channel.stream_stream(
            EXECUTE_METHOD,
            request_serializer=None,
            response_deserializer=shard_pb2.ShardResultBatch.FromString,
        )(self._batches(ended))
        try:
            async for batch in call:
                for result in batch.results:
                    future = self._waiting.get(result.correlation_id)
                    if future is None or future.done() or result.parked:
                        continue
                    future.set_result(result)
            error: BaseException = ShardUnavailableError(f"shard {self.address} closed the stream")
        except grpc.aio.AioRpcError as rpc_error:
            error = ShardUnavailableError(f"shard {self.address}: {rpc_error.code().name}")
        except asyncio.CancelledError:
            self._fail_waiting(ShardUnavailableError(f"shard {self.address}: stream replaced"))
            raise
        finally:
            # A call that ended with an error does not stop its request iterator: tell it.
            ended.set()
            call.cancel()
            self.breaks += 1
            self._broken.set()
        self._fail_waiting(error)

    async def _batches(self, ended: asyncio.Event) -> AsyncIterator[bytes]:
        self._reader_gone = False
        try:
            pending = self._pending
            while True:
                if not pending:
                    while not pending:
                        self._queued.clear()
                        if not await _first_of(self._queued, ended):
                            return
                    # Unary callers arrive one per loop turn: a short linger after an idle spell
                    # lets a burst share one batch (one message, one log entry) instead of one each.
                    if self.linger_s > 0:
                        await asyncio.sleep(self.linger_s)
                if ended.is_set():
                    return
                batch = shard_pb2.ShardCommandBatch()
                commands = batch.commands
                while pending and len(commands) < MAX_COMMANDS_PER_BATCH:
                    commands.append(pending.popleft())
                self._pending_since = asyncio.get_running_loop().time() if pending else None
                if len(pending) < MAX_QUEUED_COMMANDS:
                    self._room.set()
                self.sent_batches += 1
                self.sent_commands += len(commands)
                yield batch.SerializeToString()
        finally:
            # Ended without its call ending (an error inside grpc's request consumer):
            # nothing would read the queue again on this stream.
            if not ended.is_set():
                self._reader_gone = True

    async def _expire(self, interval_s: float) -> None:
        """Fail the commands whose deadline passed; runs while any deadline is pending."""
        deadlines = self._deadlines
        loop = asyncio.get_running_loop()
        tick_s = min(max(interval_s / 20, 0.005), 0.1)
        while deadlines:
            now = loop.time()
            while deadlines and deadlines[0][0] <= now:
                _, future = deadlines.popleft()
                if not future.done():
                    self.timeouts += 1
                    future.set_exception(TimeoutError("no result from the shard in time"))
            while deadlines and deadlines[0][1].done():
                deadlines.popleft()
            await asyncio.sleep(tick_s)

    def _fail_waiting(self, error: BaseException) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)


async def _first_of(wanted: asyncio.Event, ended: asyncio.Event) -> bool:
    """Wait for `wanted` or `ended`; True if `wanted` came first (or both at once)."""
    waits = [asyncio.ensure_future(wanted.wait()), asyncio.ensure_future(ended.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    return wanted.is_set() and not ended.is_set()
