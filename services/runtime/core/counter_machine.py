"""A small reference state machine: signed counters by key.

It exists to exercise the runtime (tests, `oms bench runtime`) with the same
obligations a real machine has: decode its own commands, refuse bad ones in
egress without changing state, react to timers, snapshot, restore, and keep an
incremental state hash so hashing every K entries costs O(1).

Command: key u64 | delta i64 (16 bytes). Egress: (key, new value), or
(key, None) for a refused command.

Versions, to exercise upgrades: version 1 adds the delta; version 2, which a build
implements only when asked (`implemented_versions`), adds it twice: a changed
decision that the log's VERSION entry switches on at one position for every replica.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from services.runtime.core.state_machine import ApplyContext

COMMAND = struct.Struct("<Qq")
_ITEM = struct.Struct("<Qq")
_HEADER = struct.Struct("<QQQQ")
_MASK = (1 << 64) - 1
_MIX_A = 0x9E3779B97F4A7C15
_MIX_B = 0xC2B2AE3D27D4EB4F
_REFUSED: tuple[tuple[int, None]] = ((0, None),)
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def encode_increment(key: int, delta: int) -> bytes:
    return COMMAND.pack(key, delta)


def _mix(key: int, value: int) -> int:
    """Stable per-item digest (never Python's salted `hash`)."""
    item = ((key * _MIX_A) ^ ((value & _MASK) * _MIX_B)) & _MASK
    item ^= item >> 29
    return (item * _MIX_A) & _MASK


class CounterMachine:
    def __init__(self, implemented_versions: frozenset[int] = frozenset({1})) -> None:
        self.implemented_versions = implemented_versions
        self.version = 1
        self.counters: dict[int, int] = {}
        self.timer_ticks = 0
        self.last_timer_ms = 0
        self._digest_sum = 0

    def apply(self, command: bytes, context: ApplyContext) -> Sequence[tuple[int, int | None]]:
        if len(command) != COMMAND.size:
            return _REFUSED
        key, delta = COMMAND.unpack(command)
        if self.version >= 2:
            delta *= 2
        counters = self.counters
        old = counters.get(key)
        new = delta if old is None else old + delta
        if not _INT64_MIN <= new <= _INT64_MAX:
            return ((key, None),)  # refused: the value must stay a signed 64-bit integer
        if old is not None:
            self._digest_sum -= _mix(key, old)
        self._digest_sum = (self._digest_sum + _mix(key, new)) & _MASK
        counters[key] = new
        return ((key, new),)

    def activate_version(self, version: int) -> None:
        self.version = version

    def on_timer(self, context: ApplyContext) -> Sequence[tuple[int, int | None]]:
        self.timer_ticks += 1
        self.last_timer_ms = context.consensus_time_ms
        return ()

    def snapshot(self) -> bytes:
        pack = _ITEM.pack
        counts = (len(self.counters), self.timer_ticks, self.last_timer_ms, self.version)
        parts = [_HEADER.pack(*counts)]
        parts.extend([pack(key, value) for key, value in self.counters.items()])
        return b"".join(parts)

    def restore(self, data: bytes) -> None:
        count, ticks, last_timer_ms, version = _HEADER.unpack_from(data, 0)
        if len(data) != _HEADER.size + count * _ITEM.size:
            raise ValueError("counter snapshot has the wrong length")
        counters = dict(_ITEM.iter_unpack(data[_HEADER.size :]))
        self.counters = counters
        self.timer_ticks = ticks
        self.last_timer_ms = last_timer_ms
        self.version = version
        digest = 0
        for key, value in counters.items():
            digest = (digest + _mix(key, value)) & _MASK
        self._digest_sum = digest

    def state_hash(self) -> bytes:
        summary = _HEADER.pack(
            len(self.counters), self.timer_ticks, self.last_timer_ms, self.version
        )
        return hashlib.blake2b(
            summary + self._digest_sum.to_bytes(8, "little"), digest_size=16
        ).digest()
