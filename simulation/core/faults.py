"""Which faults a run may inject, how often, and what it did inject.

A fault kind switched off never happens; shrinking a failing seed switches kinds
off one at a time to find the ones the failure needs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

# Message faults, on every link.
DROP = "drop"
DUPLICATE = "duplicate"
DELAY = "delay"  # a long delay; with random delays it also reorders unary calls
STREAM_BREAK = "stream_break"
# Process faults.
CRASH = "crash"  # SIGKILL: memory gone, unsynced disk writes lost or torn
PAUSE = "pause"  # a process stopped (GC, VM steal): a zombie leader when it leads
CLOCK_STEP = "clock_step"  # a process's wall clock jumps forward or back
# Storage faults.
SNAPSHOT_CORRUPT = "snapshot_corrupt"  # a bit of the newest snapshot flipped, then a crash
# PostgreSQL faults.
STORE_ABORT = "store_abort"  # a transaction refused (serialization, connection lost)
STORE_UNKNOWN = "store_unknown"  # the commit's outcome is not known to the caller
STORE_DOWN = "store_down"  # the database unreachable for a while
# etcd: its quorum lost for a while (every call unanswered, leases standing still).
ETCD_DOWN = "etcd_down"
# etcd's history compacted at its revision now by someone other than a leader (an
# operator's `etcdctl compact`, etcd's own auto-compaction): watches behind it end.
ETCD_COMPACT = "etcd_compact"
# Routing: a user moved to another shard group while it trades (two epochs).
USER_MOVE = "user_move"
# An operator at the admin API: a user's trading halted, its risk limits tightened
# (each lifted later), or its actor restarted.
OPERATOR = "operator"
# Scaling: a shard group added (scale-out) or removed (scale-in) by the wave controller.
SCALE = "scale"
# Torn and lost snapshot writes are not kinds of their own: a crash makes them.

FAULT_KINDS: tuple[str, ...] = (
    CLOCK_STEP,
    CRASH,
    DELAY,
    DROP,
    DUPLICATE,
    ETCD_COMPACT,
    ETCD_DOWN,
    OPERATOR,
    PAUSE,
    SCALE,
    SNAPSHOT_CORRUPT,
    STORE_ABORT,
    STORE_DOWN,
    STORE_UNKNOWN,
    STREAM_BREAK,
    USER_MOVE,
)
PROCESS_FAULTS: tuple[str, ...] = (
    CLOCK_STEP,
    CRASH,
    ETCD_COMPACT,
    ETCD_DOWN,
    PAUSE,
    SNAPSHOT_CORRUPT,
    STORE_DOWN,
)


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Rates in millionths per message, per transaction, or per chaos tick."""

    kinds: frozenset[str] = frozenset(FAULT_KINDS)
    drop_ppm: int = 20_000
    duplicate_ppm: int = 20_000
    delay_ppm: int = 20_000
    stream_break_ppm: int = 2_000
    store_abort_ppm: int = 30_000
    store_unknown_ppm: int = 30_000
    process_fault_ppm: int = 60_000  # per chaos tick, one process fault of an enabled kind

    def on(self, kind: str) -> bool:
        return kind in self.kinds

    def without(self, kind: str) -> FaultPlan:
        return replace(self, kinds=self.kinds - {kind})

    def only(self, kinds: frozenset[str]) -> FaultPlan:
        return replace(self, kinds=frozenset(kinds))


NO_FAULTS = FaultPlan(kinds=frozenset())


@dataclass(slots=True)
class FaultLog:
    """What was injected, by kind, and when (simulated ms), for the trace and the report."""

    counts: Counter[str] = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)

    def note(self, now_ms: int, kind: str, target: str) -> None:
        self.counts[kind] += 1
        self.trace.append(f"{now_ms} {kind} {target}")
