"""A stream's outgoing queue: bounded, of messages already serialized once for all.

The fan-out offers each subscriber the same bytes; the stream's writer takes them in
order. A queue that reaches its bound is never let grow: a book stream is marked for
resynchronisation (its queue dropped; its writer sends a fresh book, which covers
everything dropped: conflation), a trade stream is ended with RESOURCE_EXHAUSTED (a
trade cannot be conflated away; the client resumes from its last trade).
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum


class Overflow(Enum):
    RESYNC = "resync"  # drop what is queued; the writer sends a fresh snapshot
    END = "end"  # the stream ends with RESOURCE_EXHAUSTED


class Subscriber:
    __slots__ = ("ended", "limit", "overflow", "peer", "queue", "resync", "wake")

    def __init__(self, peer: str, limit: int, overflow: Overflow) -> None:
        self.peer = peer
        self.limit = limit
        self.overflow = overflow
        self.queue: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.resync = False  # a book stream that fell behind: a fresh book next
        self.ended = ""  # why the stream must end, once it must

    def offer(self, message: bytes) -> bool:
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

    def end(self, why: str) -> None:
        self.ended = why
        self.queue.clear()
        self.wake.set()

    async def next_ready(self) -> None:
        """Until there is something to send, a resynchronisation, or an end."""
        while not self.queue and not self.resync and not self.ended:
            self.wake.clear()
            await self.wake.wait()
