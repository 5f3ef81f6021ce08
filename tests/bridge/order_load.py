"""A load generator placing (and now and then cancelling) orders through the shard.

A few workers share one ShardLink (the client every service uses) and each
places orders at a steady pace: BTC-USDT (group g1) and SOL-USDT (group g2),
buys and sells whose price ranges overlap, so some cross and fill. A command
whose stream broke (shard restart) is retried with the same client order id
until it is answered: the shard's dedup returns the original result.
`accepted` maps every order id the shard accepted to its matcher group.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

from protos.oms.v1 import common_pb2, shard_pb2
from services.clients.shard_link import ShardLink, ShardUnavailableError
from tests.shard_service.shard_client import USDT, cancel, hydrate, limit_order

RETRY_PAUSE_S = 0.05
FUNDS = [(USDT, 10**13), ("BTC", 10**10), ("SOL", 10**13)]
# (symbol, group, buy prices, sell prices, lots): min notional 1,000,000 is met by every order.
MARKETS = (
    ("BTC-USDT", "g1", (6_480_000, 6_510_000), (6_490_000, 6_520_000), (1, 3)),
    ("SOL-USDT", "g2", (14_900, 15_050), (14_950, 15_100), (100, 120)),
)


def funding(users: Sequence[int]) -> list[shard_pb2.ShardCommand]:
    return [hydrate(user, balances=FUNDS) for user in users]


class ShardOrderLoad:
    def __init__(
        self,
        shard_address: str,
        users: Sequence[int],
        *,
        seed: int,
        workers: int = 3,
        pause_s: float = 0.01,
    ) -> None:
        self.shard_address = shard_address
        self.link = ShardLink(shard_address)
        self._retired: list[ShardLink] = []
        self.users = tuple(users)
        self.seed = seed
        self.workers = workers
        self.pause_s = pause_s
        self.accepted: dict[str, str] = {}  # order id -> matcher group
        self.refused: list[shard_pb2.ShardResult] = []
        self.retries = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                for worker in range(self.workers):
                    tasks.create_task(self._work(worker))
        finally:
            for link in (*self._retired, self.link):
                await link.close()

    async def wait_accepted(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.accepted) < count:
            if time.monotonic() >= deadline:
                raise AssertionError(f"only {len(self.accepted)} of {count} orders accepted")
            await asyncio.sleep(0.02)

    async def _work(self, worker: int) -> None:
        rng = random.Random(self.seed * 100 + worker)
        mine: list[tuple[int, str]] = []
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            user = self.users[rng.randrange(len(self.users))]
            if mine and rng.random() < 0.2:
                owner, order_id = mine.pop(rng.randrange(len(mine)))
                await self._execute(cancel(owner, order_id))
            else:
                symbol, group, buys, sells, lots = MARKETS[1 if rng.random() < 0.25 else 0]
                side = common_pb2.SIDE_BUY if rng.random() < 0.5 else common_pb2.SIDE_SELL
                low, high = buys if side == common_pb2.SIDE_BUY else sells
                command = limit_order(
                    user,
                    f"load-{self.seed}-{worker}-{sequence}",
                    price_ticks=rng.randrange(low, high + 1, 10),
                    quantity_lots=rng.randint(*lots),
                    side=side,
                    symbol=symbol,
                )
                result = await self._execute(command)
                if result is None:
                    return
                if result.accepted:
                    self.accepted[result.order_id] = group
                    mine.append((user, result.order_id))
                else:
                    self.refused.append(result)
            await asyncio.sleep(self.pause_s)

    async def wait_retries(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.retries < count:
            if time.monotonic() >= deadline:
                raise AssertionError(f"only {self.retries} of {count} retries")
            await asyncio.sleep(0.02)

    async def _execute(self, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult | None:
        """The command's result; None if the load was stopped while the shard was away."""
        while True:
            link = self.link
            try:
                return await link.execute(command)
            except ShardUnavailableError:
                if self.stop.is_set():
                    return None
                self.retries += 1
                if link is self.link:
                    # A fresh link after a break: the broken stream's request reader can
                    # still take one queued command off its link and drop it (see report).
                    self.link = ShardLink(self.shard_address)
                    self._retired.append(link)
                await asyncio.sleep(RETRY_PAUSE_S)
