"""A deposit load through a `ShardLink`: each user's caller deposits 1 unit at a time,
retrying each transfer id until its answer is final, so the count of accepted
transfers per user is exactly what its balance must be (exactly once)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from services.clients.shard_link import ShardLink, ShardUnavailableError
from tests.shard_service.shard_client import deposit, hydrate

TIMEOUT_S = 2.0
PAUSE_S = 0.025  # per caller: 16 callers, about 600 commands/s in all
RETRY_PAUSE_S = 0.02


@dataclass
class DepositLoad:
    """Each user's caller deposits 1 unit at a time, retrying each transfer id until final."""

    link: ShardLink
    users: range
    accepted: Counter[int] = field(default_factory=Counter)  # per user: transfers applied
    answers: Counter[str] = field(default_factory=Counter)
    slowest_answer_s: float = 0.0
    last_success: float = 0.0
    longest_gap_s: float = 0.0  # between two accepted deposits (any users): a test resets it
    max_queued: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for user_id in self.users:
                group.create_task(self._caller(user_id))

    async def wait_successes(self, count: int, timeout_s: float = 30.0) -> None:
        target = sum(self.accepted.values()) + count
        deadline = time.monotonic() + timeout_s
        while sum(self.accepted.values()) < target:
            assert time.monotonic() < deadline, f"no {count} successes: {self.answers}"
            await asyncio.sleep(0.02)

    async def wait_answers(self, kind: str, count: int, timeout_s: float = 30.0) -> None:
        target = self.answers[kind] + count
        deadline = time.monotonic() + timeout_s
        while self.answers[kind] < target:
            assert time.monotonic() < deadline, f"no {count} {kind}: {self.answers}"
            await asyncio.sleep(0.02)

    async def _caller(self, user_id: int) -> None:
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            transfer_id = f"load-{user_id}-{sequence}"
            while True:
                started = time.monotonic()
                try:
                    result = await self.link.execute(
                        deposit(user_id, 1, transfer_id=transfer_id), timeout_s=TIMEOUT_S
                    )
                except (ShardUnavailableError, TimeoutError) as error:
                    self._answered(started, type(error).__name__)
                    await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                self._answered(started, "duplicate" if result.duplicate else "accepted")
                assert result.accepted, result
                self.accepted[user_id] += 1
                now = time.monotonic()
                if self.last_success:
                    self.longest_gap_s = max(self.longest_gap_s, now - self.last_success)
                self.last_success = now
                break
            await asyncio.sleep(PAUSE_S)

    def _answered(self, started: float, kind: str) -> None:
        self.answers[kind] += 1
        self.slowest_answer_s = max(self.slowest_answer_s, time.monotonic() - started)
        self.max_queued = max(self.max_queued, self.link.statistics().queued)


async def start_deposit_load(
    link: ShardLink, users: range
) -> tuple[DepositLoad, asyncio.Task[None]]:
    """Hydrate `users`, wait for the link, and start the load."""
    await link.send([hydrate(user_id) for user_id in users])
    await link.wait_ready(10)
    load = DepositLoad(link, users)
    return load, asyncio.create_task(load.run())


async def stop_deposit_load(load: DepositLoad, running: asyncio.Task[None]) -> None:
    """Stop the callers (each finishes its transfer) and close the link."""
    load.stop.set()
    async with asyncio.timeout(60):
        await running
    await load.link.close()
