"""One batched Execute stream to a user shard, shared by every caller in a process.

`execute(command)` returns the command's final `ShardResult`: commands queued
during one loop turn leave in one `ShardCommandBatch`, results are matched by
correlation id, and a `parked` answer (hydration, DB dedup lookup) is kept
waiting for the final one on the same stream. `send(commands)` is for the mesh's
own commands (hydrations, flush answers, matcher events), which get no result.

One task per link (`_keep_connected`) owns the stream; no caller ever starts,
replaces or cancels it. The link is in one of three states:

    state        a client command (`execute`)            left by
    CONNECTING   queued, waits for the stream            the shard answers the stream's opening
                                                         -> READY; the attempt fails -> AWAY
    READY        queued, sent in the next batch          the stream breaks or is wedged -> AWAY
    AWAY         refused at once (ShardUnavailableError)  a new attempt: after a backoff (50 ms
                 unless no attempt ran for RETRY_ON_      doubling to 1 s), or at once when a
                 DEMAND_S: then it starts one and waits    command arrives after RETRY_ON_DEMAND_S

Every client command has an answer within its deadline: its result, a
`ShardUnavailableError` (the shard is away; the stream broke with the command
queued or sent), `ShardBusyError` (`max_queued` commands already wait), or
`TimeoutError`. All of them mean "retry with the same ids": the shard's dedup
returns the original result of a command that was applied. A command whose
caller stopped waiting is not sent. Mesh commands are never refused: `send`
waits for room in the queue, and they stay queued across breaks and go out on
the next stream (their owners also re-derive what to send after a break, since
a command on a broken stream may or may not have reached the log).

A client command that arrives while `max_unanswered_batches` batches of client commands
wait for their answer waits in the queue for the oldest answer, and leaves with every
other command that arrived meanwhile (Nagle's algorithm, with the shard's answer as the
acknowledgement); a full batch (`MAX_COMMANDS_PER_BATCH`) leaves at once, as Nagle
sends a full segment. At a low rate nothing is held (no batch is unanswered); at a
high rate the batches grow with the rate: concurrent unary calls, each one command,
share one message and one log entry, and their results come back in one.

Correlation ids are unique per link (a random 32-bit prefix per stream), because
the shard routes late finals by correlation id across streams. A stream whose
queued commands are not taken, or whose sent commands get no answer at all, for
`stall_s` while it lives is wedged (a stopped process, a half-open connection):
the link ends it and connects again. Only client commands are answered: a link
that sends only mesh commands is found wedged when its queue is not taken.
Transitions are logged once each, rate-limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import heapq
import itertools
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from protos.oms.v1 import shard_pb2
from services.clients.channels import mesh_channel
from services.coordination.addresses import AddressSource, FixedAddress
from services.coordination.errors import CoordinationUnavailable

log = structlog.get_logger(__name__)
EXECUTE_METHOD = "/oms.v1.UserShard/Execute"
MAX_COMMANDS_PER_BATCH = 1_000
DEFAULT_MAX_QUEUED = 20_000  # client commands past this are refused (ShardBusyError)
DEFAULT_LINGER_S = 0.0005
STALL_S = 5.0  # queued this long with a live stream: the stream is wedged, replace it
CONNECT_TIMEOUT_S = 3.0  # the shard answers a stream's opening in this long, or it is away
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
RETRY_ON_DEMAND_S = 0.1  # while away, a command starts an attempt if none ran this recently
# The shard's Execute sends this in its initial metadata: the stream is open.
STREAM_OPENED_KEY = "oms-shard-stream"
STREAM_OPENED_VALUE = "open"
LOG_INTERVAL_S = 1.0  # at most one "down" line a second; the next says how many it skipped


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    AWAY = "away"


class ShardUnavailableError(ConnectionError):
    """The shard is away or the stream broke; retry with the same ids."""


class ShardBusyError(ShardUnavailableError):
    """Too many commands already wait for the stream; retry with the same ids."""


@dataclass(frozen=True, slots=True)
class ShardLinkStatistics:
    state: str
    queued: int
    waiting: int
    sent_batches: int
    sent_commands: int
    held_batches: int
    connects: int
    breaks: int
    stalls: int
    timeouts: int
    refused_away: int
    refused_busy: int


class ShardLink:
    def __init__(
        self,
        address: str | AddressSource,
        *,
        linger_s: float = DEFAULT_LINGER_S,
        max_queued: int = DEFAULT_MAX_QUEUED,
        stall_s: float = STALL_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        metadata: Callable[[], Sequence[tuple[str, str]]] = tuple,
        max_unanswered_batches: int | None = None,
    ) -> None:
        # A fixed address, or the shard's leader as etcd names it: resolved at every
        # connection attempt, so a failover is followed by the next attempt.
        self.source = FixedAddress(address) if isinstance(address, str) else address
        self.address = self.source.describe()
        self._channel_address = ""
        self.linger_s = linger_s
        self.max_queued = max_queued
        self.stall_s = stall_s
        self.connect_timeout_s = connect_timeout_s
        # None: every batch leaves at once (the bridge's and the persister's links carry
        # mesh commands, never held).
        if max_unanswered_batches is not None and max_unanswered_batches < 1:
            raise ValueError(f"max_unanswered_batches {max_unanswered_batches} (at least 1)")
        self.max_unanswered_batches = max_unanswered_batches
        # The first client correlation id of each batch sent and not yet answered, oldest
        # first: ids rise through the queue, so an answer holding id c answers every batch
        # whose first id is at most c (a parked command's late final holds an older id).
        self._unanswered: deque[int] = deque()
        self._answered = asyncio.Event()
        # Asked at each stream's opening: a leader-only writer's token for this term
        # (services/coordination/writer_tokens.py), or nothing.
        self.metadata = metadata
        self.state = LinkState.CONNECTING
        self._channel: grpc.aio.Channel | None = None
        # (command, its caller's future; None for a mesh command), oldest first.
        self._pending: deque[
            tuple[shard_pb2.ShardCommand, asyncio.Future[shard_pb2.ShardResult] | None]
        ] = deque()
        self._pending_since: float | None = None  # when the oldest queued command arrived
        self._unanswered_since: float | None = None  # first batch sent since the last answer
        self._queued = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self._break_seen = asyncio.Event()  # set, and replaced, at every break
        self._attempt_wanted = asyncio.Event()
        self._attempt_done = asyncio.Event()
        self._waiting: dict[int, asyncio.Future[shard_pb2.ShardResult]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._prefix = 0
        self._last_attempt = float("-inf")
        # (deadline, arrival, future): a heap, since a caller that waited for an
        # attempt to connect enters later than its deadline's order.
        self._deadlines: list[tuple[float, int, asyncio.Future[shard_pb2.ShardResult]]] = []
        self._arrivals = itertools.count()
        self._expiry_task: asyncio.Task[None] | None = None
        self._closed = False
        self._was_ready = False
        self._down_since: float | None = None
        self._last_down_line = float("-inf")
        self._unlogged_breaks = 0
        self.sent_batches = 0
        self.sent_commands = 0
        self.held_batches = 0  # batches that waited for an answer before leaving
        self.connects = 0
        self.breaks = 0  # streams that ended; mesh commands sent on them may be lost
        self.stalls = 0
        self.timeouts = 0
        self.refused_away = 0
        self.refused_busy = 0

    # --- callers -------------------------------------------------------------------------

    async def execute(
        self, command: shard_pb2.ShardCommand, *, timeout_s: float | None = None
    ) -> shard_pb2.ShardResult:
        """Send one client command and wait for its final result.

        With `timeout_s`, TimeoutError once that long passed without one, counted from
        this call (one sweep per link expires them in arrival order: a timer per
        command costs more than the command; callers of one link use one timeout).
        """
        self._ensure_running()
        started = asyncio.get_running_loop().time()
        if self.state is LinkState.AWAY and not await self._attempt_on_demand(timeout_s):
            self.refused_away += 1
            raise ShardUnavailableError(f"shard {self.address} is unavailable")
        return await self._enqueue(command, started, timeout_s)

    def submit(
        self, command: shard_pb2.ShardCommand, *, timeout_s: float | None = None
    ) -> asyncio.Future[shard_pb2.ShardResult] | None:
        """`execute` without a coroutine: the future of the command's final result
        (failing as `execute` fails), for a caller answering from a done-callback
        rather than a task per command. None while the link is away or closed:
        `execute` then decides (it may start an attempt and wait for it)."""
        if self._closed or self.state is LinkState.AWAY:
            return None
        self._ensure_running()
        return self._enqueue(command, asyncio.get_running_loop().time(), timeout_s)

    def _enqueue(
        self, command: shard_pb2.ShardCommand, started: float, timeout_s: float | None
    ) -> asyncio.Future[shard_pb2.ShardResult]:
        future: asyncio.Future[shard_pb2.ShardResult] = asyncio.get_running_loop().create_future()
        if len(self._pending) >= self.max_queued:
            self.refused_busy += 1
            future.set_exception(
                ShardBusyError(f"shard {self.address}: {self.max_queued} commands queued")
            )
            return future
        correlation_id = self._prefix | next(self._ids)
        command.correlation_id = correlation_id
        self._waiting[correlation_id] = future
        # However it ends (result, failure, or its caller cancelling it), it stops waiting.
        future.add_done_callback(functools.partial(self._forget, correlation_id))
        if timeout_s is not None:
            heapq.heappush(self._deadlines, (started + timeout_s, next(self._arrivals), future))
            if self._expiry_task is None or self._expiry_task.done():
                self._expiry_task = asyncio.create_task(self._expire(timeout_s))
        self._append(command, future)
        return future

    def _forget(self, correlation_id: int, _: object) -> None:
        self._waiting.pop(correlation_id, None)

    async def send(self, commands: Iterable[shard_pb2.ShardCommand]) -> None:
        """Queue mesh commands (no result expected); waits while the queue is full."""
        self._ensure_running()
        for command in commands:
            command.correlation_id = 0
            while len(self._pending) >= self.max_queued:
                self._room.clear()
                await self._room.wait()
                if self._closed:
                    raise ShardUnavailableError(f"link to shard {self.address} closed")
            self._append(command, None)

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once a stream is up (TimeoutError after `timeout_s`)."""
        self._ensure_running()
        async with asyncio.timeout(timeout_s):
            await self._ready.wait()

    async def wait_broken(self) -> None:
        """Return once the current stream has broken.

        `send` cannot tell whether a mesh command reached the log before a break;
        its owner waits here and then re-derives what to send from the shard's
        durable state (the bridge from GetInFlight's matcher sequences).
        """
        await self._broken.wait()

    async def wait_breaks(self, beyond: int) -> None:
        """Return once more than `beyond` streams have broken (`breaks`): unlike
        `wait_broken`, no break between reading the count and waiting is missed."""
        while self.breaks <= beyond:
            await self._break_seen.wait()

    def statistics(self) -> ShardLinkStatistics:
        return ShardLinkStatistics(
            state=self.state.value,
            queued=len(self._pending),
            waiting=len(self._waiting),
            sent_batches=self.sent_batches,
            sent_commands=self.sent_commands,
            held_batches=self.held_batches,
            connects=self.connects,
            breaks=self.breaks,
            stalls=self.stalls,
            timeouts=self.timeouts,
            refused_away=self.refused_away,
            refused_busy=self.refused_busy,
        )

    async def close(self) -> None:
        self._closed = True
        self._room.set()  # a `send` waiting for room learns of the close
        for task in (self._expiry_task, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._expiry_task = self._task = None
        self._fail_waiting(ShardUnavailableError(f"link to shard {self.address} closed"))
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        # An address source passed in belongs to the caller, who closes it.

    # --- the queue -----------------------------------------------------------------------

    def _append(
        self,
        command: shard_pb2.ShardCommand,
        future: asyncio.Future[shard_pb2.ShardResult] | None,
    ) -> None:
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append((command, future))
        self._queued.set()
        if len(self._pending) >= MAX_COMMANDS_PER_BATCH:
            self._answered.set()  # a held batch is full: it leaves now

    def _drop_queued_clients(self) -> None:
        """A broken stream: its callers were failed; keep only the mesh commands."""
        kept = deque(entry for entry in self._pending if entry[1] is None)
        self._pending = kept
        self._pending_since = time.monotonic() if kept else None
        self._room.set()

    def _stalled(self) -> bool:
        """Queued commands untaken, or sent commands unanswered, for `stall_s`.

        The shard answers every batch holding a client command once it is durable (a
        `parked` result at least), so a stream that took one and says nothing for that
        long is dead even if its connection is not (a stopped process, a half-open
        connection). Mesh commands get no answer: only their queue not being taken
        says that a mesh-only link is wedged.
        """
        now = time.monotonic()
        queued_since = self._pending_since
        sent_since = self._unanswered_since
        return (
            bool(self._pending) and queued_since is not None and now - queued_since > self.stall_s
        ) or (sent_since is not None and now - sent_since > self.stall_s)

    # --- the stream ----------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._closed:
            raise ShardUnavailableError(f"link to shard {self.address} closed")
        task = self._task
        if task is None or task.done():
            if task is not None and not task.cancelled() and task.exception() is not None:
                log.error(
                    "shard_link.supervisor_failed", shard=self.address, error=repr(task.exception())
                )
            self._task = asyncio.create_task(self._keep_connected())

    async def _attempt_on_demand(self, timeout_s: float | None) -> bool:
        """Away, but no attempt for a while: try now; whether the stream is up.

        Waits at most the caller's own deadline for the attempt's outcome.
        """
        if time.monotonic() - self._last_attempt < RETRY_ON_DEMAND_S:
            return False
        done = self._attempt_done  # set when the next attempt has failed
        self._attempt_wanted.set()
        wait_s = self.connect_timeout_s if timeout_s is None else timeout_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await _first_of(self._ready, done)
        return self._ready.is_set()

    async def _keep_connected(self) -> None:
        backoff_s = BACKOFF_INITIAL_S
        while True:
            self.state = LinkState.CONNECTING
            self._attempt_wanted.clear()
            self._last_attempt = time.monotonic()
            reason = await self._one_stream()
            # Whatever was sent or queued for a caller on that stream gets its answer now.
            self.state = LinkState.AWAY
            self._ready.clear()
            self._broken.set()
            self._fail_waiting(ShardUnavailableError(f"shard {self.address}: {reason}"))
            self._drop_queued_clients()
            done, self._attempt_done = self._attempt_done, asyncio.Event()
            done.set()
            if self._down_since is None:
                self._down_since = time.monotonic()
                self._log_down(reason)
            backoff_s = BACKOFF_INITIAL_S if self._was_ready else min(backoff_s * 2, BACKOFF_MAX_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff_s):
                    await self._attempt_wanted.wait()

    async def _one_stream(self) -> str:
        """Run one stream until it ends; the reason it ended."""
        self._was_ready = False
        # A new prefix before any await: every client command queued from here on carries
        # it, so ids rise through the queue for the whole stream (`_unanswered` relies on it).
        self._prefix = secrets.randbits(31) << 32
        self._ids = itertools.count(1)
        try:
            address = await self.source.resolve()
        except CoordinationUnavailable as error:
            return f"no address: {error}"
        if self._channel is None or address != self._channel_address:
            if self._channel is not None:
                await self._channel.close()
            self._channel = mesh_channel(address)
            self._channel_address = self.address = address
        ended = asyncio.Event()
        call = self._channel.stream_stream(
            EXECUTE_METHOD,
            request_serializer=None,
            response_deserializer=shard_pb2.ShardResultBatch.FromString,
        )(self._batches(ended), metadata=tuple(self.metadata()) or None)
        reader: asyncio.Task[str] | None = None
        try:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    opening = await call.initial_metadata()
            except TimeoutError:
                return f"no answer to the stream's opening in {self.connect_timeout_s:g} s"
            if call.done():
                return f"refused the stream: {(await call.code()).name}"
            # A call that fails before the shard answers also "returns" its (empty) initial
            # metadata, and can still look not done for a moment: only the shard's own
            # opening makes the link READY (a suite once saw READY on a stopped shard).
            if not _opened_by_shard(opening):
                return "the stream ended before the shard opened it"
            self._became_ready()
            reader = asyncio.create_task(self._read_results(call))
            while True:
                done, _ = await asyncio.wait({reader}, timeout=self.stall_s / 4)
                if done:
                    return reader.result()
                if self._stalled():
                    self.stalls += 1
                    return f"stream wedged: nothing taken or answered for {self.stall_s:g} s"
        except grpc.aio.AioRpcError as error:
            return str(error.code().name)
        finally:
            # Away before the first await below: the stream is over once this is reached
            # (a caller or a reader of `state` must not see READY while it is torn down;
            # a suite once read READY just after the stall that ended it was counted).
            self.state = LinkState.AWAY
            self._ready.clear()
            # A call that ended with an error does not stop its request iterator: tell it
            # (it waits on the queue's event, or on an answer: both wake it).
            ended.set()
            self._queued.set()
            self._unanswered.clear()
            self._answered.set()
            call.cancel()
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            if self._was_ready:
                self.breaks += 1
                seen, self._break_seen = self._break_seen, asyncio.Event()
                seen.set()

    def _became_ready(self) -> None:
        self._was_ready = True
        self.connects += 1
        self.state = LinkState.READY
        self._broken = asyncio.Event()
        self._ready.set()
        # Mesh commands kept across the break have waited for this stream, not on it.
        self._pending_since = time.monotonic() if self._pending else None
        self._unanswered_since = None
        down_since = self._down_since
        self._down_since = None
        if down_since is not None:
            log.info(
                "shard_link.ready",
                shard=self.address,
                away_s=round(time.monotonic() - down_since, 3),
                refused_away=self.refused_away,
                refused_busy=self.refused_busy,
            )

    async def _read_results(self, call: grpc.aio.StreamStreamCall) -> str:
        try:
            unanswered = self._unanswered
            async for batch in call:
                self._unanswered_since = None
                waiting = self._waiting
                highest = 0
                for result in batch.results:
                    correlation_id = result.correlation_id
                    highest = max(highest, correlation_id)
                    future = waiting.get(correlation_id)
                    if future is None or future.done() or result.parked:
                        continue
                    future.set_result(result)
                if unanswered and unanswered[0] <= highest:
                    while unanswered and unanswered[0] <= highest:
                        unanswered.popleft()
                    self._answered.set()
        except grpc.aio.AioRpcError as error:
            return str(error.code().name)
        return "the shard closed the stream"

    async def _batches(self, ended: asyncio.Event) -> AsyncIterator[bytes]:
        """What the stream sends: nothing before it is READY, then the queue in batches."""
        if not await _first_of(self._ready, ended):
            return
        while True:
            if not self._pending:
                while not self._pending:
                    self._queued.clear()
                    # One event, not a race of two (two tasks a batch): the stream's end
                    # sets it too.
                    await self._queued.wait()
                    if ended.is_set():
                        return
                # Unary callers arrive one per loop turn: a short linger after an idle spell
                # lets a burst share one batch (one message, one log entry) instead of one each.
                if self.linger_s > 0:
                    await asyncio.sleep(self.linger_s)
            limit = self.max_unanswered_batches
            if self._must_hold(limit):
                self.held_batches += 1
                while self._must_hold(limit) and not ended.is_set():
                    self._answered.clear()
                    await self._answered.wait()
            if ended.is_set():
                return
            batch = shard_pb2.ShardCommandBatch()
            commands = batch.commands
            pending = self._pending
            answered = False  # a client command is in it: the shard answers the batch
            while pending and len(commands) < MAX_COMMANDS_PER_BATCH:
                command, future = pending.popleft()
                if future is not None:
                    if future.done():
                        continue  # its caller stopped waiting (deadline): it retries, same id
                    if not answered:
                        answered = True
                        self._unanswered.append(command.correlation_id)
                commands.append(command)
            self._pending_since = time.monotonic() if pending else None
            if len(pending) < self.max_queued:
                self._room.set()
            if not commands:
                continue
            self.sent_batches += 1
            self.sent_commands += len(commands)
            # Mesh commands (matcher events, flush answers) get no result, so silence after
            # them says nothing: only a batch the shard must answer starts the clock. (It
            # once started for every batch: the bridge's and the persister's links found a
            # healthy shard wedged 5 s after their first send, at any load, and restarted.)
            if answered and self._unanswered_since is None:
                self._unanswered_since = time.monotonic()
            yield batch.SerializeToString()

    def _must_hold(self, limit: int | None) -> bool:
        """Whether the next batch waits for an answer: `limit` batches are unanswered
        and what is queued does not fill a batch."""
        return (
            limit is not None
            and len(self._unanswered) >= limit
            and len(self._pending) < MAX_COMMANDS_PER_BATCH
        )

    async def _expire(self, interval_s: float) -> None:
        """Fail the commands whose deadline passed; runs while any deadline is pending."""
        deadlines = self._deadlines
        loop = asyncio.get_running_loop()
        tick_s = min(max(interval_s / 20, 0.005), 0.1)
        while deadlines:
            now = loop.time()
            while deadlines and (deadlines[0][0] <= now or deadlines[0][2].done()):
                _, _, future = heapq.heappop(deadlines)
                if not future.done():
                    self.timeouts += 1
                    future.set_exception(TimeoutError("no result from the shard in time"))
            await asyncio.sleep(tick_s)

    def _fail_waiting(self, error: BaseException) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)

    def _log_down(self, reason: str) -> None:
        now = time.monotonic()
        if now - self._last_down_line < LOG_INTERVAL_S:
            self._unlogged_breaks += 1
            return
        log.warning(
            "shard_link.down",
            shard=self.address,
            reason=reason,
            breaks=self.breaks,
            unlogged_since_last=self._unlogged_breaks,
        )
        self._last_down_line = now
        self._unlogged_breaks = 0


def _opened_by_shard(metadata: grpc.aio.Metadata | None) -> bool:
    if metadata is None:
        return False
    return any(key == STREAM_OPENED_KEY and value == STREAM_OPENED_VALUE for key, value in metadata)


async def _first_of(wanted: asyncio.Event, ended: asyncio.Event) -> bool:
    """Wait for `wanted` or `ended`; True if `wanted` came first (or both at once)."""
    if wanted.is_set() or ended.is_set():
        return wanted.is_set() and not ended.is_set()
    waits = [asyncio.ensure_future(wanted.wait()), asyncio.ensure_future(ended.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    return wanted.is_set() and not ended.is_set()
