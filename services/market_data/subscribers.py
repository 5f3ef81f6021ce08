"""A stream's outgoing queue: bounded, of messages already serialized once for all.

The fan-out offers each subscriber the same bytes (for a book stream, with the diff
they hold); the stream's writer takes everything queued at once and sends it as one
message (`MarketMirror.coalesce_diffs`, concatenated trades): a gRPC write costs
about the same whatever it carries, so a stream that fell behind catches up with
fewer writes, not more CPU per message.

A queue that reaches its bound is never let grow: a book stream is marked for
resynchronisation (its queue dropped; its writer sends a fresh book, which covers
everything dropped: conflation), a trade stream is ended with RESOURCE_EXHAUSTED (a
trade cannot be conflated away; the client resumes from its last trade).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Generic, TypeVar

Item = TypeVar("Item")


class Overflow(Enum):
    RESYNC = "resync"  # drop what is queued; the writer sends a fresh snapshot
    END = "end"  # the stream ends with RESOURCE_EXHAUSTED


class Subscriber(Generic[Item]):
    __slots__ = ("ended", "limit", "overflow", "peer", "queue", "resync", "wake")

    def __init__(self, peer: str, limit: int, overflow: Overflow) -> None:
        self.peer = peer
        self.limit = limit
        self.overflow = overflow
        self.queue: deque[Item] = deque()
        self.wake = asyncio.Event()
        self.resync = False  # a book stream that fell behind: a fresh book next
        self.ended = ""  # why the stream must end, once it must

    def offer(self, message: Item) -> bool:
        """Queue one message; False when the subscriber overflowed (and was handled)."""
        if self.resync or self.ended:
            return False
        if len(self.queue) >= self.limit:
            self.queue.clear()
            if self.overflow is Overflow.RESYNC:
                self.resync = True
            else:
                self.ended = f"the stream fell {self.limit} messages behind"
            self.wake.set()
            return False
        self.queue.append(message)
        self.wake.set()
        return True

    def take_all(self) -> list[Item]:
        """Everything queued, oldest first."""
        taken = list(self.queue)
        self.queue.clear()
        return taken

    def take(self, budget: int, size: Callable[[Item], int]) -> list[Item]:
        """What is queued, oldest first, for one write: at least one message, then more
        while their `size` stays within `budget`."""
        queue = self.queue
        taken = [queue.popleft()]
        used = size(taken[0])
        while queue and used + size(queue[0]) <= budget:
            used += size(queue[0])
            taken.append(queue.popleft())
        return taken

    def end(self, why: str) -> None:
        self.ended = why
        self.queue.clear()
        self.wake.set()

    async def next_ready(self) -> None:
        """Until there is something to send, a resynchronisation, or an end."""
        while not self.queue and not self.resync and not self.ended:
            self.wake.clear()
            await self.wake.wait()
