"""Idempotency of client order ids without reading the database on the hot path.

Three tiers, cheapest first (seeds/no-blocking-db-hot-path.txt):

1. `RotatingDedupIndex`: Bloom filters over (user id, client order id). A Bloom
   filter has no false negatives, so "certainly never seen" is trusted and the
   order is new. Bit positions come from blake2b with a fixed personalization
   (never Python's salted `hash`), so every replica sets the same bits.
2. The actor's exact map of recent results (`UserActor.recent`), bounded by the
   horizon and a count: "possibly seen" is decided there when it can be.
3. Otherwise the command parks and a `DedupLookup` goes to the persister; its
   `DedupAnswer` re-enters through the log.

Filters rotate on consensus-time session boundaries: the one being filled
advances and the oldest is cleared. With F filters of one session each, an id
is remembered at least (F - 1) sessions, which settings check covers the horizon.
"""

from __future__ import annotations

import hashlib
import struct

from services.shard.core.user_state import RecentResult

_PERSON = b"oms-dedup-bloom"
_MASK64 = (1 << 64) - 1


class RotatingDedupIndex:
    __slots__ = (
        "current",
        "digest_size",
        "filters",
        "hashes",
        "insert_sums",
        "mask",
        "session",
        "session_ms",
        "unpack",
    )

    def __init__(self, filter_bits: int, hashes: int, filters: int, session_ms: int) -> None:
        self.mask = filter_bits - 1
        self.hashes = hashes
        self.digest_size = 4 * hashes
        self.unpack = struct.Struct(f"<{hashes}I").unpack
        self.session_ms = session_ms
        self.filters = [bytearray(filter_bits // 8) for _ in range(filters)]
        # Per filter, the sum of inserted item keys mod 2^64: an O(1) digest of its content.
        self.insert_sums = [0] * filters
        self.current = 0
        self.session = 0

    def positions(self, user_id: int, client_order_id: str) -> list[int]:
        """The bit positions of one id: 32-bit words of one blake2b digest, masked."""
        digest = hashlib.blake2b(
            f"{user_id}:{client_order_id}".encode(), digest_size=self.digest_size, person=_PERSON
        ).digest()
        mask = self.mask
        return [word & mask for word in self.unpack(digest)]

    def possibly_seen(self, positions: list[int]) -> bool:
        for bits in self.filters:
            for position in positions:
                if not bits[position >> 3] & (1 << (position & 7)):
                    break
            else:
                return True
        return False

    def insert(self, positions: list[int]) -> None:
        current = self.current
        bits = self.filters[current]
        for position in positions:
            bits[position >> 3] |= 1 << (position & 7)
        self.insert_sums[current] = (self.insert_sums[current] + positions[0] + 1) & _MASK64

    def rotate_to(self, now_ms: int) -> int:
        """Advance to the session containing `now_ms`; return how many filters were cleared."""
        session = now_ms // self.session_ms
        steps = session - self.session
        if steps <= 0:
            return 0
        self.session = session
        count = len(self.filters)
        steps = count if steps > count else steps
        size = len(self.filters[0])
        for _ in range(steps):
            self.current = (self.current + 1) % count
            self.filters[self.current] = bytearray(size)
            self.insert_sums[self.current] = 0
        return steps

    def plain(self) -> tuple[object, ...]:
        return (
            self.current,
            self.session,
            tuple(self.insert_sums),
            tuple(bytes(bits) for bits in self.filters),
        )

    def restore_plain(self, data: tuple[object, ...]) -> None:
        current, session, sums, filters = data
        if not isinstance(filters, tuple) or not isinstance(sums, tuple):
            raise TypeError("dedup index snapshot is malformed")
        if len(filters) != len(self.filters) or any(
            not isinstance(bits, bytes) or len(bits) != len(self.filters[0]) for bits in filters
        ):
            raise TypeError("dedup index snapshot does not match the settings")
        if type(current) is not int or type(session) is not int:
            raise TypeError("dedup index snapshot is malformed")
        self.current = current
        self.session = session
        self.insert_sums = [int(value) for value in sums]
        self.filters = [bytearray(bits) for bits in filters]

    def digest_terms(self) -> tuple[int, ...]:
        return (self.current, self.session, *self.insert_sums)


# An exact-map entry: (order id or transfer fingerprint, reject reason, accepted at ms).
Recent = tuple[str, int, int]


def remember(
    recent: dict[str, Recent], key: str, value: Recent, horizon_start_ms: int, limit: int
) -> None:
    """Record a result, then forget the oldest before the horizon or beyond the count bound.

    `horizon_start_ms` is now minus the horizon. Forgetting is safe: an id still
    in the Bloom filters falls through to the DB lookup.
    """
    recent.pop(key, None)
    recent[key] = value
    while recent:
        oldest = next(iter(recent))
        if len(recent) <= limit and recent[oldest][2] >= horizon_start_ms:
            break
        del recent[oldest]


def within_horizon(value: Recent, now_ms: int, horizon_ms: int) -> bool:
    return now_ms - value[2] <= horizon_ms


def as_recent(result: RecentResult) -> Recent:
    return (result.order_id, result.reject_reason, result.accepted_at_ms)


def as_result(key: str, value: Recent) -> RecentResult:
    return RecentResult(key, value[0], value[1], value[2])
