"""A trading load through the gateway's public API, as clients would run it through a fault.

A few workers place (and now and then cancel) limit orders for several users on
BTC-USDT (matcher group g1) and SOL-USDT (group g2), buys and sells whose price
ranges overlap, so some cross and fill. A call that fails with UNAVAILABLE or a
deadline, or an ack marked retryable, is sent again with the SAME client order
id until it gets a definitive answer: the idempotency contract says the retry
returns the original ack. Stopping lets every request already sent finish, so
each one ends with a known answer and `acknowledged` is complete.

`TradeBurst` is the other client: one user's hundreds of orders in flight on the
batched Trade stream at the moment of a fault, then all sent again.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from gateway.client import AdminClient, GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from tests.gateway.accounts import Account, open_account

T = TypeVar("T")
RETRY_PAUSE_S = 0.05
RETRY_FOR_S = 60.0  # a fault test restarts one process: far longer than that is a bug
CALL_TIMEOUT_S = 5.0
BURST_BATCH = 10
FAULT_AFTER_ANSWERS = 100  # the stream is in full flow, not just starting
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
RETRY_REASONS = (
    gateway_pb2.GATEWAY_ERROR_REASON_UNSPECIFIED,  # no error: a retryable ack
    gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE,
    gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT,
)
# Whales: the normal tier's 50 orders/s would turn a fast load into rate-limit retries.
LOAD_TIER = shard_pb2.USER_TIER_WHALE
FUNDS = {"USDT": 10**13, "BTC": 10**10, "SOL": 10**13}
# (symbol, group, buy prices, sell prices, lots): every order is above the 1,000,000 minimum
# notional and well inside the price bands around the catalog's reference prices.
MARKETS = (
    ("BTC-USDT", "g1", (6_480_000, 6_510_000), (6_490_000, 6_520_000), (1, 3)),
    ("SOL-USDT", "g2", (14_900, 15_050), (14_950, 15_100), (100, 120)),
)
GROUP_OF = {symbol: group for symbol, group, *_ in MARKETS}
# Cancels that lost a race with a fill or with their own earlier attempt.
EXPECTED_CANCEL_REFUSALS = (
    shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_FOUND,
    shard_pb2.SHARD_REJECT_REASON_ORDER_NOT_CANCELLABLE,
)


async def load_accounts(admin: AdminClient, count: int) -> list[Account]:
    return [await open_account(admin, FUNDS, tier=LOAD_TIER) for _ in range(count)]


@dataclass
class PlacedOrder:
    user_id: int
    client_order_id: str
    symbol: str
    ack: gateway_pb2.OrderAck


@dataclass
class GatewayOrderLoad:
    address: str
    accounts: Sequence[Account]
    seed: int
    workers: int = 3
    pause_s: float = 0.005
    placed: dict[str, PlacedOrder] = field(default_factory=dict)  # by client order id
    refused: list[gateway_pb2.OrderAck] = field(default_factory=list)
    cancels: Counter[str] = field(default_factory=Counter)
    retries: int = 0  # attempts after a failed one
    duplicates_on_retry: int = 0  # retries answered with the original ack: applied before
    failures: Counter[str] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    accepted_at: list[float] = field(default_factory=list)  # monotonic, as each came

    @property
    def acknowledged(self) -> dict[str, PlacedOrder]:
        """Every order the shard accepted, by order id."""
        return {p.ack.order_id: p for p in self.placed.values() if p.ack.accepted}

    async def run(self) -> None:
        async with AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(
                    account.client(self.address, timeout_s=CALL_TIMEOUT_S)
                )
                for account in self.accounts
            ]
            async with asyncio.TaskGroup() as tasks:
                for worker in range(self.workers):
                    tasks.create_task(self._work(worker, clients))

    async def wait_accepted(self, count: int, timeout_s: float = 30.0) -> None:
        await self._wait(lambda: len(self.acknowledged) >= count, f"{count} accepted", timeout_s)

    def longest_pause_s(self, since: float) -> float:
        """The longest wait for an accepted order from `since` on (monotonic): how long
        the clients went without one across a fault."""
        times = [since, *(t for t in self.accepted_at if t >= since)]
        return max((later - earlier for earlier, later in itertools.pairwise(times)), default=0.0)

    async def wait_retries(self, count: int, timeout_s: float = 30.0) -> None:
        await self._wait(lambda: self.retries >= count, f"{count} retries", timeout_s)

    async def _wait(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"load: not {what} within {timeout_s:g} s: {len(self.acknowledged)} accepted,"
                    f" {self.retries} retries, failures {dict(self.failures)}"
                )
            await asyncio.sleep(0.02)

    async def _work(self, worker: int, clients: Sequence[OmsClient]) -> None:
        rng = random.Random(self.seed * 100 + worker)
        resting: list[tuple[OmsClient, str]] = []
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            if resting and rng.random() < 0.2:
                client, order_id = resting.pop(rng.randrange(len(resting)))
                await self._cancel(client, order_id)
            else:
                client = clients[rng.randrange(len(clients))]
                symbol, _, buys, sells, lots = MARKETS[1 if rng.random() < 0.25 else 0]
                side = common_pb2.SIDE_BUY if rng.random() < 0.5 else common_pb2.SIDE_SELL
                low, high = buys if side == common_pb2.SIDE_BUY else sells
                request = client.place_request(
                    f"load-{self.seed}-{worker}-{sequence}",
                    symbol,
                    side,
                    price_ticks=rng.randrange(low, high + 1, 10),
                    quantity_lots=rng.randint(*lots),
                )
                ack = await self._until_answered(
                    functools.partial(client.place_order, request),
                    lambda answer: answer.retryable,
                    lambda answer: answer.duplicate,
                )
                self.placed[request.client_order_id] = PlacedOrder(
                    client.user_id, request.client_order_id, symbol, ack
                )
                if ack.accepted:
                    self.accepted_at.append(time.monotonic())
                    resting.append((client, ack.order_id))
                else:
                    self.refused.append(ack)
            await asyncio.sleep(self.pause_s)

    async def _cancel(self, client: OmsClient, order_id: str) -> None:
        ack = await self._until_answered(
            lambda: client.cancel(order_id=order_id),
            lambda answer: False,
            lambda answer: False,
        )
        if ack.accepted:
            self.cancels["accepted"] += 1
        elif ack.reject_reason in EXPECTED_CANCEL_REFUSALS:
            self.cancels[shard_pb2.ShardRejectReason.Name(ack.reject_reason)] += 1
        else:
            raise AssertionError(f"cancel of {order_id} refused: {ack}")

    async def _until_answered(
        self,
        call: Callable[[], Awaitable[T]],
        retryable: Callable[[T], bool],
        duplicate: Callable[[T], bool],
    ) -> T:
        """The call's first definitive answer, sent again (same ids) while it is not."""
        deadline = time.monotonic() + RETRY_FOR_S
        attempts = 0
        while True:
            attempts += 1
            try:
                answer = await call()
            except GatewayCallError as error:
                if error.code not in RETRY_CODES:
                    raise
                self.failures[error.reason or error.code.name] += 1
            else:
                if not retryable(answer):
                    if attempts > 1 and duplicate(answer):
                        self.duplicates_on_retry += 1
                    return answer
                self.failures["retryable ack"] += 1
            if time.monotonic() >= deadline:
                raise AssertionError(f"no definitive answer within {RETRY_FOR_S:g} s")
            self.retries += 1
            await asyncio.sleep(RETRY_PAUSE_S)


class RunningLoad(Protocol):
    """A load that runs until its `stop` is set (`GatewayOrderLoad`, the scaling load)."""

    stop: asyncio.Event

    async def run(self) -> None: ...


async def run_load_until(load: RunningLoad, steps: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `load` while `steps` runs; then stop it and let every request finish.

    A load that fails (an answer no client should get) ends the steps at once.
    """
    running = asyncio.create_task(load.run())
    stepping = asyncio.create_task(steps())
    try:
        await asyncio.wait({running, stepping}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            stepping.cancel()
            running.result()
            raise AssertionError("the load stopped before the steps were over")
        stepping.result()
    finally:
        load.stop.set()
        if not stepping.done():
            stepping.cancel()
        await asyncio.gather(running, stepping, return_exceptions=True)
    running.result()


@dataclass
class TradeBurst:
    """Many orders of one user in flight on a Trade stream when a process dies.

    `send` puts them all on the stream in small batches and calls `fault` once the
    first answers are back, so the rest are somewhere between the client and the
    shard's log. `retry` sends every one of them again with the same client order id
    until each has a definitive ack. An order applied before the fault whose answer
    was lost comes back `duplicate` with its original order id.
    """

    client: OmsClient
    requests: Sequence[gateway_pb2.PlaceOrderRequest]
    first: dict[str, gateway_pb2.OrderAck] = field(default_factory=dict)  # answered at once
    final: dict[str, gateway_pb2.OrderAck] = field(default_factory=dict)

    async def send(self, fault: Callable[[], None]) -> None:
        async with self.client.trade() as stream:
            wrapped = [stream.request(request) for request in self.requests]
            # Small batches: the shard logs them as many records, some durable and some
            # not yet when the fault comes.
            for start in range(0, len(wrapped), BURST_BATCH):
                batch = wrapped[start : start + BURST_BATCH]
                stream.send(gateway_pb2.TradeRequestBatch(requests=batch))
            deadline = time.monotonic() + RETRY_FOR_S
            while len(stream.answers) < min(FAULT_AFTER_ANSWERS, len(wrapped)):
                if time.monotonic() >= deadline:
                    raise AssertionError("no answer to the burst")
                await asyncio.sleep(0.001)
            fault()
            for request, trade in zip(self.requests, wrapped, strict=True):
                try:
                    (response,) = await stream.wait([trade.request_id], RETRY_FOR_S)
                except GatewayCallError:
                    continue  # the stream ended with the process: unanswered
                if response.HasField("place") and not response.place.retryable:
                    self.first[request.client_order_id] = response.place

    async def retry(self) -> None:
        deadline = time.monotonic() + RETRY_FOR_S
        while len(self.final) < len(self.requests):
            waiting = [r for r in self.requests if r.client_order_id not in self.final]
            try:
                async with self.client.trade() as stream:
                    responses = await stream.submit(waiting, RETRY_FOR_S)
            except GatewayCallError as error:
                if error.code not in RETRY_CODES:
                    raise
                responses = []
            for request, response in zip(waiting, responses, strict=False):
                if response.HasField("place") and not response.place.retryable:
                    self.final[request.client_order_id] = response.place
                elif response.error.reason not in RETRY_REASONS:
                    raise AssertionError(f"{request.client_order_id}: {response}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{len(waiting)} burst orders never answered")
            if len(self.final) < len(self.requests):
                await asyncio.sleep(RETRY_PAUSE_S)

    @property
    def lost_answers_applied(self) -> int:
        """Orders applied before the fault whose first answer never came back."""
        return sum(
            1
            for client_order_id, ack in self.final.items()
            if client_order_id not in self.first and ack.duplicate
        )

    def placed(self) -> list[PlacedOrder]:
        return [
            PlacedOrder(
                self.client.user_id, r.client_order_id, r.symbol, self.final[r.client_order_id]
            )
            for r in self.requests
        ]

    def check_answers(self) -> None:
        """Every order accepted once: a first answer and its retry name the same order."""
        for request in self.requests:
            final = self.final[request.client_order_id]
            assert final.accepted, final
            first = self.first.get(request.client_order_id)
            if first is not None:
                assert final.duplicate and final.order_id == first.order_id, (first, final)
