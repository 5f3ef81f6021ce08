"""Simulated time: one queue of timed actions, run one at a time in a fixed order.

Ties are broken by the order actions were scheduled in, so a run depends on its seed
alone. A step is one action; the world checks its invariants after every step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

Action = Callable[[], None]


class Scheduler:
    def __init__(self) -> None:
        self.now_ms = 0
        self.steps = 0
        self._queue: list[tuple[int, int, str, Action]] = []
        self._scheduled = 0

    def at(self, time_ms: int, label: str, action: Action) -> None:
        self._scheduled += 1
        heapq.heappush(self._queue, (max(time_ms, self.now_ms), self._scheduled, label, action))

    def after(self, delay_ms: int, label: str, action: Action) -> None:
        self.at(self.now_ms + delay_ms, label, action)

    def step(self) -> str:
        """Run the next action; its label."""
        time_ms, _, label, action = heapq.heappop(self._queue)
        self.now_ms = time_ms
        self.steps += 1
        action()
        return label

    def __len__(self) -> int:
        return len(self._queue)
