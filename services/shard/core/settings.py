"""What a shard trades and the bounds of its state, fixed at start.

Replicas must run with equal settings: the state hash covers a fingerprint of
them, so a mismatch shows up as a divergence instead of silently different
decisions. Every queue and map the shard keeps has a bound here, with what
happens when it is reached next to it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from services.shard.core.errors import ShardSettingsError
from services.shard.core.vocabulary import INT64_MAX, PPM

# Fault-injection modes (tests only): raise before any state change, or first
# corrupt the actor's reservation bookkeeping so its own invariant check fails.
FAULT_RAISE = "raise"
FAULT_CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class SymbolSettings:
    """One tradable pair; mirrors `oms.v1.SymbolConfig` plus where it matches."""

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int  # base minor units per lot
    tick_size: int  # quote minor units per lot per price tick
    maker_fee_ppm: int
    taker_fee_ppm: int
    matcher_group: str
    # A limit buy reserves its fee at the higher rate: it cannot know if it will make.
    max_fee_ppm: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_fee_ppm", max(self.maker_fee_ppm, self.taker_fee_ppm))

    def problems(self) -> list[str]:
        found = []
        if not self.symbol or not self.base_asset or not self.quote_asset:
            found.append(f"{self.symbol!r}: symbol and both assets must be named")
        if self.base_asset == self.quote_asset:
            found.append(f"{self.symbol}: base and quote asset must differ")
        if not self.matcher_group:
            found.append(f"{self.symbol}: matcher_group must be named")
        for name, value in (("lot_size", self.lot_size), ("tick_size", self.tick_size)):
            if not 0 < value <= INT64_MAX:
                found.append(f"{self.symbol}: {name} must be a positive int64, not {value}")
        for name, rate in (("maker", self.maker_fee_ppm), ("taker", self.taker_fee_ppm)):
            if not 0 <= rate < PPM:
                found.append(f"{self.symbol}: {name}_fee_ppm must be within 0..{PPM - 1}")
        return found


@dataclass(frozen=True, slots=True)
class RateLimitSettings:
    """A token bucket: `burst_orders` deep, refilled at `orders_per_second`."""

    burst_orders: int
    orders_per_second: int


@dataclass(frozen=True, slots=True)
class InjectedFaultSpec:
    """FAULT INJECTION (tests only): placing `client_order_id` for `user_id` fails."""

    user_id: int
    client_order_id: str
    mode: str = FAULT_RAISE


@dataclass(frozen=True, slots=True)
class ShardSettings:
    shard_id: str
    symbols: tuple[SymbolSettings, ...]
    # Assets that can be deposited besides those the symbols name (e.g. a fee token).
    extra_assets: tuple[str, ...] = ()
    normal_rate_limit: RateLimitSettings = field(
        default_factory=lambda: RateLimitSettings(burst_orders=100, orders_per_second=50)
    )
    whale_rate_limit: RateLimitSettings = field(
        default_factory=lambda: RateLimitSettings(burst_orders=5_000, orders_per_second=2_000)
    )
    # Eviction: idle past the TTL and flat. A sweep evicts at most this many; the
    # valve keeps the resident count at or below max_resident (flat users only)
    # and walks at most max_valve_visits actors per trigger.
    idle_ttl_ms: int = 30 * 60_000
    max_evictions_per_sweep: int = 10_000
    max_resident: int = 2_000_000
    max_valve_visits: int = 10_000
    # Idempotency: a client order id is a duplicate for dedup_horizon_ms after it
    # was accepted. Bloom filters rotate every dedup_session_ms and one filter
    # is cleared per rotation, so (dedup_filters - 1) sessions must cover the horizon.
    dedup_horizon_ms: int = 24 * 3_600_000
    dedup_session_ms: int = 12 * 3_600_000
    dedup_filters: int = 3
    dedup_filter_bits: int = 1 << 26  # 8 MiB per filter: ~0.5% false positives at 5M ids
    dedup_hashes: int = 4
    # Exact recent results per user; the oldest beyond this fall back to the DB lookup.
    max_recent_per_user: int = 1_000
    max_transfers_per_user: int = 1_000
    # Parking (hydration and DB dedup lookups): client commands beyond either bound
    # get BACKPRESSURE (retryable). Matcher events are never refused.
    max_parked_per_user: int = 64
    max_parked_total: int = 100_000
    # New orders get BACKPRESSURE while this many sagas (submits and cancels) are in flight.
    max_in_flight_sagas: int = 100_000
    # Reconcile reports waiting for a matcher sequence; beyond it the oldest is dropped
    # (the reconciler sends another one next round).
    max_deferred_reconciles: int = 10_000
    # Hydration requests and DB dedup lookups without an answer are sent again after this.
    redrive_after_ms: int = 5_000
    # Supervision: this many failures of one user within the window halt the actor.
    supervision_max_failures: int = 3
    supervision_window_ms: int = 10_000
    # Drawdown is measured on the P&L of symbols quoted in this asset.
    risk_settlement_asset: str = "USDT"
    # Evicted users remembered with their flushed db_version: a hydration with an
    # older version is stale and refused. Oldest forgotten first.
    max_evicted_tombstones: int = 100_000
    # Every N commands, check conservation per asset in O(assets); 0 = never.
    conservation_check_interval: int = 1_024
    # FAULT INJECTION (tests only): never set in production.
    fault_injection: tuple[InjectedFaultSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "symbols", tuple(self.symbols))
        object.__setattr__(self, "extra_assets", tuple(self.extra_assets))
        object.__setattr__(self, "fault_injection", tuple(self.fault_injection))
        found: list[str] = []
        if not self.shard_id or ":" in self.shard_id:
            found.append("shard_id must be non-empty and contain no ':' (it prefixes order ids)")
        names: dict[str, None] = {}
        for symbol in self.symbols:
            found.extend(symbol.problems())
            if symbol.symbol in names:
                found.append(f"symbol {symbol.symbol} listed twice")
            names[symbol.symbol] = None
        if not self.symbols:
            found.append("at least one symbol is required")
        for rate in (self.normal_rate_limit, self.whale_rate_limit):
            if rate.burst_orders < 1 or rate.orders_per_second < 0:
                found.append("rate limits need burst_orders >= 1 and orders_per_second >= 0")
        positive = {
            "idle_ttl_ms": self.idle_ttl_ms,
            "max_evictions_per_sweep": self.max_evictions_per_sweep,
            "max_resident": self.max_resident,
            "max_valve_visits": self.max_valve_visits,
            "dedup_horizon_ms": self.dedup_horizon_ms,
            "dedup_session_ms": self.dedup_session_ms,
            "dedup_hashes": self.dedup_hashes,
            "max_recent_per_user": self.max_recent_per_user,
            "max_transfers_per_user": self.max_transfers_per_user,
            "max_parked_per_user": self.max_parked_per_user,
            "max_parked_total": self.max_parked_total,
            "max_in_flight_sagas": self.max_in_flight_sagas,
            "max_deferred_reconciles": self.max_deferred_reconciles,
            "redrive_after_ms": self.redrive_after_ms,
            "supervision_max_failures": self.supervision_max_failures,
            "supervision_window_ms": self.supervision_window_ms,
            "max_evicted_tombstones": self.max_evicted_tombstones,
        }
        for name, value in positive.items():
            if value < 1:
                found.append(f"{name} must be positive, not {value}")
        if self.dedup_filters < 2:
            found.append("dedup_filters must be at least 2 (one is always being filled)")
        bits = self.dedup_filter_bits
        if bits < 64 or bits & (bits - 1) or bits > 1 << 32:
            found.append("dedup_filter_bits must be a power of two within 64..2^32")
        if self.dedup_hashes > 16:
            found.append("dedup_hashes must be within 1..16")
        if (self.dedup_filters - 1) * self.dedup_session_ms < self.dedup_horizon_ms:
            found.append(
                "Bloom filters forget too early: (dedup_filters - 1) * dedup_session_ms "
                "must be >= dedup_horizon_ms, or a duplicate inside the horizon passes as new"
            )
        if self.conservation_check_interval < 0:
            found.append("conservation_check_interval must be >= 0")
        if found:
            raise ShardSettingsError("; ".join(found))

    @property
    def assets(self) -> tuple[str, ...]:
        """Every asset this shard holds balances of, in a fixed order."""
        seen: dict[str, None] = {}
        for symbol in self.symbols:
            seen[symbol.base_asset] = None
            seen[symbol.quote_asset] = None
        for asset in self.extra_assets:
            seen[asset] = None
        return tuple(seen)

    def fingerprint(self) -> bytes:
        """Digest of every setting that changes a decision; part of the state hash."""
        return hashlib.blake2b(
            repr(self).encode(), digest_size=16, person=b"oms-shard-set"
        ).digest()
