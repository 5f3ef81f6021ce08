"""Counters the shard keeps and the frozen record the service exports as metrics.

The apply loop only increments plain integers; the service reads
`ShardMachine.statistics()` on its own schedule, so no metrics library is
called from inside the state machine. Counters are part of the snapshot but
not of the state hash: they decide nothing, and leaving them out is what makes
"a refused command changes nothing" exactly checkable on the hash.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER_NAMES = (
    "commands_applied",
    "malformed_commands",
    "orders_accepted",
    "orders_refused",
    "cancels_accepted",
    "refused_rate_limited",
    "refused_backpressure",
    "transfers_applied",
    "transfers_duplicate",
    "evictions_started",
    "evictions_completed",
    "evictions_cancelled",
    "valve_evictions",
    "flushes_stale",
    "flushes_refused",
    "hydrations_requested",
    "hydrations_redriven",
    "hydrations_completed",
    "hydrations_unknown",
    "hydrations_stale",
    "hydrations_redundant",
    "hydrations_malformed",
    "commands_parked",
    "dedup_never_seen",
    "dedup_exact_hits",
    "dedup_past_horizon",
    "dedup_lookups_sent",
    "dedup_lookups_redriven",
    "dedup_answers_seen",
    "dedup_answers_not_seen",
    "dedup_answers_stale",
    "dedup_rotations",
    "matcher_events_applied",
    "matcher_events_duplicate",
    "matcher_sequence_gaps",
    "matcher_events_foreign",
    "matcher_events_parked",
    "orphan_events",
    "orphan_fills_settled",
    "fills_settled",
    "reconciles_applied",
    "reconciles_deferred",
    "reconciles_dropped",
    "reconciles_stale",
    "reconcile_phantoms_closed",
    "reconcile_reservations_released",
    "reconcile_acceptances_healed",
    "reconcile_impossible_states",
    "supervision_failures",
    "supervision_quarantines",
    "supervision_halts",
    "risk_alerts",
    "sweeps",
    "sweep_visits_total",
    "routing_epochs",
    "routing_documents_stale",
    "routing_documents_refused",
    "refused_not_owner",
    "leaving_evictions",
    "hydrations_not_owned",
    "operator_commands",
    "operator_commands_refused",
    "operator_restarts",
    "refused_trading_halted",
    "refused_mailbox_full",
)


class ShardCounters:
    """Monotonic counters, incremented in place on the apply loop."""

    __slots__ = COUNTER_NAMES

    commands_applied: int
    malformed_commands: int
    orders_accepted: int
    orders_refused: int
    cancels_accepted: int
    refused_rate_limited: int
    refused_backpressure: int
    transfers_applied: int
    transfers_duplicate: int
    evictions_started: int
    evictions_completed: int
    evictions_cancelled: int
    valve_evictions: int
    flushes_stale: int
    flushes_refused: int
    hydrations_requested: int
    hydrations_redriven: int
    hydrations_completed: int
    hydrations_unknown: int
    hydrations_stale: int
    hydrations_redundant: int
    hydrations_malformed: int
    commands_parked: int
    dedup_never_seen: int
    dedup_exact_hits: int
    dedup_past_horizon: int
    dedup_lookups_sent: int
    dedup_lookups_redriven: int
    dedup_answers_seen: int
    dedup_answers_not_seen: int
    dedup_answers_stale: int
    dedup_rotations: int
    matcher_events_applied: int
    matcher_events_duplicate: int
    matcher_sequence_gaps: int
    matcher_events_foreign: int
    matcher_events_parked: int
    orphan_events: int
    orphan_fills_settled: int
    fills_settled: int
    reconciles_applied: int
    reconciles_deferred: int
    reconciles_dropped: int
    reconciles_stale: int
    reconcile_phantoms_closed: int
    reconcile_reservations_released: int
    reconcile_acceptances_healed: int
    reconcile_impossible_states: int
    supervision_failures: int
    supervision_quarantines: int
    supervision_halts: int
    risk_alerts: int
    sweeps: int
    sweep_visits_total: int
    routing_epochs: int
    routing_documents_stale: int
    routing_documents_refused: int
    refused_not_owner: int
    leaving_evictions: int
    hydrations_not_owned: int
    operator_commands: int
    operator_commands_refused: int
    operator_restarts: int
    refused_trading_halted: int
    refused_mailbox_full: int

    def __init__(self) -> None:
        for name in COUNTER_NAMES:
            setattr(self, name, 0)

    def plain(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTER_NAMES)

    def restore_plain(self, values: tuple[int, ...]) -> None:
        # An older snapshot has fewer counters (new ones are appended): they start at 0.
        if len(values) > len(COUNTER_NAMES):
            raise ValueError("counter snapshot does not match this version")
        for name in COUNTER_NAMES:
            setattr(self, name, 0)
        for name, value in zip(COUNTER_NAMES, values, strict=False):
            setattr(self, name, int(value))


@dataclass(frozen=True, slots=True)
class SweepStatistics:
    """The last eviction sweep: `visited == expired + 1` unless the cap or the end stopped it."""

    at_ms: int = 0
    visited: int = 0
    expired: int = 0
    evicted: int = 0
    requeued: int = 0


@dataclass(frozen=True, slots=True)
class ShardStatistics:
    resident_users: int
    dehydrating_users: int
    hydrating_users: int
    parked_commands: int
    dedup_waiting_users: int
    in_flight_submits: int
    in_flight_cancels: int
    deferred_reconciles: int
    quarantined_users: int
    halted_users: int
    last_sweep: SweepStatistics
    counters: tuple[tuple[str, int], ...]
    routing_epoch: int = 0  # the newest routing document applied (0: none yet)
    leaving_users: int = 0  # resident users the document gives to another shard
    persisted_through: int = 0  # the persister's cursor as this log last heard it
    armed_switches: int = 0  # users with a dead man's switch armed (CancelAllAfter)

    def counter(self, name: str) -> int:
        for key, value in self.counters:
            if key == name:
                return value
        raise KeyError(name)
