"""A simulated stateless process (the bridge, a persister): ticks while alive.

A crash ends its incarnation: ticks scheduled by the old one find a newer number and
do nothing, and `restart` boots it afresh (memory gone, as a SIGKILLed process's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulation.core.world import SimWorld


class SimProcess:
    def __init__(self, world: SimWorld, label: str, tick_ms: int) -> None:
        self.world = world
        self.label = label  # in the trace: "tick <label>"
        self.tick_ms = tick_ms
        self.alive = True
        self.incarnation = 0
        self.stopped: str | None = None  # stopped for good, saying why

    def boot(self) -> None:
        """A process start: fresh memory, then ticks."""
        self.incarnation += 1
        self._schedule()

    def step(self) -> None:
        """One tick's work."""
        raise NotImplementedError

    def crash(self) -> None:
        self.alive = False
        self.incarnation += 1

    def restart(self) -> None:
        self.alive = True
        self.boot()

    def _schedule(self) -> None:
        incarnation = self.incarnation
        self.world.scheduler.after(
            self.tick_ms, f"tick {self.label}", lambda: self._tick(incarnation)
        )

    def _tick(self, incarnation: int) -> None:
        if incarnation != self.incarnation or not self.alive or self.stopped is not None:
            return
        self._schedule()
        self.step()
