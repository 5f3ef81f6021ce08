"""Messages between simulated processes, with the faults a network has.

- A unary call (a client's request, a persister's answer) may be dropped, duplicated,
  delayed long enough to overtake later calls.
- A stream (gRPC over TCP: the bridge's streams, a follower's etcd watch) delivers in
  order and loses nothing while it lasts; a break loses whatever was in flight, and
  the sender sees the break and resumes the way the real service does.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from simulation.core.faults import DELAY, DROP, DUPLICATE, STREAM_BREAK, FaultLog, FaultPlan
from simulation.core.scheduler import Scheduler

LONG_DELAY_MS = (50, 1_500)


class Network:
    def __init__(
        self, scheduler: Scheduler, rng: random.Random, plan: FaultPlan, log: FaultLog
    ) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.plan = plan
        self.log = log
        self.messages = 0

    def _happens(self, kind: str, rate_ppm: int) -> bool:
        return self.plan.on(kind) and self.rng.randrange(1_000_000) < rate_ppm

    def breaks(self, name: str) -> bool:
        """Whether the stream `name` breaks now (noted as a fault when it does)."""
        if not self._happens(STREAM_BREAK, self.plan.stream_break_ppm):
            return False
        self.log.note(self.scheduler.now_ms, STREAM_BREAK, name)
        return True

    def _delay_ms(self, name: str) -> int:
        delay = 1 + self.rng.randrange(3)
        if self._happens(DELAY, self.plan.delay_ppm):
            self.log.note(self.scheduler.now_ms, DELAY, name)
            delay += self.rng.randrange(*LONG_DELAY_MS)
        return delay

    def unary(self, name: str, deliver: Callable[[], None]) -> None:
        self.messages += 1
        if self._happens(DROP, self.plan.drop_ppm):
            self.log.note(self.scheduler.now_ms, DROP, name)
            return
        copies = 1
        if self._happens(DUPLICATE, self.plan.duplicate_ppm):
            self.log.note(self.scheduler.now_ms, DUPLICATE, name)
            copies = 2
        for _ in range(copies):
            self.scheduler.after(self._delay_ms(name), name, deliver)


class Stream:
    """One direction of one stream; `send` is False once it broke (then `reopen`)."""

    def __init__(self, network: Network, name: str) -> None:
        self.network = network
        self.name = name
        self.generation = 0
        self.broken = True  # opened by the sender's first resume
        self._last_delivery_ms = 0

    def reopen(self) -> None:
        self.generation += 1
        self.broken = False
        self._last_delivery_ms = self.network.scheduler.now_ms

    def break_now(self) -> None:
        self.generation += 1
        self.broken = True

    def send(self, deliver: Callable[[], None]) -> bool:
        network = self.network
        if self.broken:
            return False
        network.messages += 1
        if network.breaks(self.name):
            self.break_now()
            return False
        at = max(network.scheduler.now_ms + network._delay_ms(self.name), self._last_delivery_ms)
        self._last_delivery_ms = at
        generation = self.generation

        def arrive() -> None:
            if self.generation == generation:
                deliver()

        network.scheduler.at(at, self.name, arrive)
        return True
