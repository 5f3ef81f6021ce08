"""Exponential reconnect backoff with a cap, reset once a connection has done useful work."""

from __future__ import annotations

import asyncio


class Backoff:
    def __init__(self, initial_ms: int, max_ms: int) -> None:
        if initial_ms <= 0 or max_ms < initial_ms:
            raise ValueError(f"backoff needs 0 < initial <= max, got {initial_ms}, {max_ms}")
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.next_ms = initial_ms

    def reset(self) -> None:
        self.next_ms = self.initial_ms

    async def wait(self) -> None:
        delay_ms = self.next_ms
        self.next_ms = min(self.max_ms, delay_ms * 2)
        await asyncio.sleep(delay_ms / 1000)
