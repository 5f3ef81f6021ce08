"""A steady trading load for scaling tests, through the gateway's public API.

Makers (whales, pinned so the hash never moves them) keep a few GTC bids and asks
resting on BTC-USDT; takers (normal users, routed by the hash) send IOC orders that
cross them, so a taker is flat again within milliseconds of each order: a wave can
quiesce it. Every call that fails with UNAVAILABLE or a deadline, or whose ack is
retryable (NOT_OWNER past the gateway's patience, a user in transit), is sent again
with the same client order id until it gets a definitive answer, as the contract
says clients do; `acks` then holds every order the mesh accepted, once each.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.client import GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2
from tests.e2e.gateway_load import RETRY_CODES
from tests.gateway.accounts import Account

T = TypeVar("T")
S = common_pb2
SYMBOL = "BTC-USDT"
MID = 6_500_000
RETRY_PAUSE_S = 0.02
RETRY_FOR_S = 60.0
CALL_TIMEOUT_S = 5.0
MAKER_RESTING = 6  # per maker; older quotes are cancelled


@dataclass
class ScalingLoad:
    address: str
    makers: Sequence[Account]
    takers: Sequence[Account]
    seed: int = 1
    taker_workers: int = 4
    pause_s: float = 0.002
    acks: dict[str, gateway_pb2.OrderAck] = field(default_factory=dict)  # by client order id
    answered_at: list[tuple[float, float]] = field(default_factory=list)  # (sent, latency_s)
    retries: Counter[str] = field(default_factory=Counter)
    users_of: dict[str, int] = field(default_factory=dict)  # client order id -> user
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def accepted(self) -> dict[str, gateway_pb2.OrderAck]:
        return {ack.order_id: ack for ack in self.acks.values() if ack.accepted}

    async def run(self) -> None:
        async with AsyncExitStack() as stack:
            makers = [
                await stack.enter_async_context(a.client(self.address, timeout_s=CALL_TIMEOUT_S))
                for a in self.makers
            ]
            takers = [
                await stack.enter_async_context(a.client(self.address, timeout_s=CALL_TIMEOUT_S))
                for a in self.takers
            ]
            async with asyncio.TaskGroup() as tasks:
                for index, maker in enumerate(makers):
                    tasks.create_task(self._make(index, maker))
                for worker in range(self.taker_workers):
                    tasks.create_task(self._take(worker, takers))

    async def wait_accepted(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.accepted) < count:
            assert time.monotonic() < deadline, (
                f"load: {len(self.accepted)} accepted, not {count}; retries {dict(self.retries)}"
            )
            await asyncio.sleep(0.02)

    async def _make(self, index: int, client: OmsClient) -> None:
        rng = random.Random(self.seed * 1000 + index)
        resting: list[str] = []
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            side = S.SIDE_BUY if sequence % 2 else S.SIDE_SELL
            offset = rng.randrange(0, 20_000, 1_000)
            price = MID - 1_000 - offset if side == S.SIDE_BUY else MID + 1_000 + offset
            request = client.place_request(
                f"make-{self.seed}-{index}-{sequence}",
                SYMBOL,
                side,
                price_ticks=price,
                quantity_lots=rng.randint(20, 60),
            )
            ack = await self._place(client, request)
            if ack.accepted:
                resting.append(ack.order_id)
            while len(resting) > MAKER_RESTING:
                cancel = functools.partial(client.cancel, order_id=resting.pop(0))
                await self._answer(cancel, _never_retryable)
            await asyncio.sleep(self.pause_s * 10)

    async def _take(self, worker: int, clients: Sequence[OmsClient]) -> None:
        rng = random.Random(self.seed * 100 + worker)
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            client = clients[rng.randrange(len(clients))]
            side = S.SIDE_BUY if rng.random() < 0.5 else S.SIDE_SELL
            # Through the best quotes, IOC: fills what rests there, never rests itself.
            price = MID + 30_000 if side == S.SIDE_BUY else MID - 30_000
            request = client.place_request(
                f"take-{self.seed}-{worker}-{sequence}",
                SYMBOL,
                side,
                price_ticks=price,
                quantity_lots=rng.randint(1, 3),
                time_in_force=S.TIME_IN_FORCE_IOC,
            )
            await self._place(client, request)
            await asyncio.sleep(self.pause_s)

    async def _place(
        self, client: OmsClient, request: gateway_pb2.PlaceOrderRequest
    ) -> gateway_pb2.OrderAck:
        sent = time.monotonic()
        ack = await self._answer(
            functools.partial(client.place_order, request), lambda a: a.retryable
        )
        self.answered_at.append((sent, time.monotonic() - sent))
        self.acks[request.client_order_id] = ack
        self.users_of[request.client_order_id] = client.user_id
        return ack

    async def _answer(self, call: Callable[[], Awaitable[T]], retryable: Callable[[T], bool]) -> T:
        """The call's first definitive answer, sent again (same ids) while it is not."""
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                answer = await call()
            except GatewayCallError as error:
                if error.code not in RETRY_CODES:
                    raise
                self.retries[error.reason or error.code.name] += 1
            else:
                if not retryable(answer):
                    return answer
                self.retries["retryable ack"] += 1
            assert time.monotonic() < deadline, f"no definitive answer in {RETRY_FOR_S:g} s"
            await asyncio.sleep(RETRY_PAUSE_S)


def _never_retryable(answer: object) -> bool:
    return False
