"""A small load generator for the persister's crash tests: deposits and filled orders.

Workers each own some users and loop: deposit, place a limit buy, then (under one
lock, so matcher sequences reach the shard in order) its acceptance and full fill.
Every order ends filled, so users go flat and idle ones get evicted and flushed
while the load runs. Commands parked behind a hydration simply take longer: when
the persister died with a hydration read in flight, the shard asks again after 5 s
of consensus time, so each command may wait up to `COMMAND_WAIT_S`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence

from protos.oms.v1 import shard_pb2
from tests.shard_service.shard_client import (
    ShardClient,
    accepted_event,
    deposit,
    fill_event,
    limit_order,
    matcher_events,
)

PRICE = 6_500_000
COMMAND_WAIT_S = 30.0
# Client order ids and transfer ids stay unique across flows on one shard.
_flows = itertools.count(1)


class OrderFlow:
    def __init__(
        self,
        shard: ShardClient,
        users: Sequence[int],
        *,
        sequences: Iterator[int],
        workers: int = 4,
    ) -> None:
        """`sequences`: the shard's matcher sequence (one per shard, across flows)."""
        self.shard = shard
        self.users = users
        self.workers = workers
        self.rounds = 0
        self.served: set[int] = set()  # users with at least one round done
        self.flow_id = next(_flows)
        self._sequences = sequences
        self._trades = itertools.count(1)
        self._events = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for worker in range(self.workers):
            mine = self.users[worker :: self.workers]
            self._tasks.append(asyncio.create_task(self._run(worker, mine)))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _run(self, worker: int, users: Sequence[int]) -> None:
        for round_number in itertools.count():
            for user in users:
                if self._stop.is_set():
                    return
                await self._one_round(user, f"{self.flow_id}-{worker}-{round_number}-{user}")

    async def _one_round(self, user: int, tag: str) -> None:
        funded = await self._execute(deposit(user, 1_000_000_000, transfer_id=f"t-{tag}"))
        assert funded.accepted, funded
        placed = await self._execute(
            limit_order(user, f"c-{tag}", price_ticks=PRICE, quantity_lots=1)
        )
        assert placed.accepted, placed
        async with self._events:
            accepted = accepted_event(next(self._sequences), placed.order_id, user)
            fill = fill_event(
                next(self._sequences),
                placed.order_id,
                user,
                price_ticks=PRICE,
                quantity_lots=1,
                remaining_lots=0,
                trade_id=next(self._trades),
            )
            await self.shard.run(matcher_events([accepted, fill]))
        self.rounds += 1
        self.served.add(user)

    async def _execute(self, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult:
        async with self.shard.execute() as stream:
            stream.send(command)
            return await stream.wait_final(command.correlation_id, timeout_s=COMMAND_WAIT_S)
