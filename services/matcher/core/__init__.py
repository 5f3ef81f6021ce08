"""The matcher's pure core: books, matching, dedup, events, snapshots. No I/O, clock or RNG.

Public surface:
- `MatcherMachine(EngineSettings)`: the runtime's `StateMachine[MatcherEgress]`.
  `apply(batch_bytes, context)` and `on_timer(context)` return `(MatcherEgress,)`;
  `snapshot()`, `restore(bytes)`, `state_hash()`; queries `order_state(order_id)`,
  `open_orders(oms_shard, user_id)`, `events_from(oms_shard, from_sequence, limit)`
  (raises `SequenceTooOldError`), `last_prices()`, `statistics()`; from state-machine
  version 2 on, the market data: `book_snapshot(symbol, depth)`,
  `book_updates_from(symbol, from_sequence, limit)`, `trades_from(...)` (raise
  `UnknownSymbolError`, `MarketSequenceTooOldError`, `MarketFeedInactiveError`).
- `MatcherEgress(results, events, refused, market)`: engine records, turned into
  `oms.v1` messages on demand (`result_batch()`, `event_batches()`,
  `market_data_batch()`, ...).
- `MatcherEngine`: the decider behind the machine, driven with decoded `commands`
  records (`execute(commands, now_ms)`, `on_timer(now_ms)`).

Reading order: `orders` (an order and its lifecycle table), `order_book` (price
levels), `engine` (how commands and timers are decided; its docstring states the
matching rules), `validation`, `money`, `event_log` (sequenced events per OMS
shard), `market_feed` (per-symbol book updates and public trades, version 2),
`dedup`, `expiry`, `state_digest`, `codec` (protobuf at the edge),
`snapshot_codec`, and `machine`.
"""

from services.matcher.core.engine import MatcherEngine
from services.matcher.core.errors import (
    MarketFeedInactiveError,
    MarketSequenceTooOldError,
    MatcherError,
    MatcherInvariantError,
    SequenceTooOldError,
    SettingsError,
    SnapshotFormatError,
    UnknownSymbolError,
)
from services.matcher.core.machine import MatcherEgress, MatcherMachine, MatcherStatistics
from services.matcher.core.settings import EngineSettings, SymbolSettings

__all__ = [
    "EngineSettings",
    "MarketFeedInactiveError",
    "MarketSequenceTooOldError",
    "MatcherEgress",
    "MatcherEngine",
    "MatcherError",
    "MatcherInvariantError",
    "MatcherMachine",
    "MatcherStatistics",
    "SequenceTooOldError",
    "SettingsError",
    "SnapshotFormatError",
    "SymbolSettings",
    "UnknownSymbolError",
]
