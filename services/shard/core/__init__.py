"""The user shard's pure core: hot user actors as one deterministic state machine.

No I/O, clock or randomness: consensus time from the log is the only clock
(tests/test_pure_cores.py and the import contract keep it so).

Reading order: `vocabulary` (codes), `settings`, `commands` and `egress` (what
goes in and out), `actor` (one user's state and lifecycle), `orders` (the order
lifecycle table), `reservations`, `positions`, `risk`, `rate_limit`, `dedup`,
`accounts` (conservation), `shard_state` (where it all lives), then the engines:
`saga` (admit and cancel), `settlement` (matcher events), `balances` (funding),
`hydration`, `eviction`, `reconcile`, `supervision`; finally `shard_machine`
(the runtime's state machine), `codec` (protobuf), `snapshot` and `digest`.
"""

from services.shard.core.errors import (
    ConservationError,
    MalformedCommandError,
    NegativeBalanceError,
    OrderIndexError,
    OrderTransitionError,
    ReservationError,
    ShardError,
    ShardInvariantError,
    ShardSettingsError,
    SnapshotFormatError,
)
from services.shard.core.settings import (
    InjectedFaultSpec,
    RateLimitSettings,
    ShardSettings,
    SymbolSettings,
)
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.statistics import ShardStatistics, SweepStatistics

__all__ = [
    "ConservationError",
    "InjectedFaultSpec",
    "MalformedCommandError",
    "NegativeBalanceError",
    "OrderIndexError",
    "OrderTransitionError",
    "RateLimitSettings",
    "ReservationError",
    "ShardError",
    "ShardInvariantError",
    "ShardMachine",
    "ShardSettings",
    "ShardSettingsError",
    "ShardStatistics",
    "SnapshotFormatError",
    "SweepStatistics",
    "SymbolSettings",
]
