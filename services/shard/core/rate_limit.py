"""A deterministic token bucket refilled on consensus time, in integer milli-tokens.

Refill is computed from the consensus time of the command (never a clock), so
every replica and every replay refills identically. One order costs 1,000
milli-tokens; a rate of R orders per second refills R milli-tokens per
millisecond. Only admitted orders take a token: a refused order changes no
state at all (see `ShardMachine` on refusals).
"""

from __future__ import annotations

from services.shard.core.settings import RateLimitSettings

COST_MILLI_TOKENS = 1_000


class TokenBucket:
    __slots__ = ("milli_tokens", "refilled_at_ms")

    def __init__(self, milli_tokens: int, refilled_at_ms: int) -> None:
        self.milli_tokens = milli_tokens
        self.refilled_at_ms = refilled_at_ms

    @classmethod
    def full(cls, limit: RateLimitSettings, now_ms: int) -> TokenBucket:
        return cls(limit.burst_orders * COST_MILLI_TOKENS, now_ms)

    def level(self, now_ms: int, limit: RateLimitSettings) -> int:
        """Milli-tokens available at `now_ms`, without changing the bucket."""
        elapsed = now_ms - self.refilled_at_ms
        level = self.milli_tokens
        if elapsed > 0:
            level += elapsed * limit.orders_per_second
        capacity = limit.burst_orders * COST_MILLI_TOKENS
        return capacity if level > capacity else level

    def can_take(self, now_ms: int, limit: RateLimitSettings) -> bool:
        return self.level(now_ms, limit) >= COST_MILLI_TOKENS

    def take(self, now_ms: int, limit: RateLimitSettings) -> None:
        self.spend(self.level(now_ms, limit), now_ms)

    def spend(self, level: int, now_ms: int) -> None:
        """Take one order's tokens from `level`, the bucket's level at `now_ms`."""
        self.milli_tokens = level - COST_MILLI_TOKENS
        self.refilled_at_ms = max(self.refilled_at_ms, now_ms)

    def plain(self) -> tuple[int, int]:
        return (self.milli_tokens, self.refilled_at_ms)
