"""Messages and an async client for the `oms.v1.UserShard` service under test.

`ExecuteStream` keeps one bidi Execute stream open: `send` writes a batch (or raw
bytes), a reader task files every result by correlation id, and `wait_result`
polls those with a deadline. `parked` results and final results are kept apart,
so a test can assert that a final arrived exactly once and on which stream.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TypeVar

import grpc

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2, shard_pb2_grpc

EXECUTE_METHOD = "/oms.v1.UserShard/Execute"
WAIT_S = 10.0
POLL_S = 0.02
BTC = "BTC-USDT"
USDT = "USDT"
# BTC-USDT (services/markets/default_markets.toml): tick_size 1 quote minor unit per lot
# per tick, lot 10_000 sats, fees 1_000 / 2_000 ppm (the higher one is reserved).
BTC_LOT = 10_000
BTC_TICK = 1
MAX_FEE_PPM = 2_000
TAKER_FEE_PPM = 2_000

T = TypeVar("T")
CLIENT_COMMANDS = frozenset(
    {"place", "cancel", "deposit", "withdraw", "set_risk_limits", "user_control"}
)
_correlation = itertools.count(1)
# Matcher event sequences are per (matcher group, OMS shard): tests on one shard process
# share this counter so each new event is the next in sequence.
_sequences = itertools.count(1)


def next_correlation() -> int:
    return next(_correlation)


def next_sequence() -> int:
    return next(_sequences)


# --- commands -----------------------------------------------------------------------


def hydrate(
    user_id: int,
    *,
    known: bool = True,
    balances: Sequence[tuple[str, int]] = (),
    positions: Sequence[tuple[str, int, int]] = (),
    epoch: int = 0,
    correlation_id: int | None = None,
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand(correlation_id=correlation_id or next_correlation())
    command.hydrate.user_id = user_id
    command.hydrate.epoch = epoch
    command.hydrate.known = known
    if known:
        state = command.hydrate.state
        state.user_id = user_id
        state.tier = shard_pb2.USER_TIER_NORMAL
        for asset, total in balances:
            state.balances.add(asset=asset, total=total)
        for symbol, quantity_lots, cost_basis in positions:
            state.positions.add(symbol=symbol, quantity_lots=quantity_lots, cost_basis=cost_basis)
    return command


def deposit(
    user_id: int, amount: int, *, asset: str = USDT, transfer_id: str | None = None
) -> shard_pb2.ShardCommand:
    correlation_id = next_correlation()
    command = shard_pb2.ShardCommand(correlation_id=correlation_id)
    command.deposit.user_id = user_id
    command.deposit.asset = asset
    command.deposit.amount = amount
    command.deposit.transfer_id = transfer_id or f"t-{user_id}-{correlation_id}"
    return command


def limit_order(
    user_id: int,
    client_order_id: str,
    *,
    price_ticks: int,
    quantity_lots: int,
    side: int = common_pb2.SIDE_BUY,
    symbol: str = BTC,
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand(correlation_id=next_correlation())
    place = command.place
    place.user_id = user_id
    place.client_order_id = client_order_id
    place.symbol = symbol
    place.side = side  # type: ignore[assignment]
    place.order_type = common_pb2.ORDER_TYPE_LIMIT
    place.time_in_force = common_pb2.TIME_IN_FORCE_GTC
    place.price_ticks = price_ticks
    place.quantity_lots = quantity_lots
    return command


def cancel(user_id: int, order_id: str) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand(correlation_id=next_correlation())
    command.cancel.user_id = user_id
    command.cancel.order_id = order_id
    return command


def matcher_events(
    events: Sequence[matcher_pb2.MatcherEvent], group: str = "g1"
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand(correlation_id=next_correlation())
    command.matcher_events.matcher_group = group
    command.matcher_events.events.extend(events)
    return command


def accepted_event(
    sequence: int, order_id: str, user_id: int, shard_id: str = "s1"
) -> matcher_pb2.MatcherEvent:
    event = matcher_pb2.MatcherEvent(
        sequence=sequence, oms_shard=shard_id, order_id=order_id, user_id=user_id
    )
    event.accepted.order.status = common_pb2.ORDER_STATUS_OPEN
    return event


def fill_event(
    sequence: int,
    order_id: str,
    user_id: int,
    *,
    price_ticks: int,
    quantity_lots: int,
    remaining_lots: int,
    trade_id: int,
    side: int = common_pb2.SIDE_BUY,
    fee_ppm: int = TAKER_FEE_PPM,
    shard_id: str = "s1",
) -> matcher_pb2.MatcherEvent:
    notional = price_ticks * quantity_lots * BTC_TICK
    event = matcher_pb2.MatcherEvent(
        sequence=sequence, oms_shard=shard_id, order_id=order_id, user_id=user_id
    )
    fill = event.fill
    fill.trade_id = trade_id
    fill.symbol = BTC
    fill.side = side  # type: ignore[assignment]
    fill.price_ticks = price_ticks
    fill.quantity_lots = quantity_lots
    fill.notional = notional
    fill.fee = notional * fee_ppm // 1_000_000
    fill.maker = False
    fill.remaining_lots = remaining_lots
    fill.order_done = remaining_lots == 0
    return event


def batch(*commands: shard_pb2.ShardCommand) -> bytes:
    return shard_pb2.ShardCommandBatch(commands=list(commands)).SerializeToString()


def reservation_of_limit_buy(price_ticks: int, quantity_lots: int) -> int:
    notional = price_ticks * quantity_lots * BTC_TICK
    return notional + notional * MAX_FEE_PPM // 1_000_000


# --- polling --------------------------------------------------------------------------


async def eventually(
    probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], *, timeout_s: float = WAIT_S
) -> T:
    """Await `probe()` until `check` holds of its value; fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s; last: {value!r}")
        await asyncio.sleep(POLL_S)


async def wait_until(condition: Callable[[], bool], *, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s")
        await asyncio.sleep(POLL_S)


# --- the Execute stream -------------------------------------------------------------------


class ExecuteStream:
    """One open Execute stream; results filed by correlation id."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._requests: asyncio.Queue[bytes | None] = asyncio.Queue()
        method = channel.stream_stream(
            EXECUTE_METHOD,
            request_serializer=None,
            response_deserializer=shard_pb2.ShardResultBatch.FromString,
        )
        self._call = method(self._outgoing(), metadata=tuple(metadata) or None)
        self.parked: dict[int, list[shard_pb2.ShardResult]] = defaultdict(list)
        self.finals: dict[int, list[shard_pb2.ShardResult]] = defaultdict(list)
        self.error: grpc.RpcError | None = None
        self.closed = False
        self._reader = asyncio.create_task(self._read())

    async def _outgoing(self) -> AsyncIterator[bytes]:
        while (payload := await self._requests.get()) is not None:
            yield payload

    async def _read(self) -> None:
        try:
            async for message in self._call:
                assert isinstance(message, shard_pb2.ShardResultBatch)
                for result in message.results:
                    target = self.parked if result.parked else self.finals
                    target[result.correlation_id].append(result)
        except grpc.RpcError as error:
            self.error = error
        finally:
            self.closed = True

    def send_raw(self, payload: bytes) -> None:
        self._requests.put_nowait(payload)

    def send(self, *commands: shard_pb2.ShardCommand) -> list[int]:
        self.send_raw(batch(*commands))
        return [command.correlation_id for command in commands]

    async def wait_final(
        self, correlation_id: int, timeout_s: float = WAIT_S
    ) -> shard_pb2.ShardResult:
        await wait_until(lambda: correlation_id in self.finals or self.closed, timeout_s=timeout_s)
        if correlation_id not in self.finals:
            raise AssertionError(f"stream closed ({self.error!r}) before {correlation_id}")
        return self.finals[correlation_id][0]

    async def wait_parked(
        self, correlation_id: int, timeout_s: float = WAIT_S
    ) -> shard_pb2.ShardResult:
        await wait_until(lambda: correlation_id in self.parked or self.closed, timeout_s=timeout_s)
        if correlation_id not in self.parked:
            raise AssertionError(f"stream closed ({self.error!r}) before parked {correlation_id}")
        return self.parked[correlation_id][0]

    async def run(self, *commands: shard_pb2.ShardCommand) -> list[shard_pb2.ShardResult]:
        """Send one batch; once it is applied, the final result of each client command.

        Only client commands are answered: hydrations, flush answers, matcher events
        and marks produce no ShardResult. When the batch holds such commands a fence
        (a cancel of an order id no shard issues: refused statically, no state change)
        is appended, so its answer proves the whole entry applied and durable.
        """
        answered = [c for c in commands if c.WhichOneof("command") in CLIENT_COMMANDS]
        fence = None
        if len(answered) < len(commands):
            fence = cancel(0, "fence")
            commands = (*commands, fence)
        self.send(*commands)
        results = [await self.wait_final(command.correlation_id) for command in answered]
        if fence is not None:
            await self.wait_final(fence.correlation_id)
        return results

    async def close(self) -> None:
        self._requests.put_nowait(None)
        try:
            async with asyncio.timeout(WAIT_S):
                await asyncio.shield(self._reader)
        except TimeoutError:
            self._call.cancel()
        finally:
            if not self._reader.done():
                self._reader.cancel()

    def cancel(self) -> None:
        self._call.cancel()
        self._reader.cancel()

    async def __aenter__(self) -> ExecuteStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cancel()


class ShardClient:
    """The unary/streaming RPCs, plus Execute streams bound to the same channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = shard_pb2_grpc.UserShardStub(channel)

    def execute(self) -> ExecuteStream:
        return ExecuteStream(self.channel)

    async def run(self, *commands: shard_pb2.ShardCommand) -> list[shard_pb2.ShardResult]:
        """One command batch on a fresh stream; the final results in order."""
        async with self.execute() as stream:
            return await stream.run(*commands)

    async def actor(self, user_id: int) -> shard_pb2.ActorView:
        view = await self.stub.GetActor(shard_pb2.ActorQuery(user_id=user_id), timeout=WAIT_S)
        assert isinstance(view, shard_pb2.ActorView)
        return view

    async def status(self) -> shard_pb2.ShardStatus:
        status = await self.stub.GetStatus(shard_pb2.ShardStatusRequest(), timeout=WAIT_S)
        assert isinstance(status, shard_pb2.ShardStatus)
        return status

    async def in_flight(self) -> shard_pb2.InFlightSnapshot:
        snapshot = await self.stub.GetInFlight(shard_pb2.InFlightRequest(), timeout=WAIT_S)
        assert isinstance(snapshot, shard_pb2.InFlightSnapshot)
        return snapshot

    async def egress(
        self,
        kinds: Sequence[str] = (),
        *,
        from_position: int = 1,
        until: Callable[[list[shard_pb2.ShardEgress]], bool] | None = None,
        through: int = 0,
        timeout_s: float = WAIT_S,
    ) -> list[shard_pb2.ShardEgress]:
        """Subscribe, collect items until `until(items)` holds (or, with `through`, until
        the shard says every item through that position was sent), then disconnect."""
        items: list[shard_pb2.ShardEgress] = []
        call = self.stub.SubscribeEgress(
            shard_pb2.EgressSubscription(
                from_position=from_position, kinds=list(kinds), through_positions=bool(through)
            )
        )

        async def collect() -> None:
            async for message in call:
                assert isinstance(message, shard_pb2.ShardEgressBatch)
                items.extend(message.items)
                if through and message.through_position >= through:
                    return
                if until is not None and until(items):
                    return

        try:
            async with asyncio.timeout(timeout_s):
                await collect()
        except TimeoutError as error:
            raise AssertionError(f"egress condition not met; got {items!r}") from error
        finally:
            call.cancel()
        return items


def unpositioned(view: shard_pb2.ActorView) -> shard_pb2.ActorView:
    """The view without the position it was read at: what a user's state is."""
    copy = shard_pb2.ActorView()
    copy.CopyFrom(view)
    copy.ClearField("as_of_position")
    return copy


def balance(view: shard_pb2.ActorView, asset: str) -> shard_pb2.AssetBalance:
    for entry in view.state.balances:
        if entry.asset == asset:
            return entry
    return shard_pb2.AssetBalance(asset=asset)
