"""`MatcherMachine`: the matching engine as a replicated state machine of the runtime.

Logged input: `apply(bytes, context)` takes one serialized `oms.v1.MatcherCommandBatch`
and decides its commands in order at `context.consensus_time_ms`; `on_timer`
expires GTD orders and sweeps the dedup horizon. Both return a 1-tuple holding
one `MatcherEgress`.

Egress holds the engine's records, not protobuf: the runtime routes egress only
from the leader, and followers, which drop it, should not pay for building
messages. The leader's service calls `result_batch()` and `event_batches()`
(or the per-item `result_messages()` / `event_messages()`). From state-machine
version 2 on egress also holds the entry's market data (`market_feed`: per symbol
its public trades, then its book update), sent as one `MarketDataBatch`
(`market_data_batch()`). Bytes that are not a batch, or a batch over
`max_commands_per_batch`, are refused whole: an egress with no results, no events
and `refused` set, and no state change.

Queries (`order_state`, `open_orders`, `events_from`, `last_prices`, and from
version 2 on the market data's `book_snapshot`, `book_updates_from`, `trades_from`)
are plain methods, not logged; they read the state as of the last applied entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from protos.oms.v1 import matcher_pb2
from services.matcher.core import codec, versions
from services.matcher.core.codec import CommandDecodeError
from services.matcher.core.commands import CommandResult
from services.matcher.core.engine import MatcherEngine
from services.matcher.core.event_log import EventRecord
from services.matcher.core.market_feed import BookUpdate, MarketRecord, PublicTrade
from services.matcher.core.settings import EngineSettings
from services.matcher.core.snapshot_codec import restore_snapshot, write_snapshot
from services.runtime.core.state_machine import ApplyContext


@dataclass(frozen=True, slots=True)
class MatcherEgress:
    """What one log entry produced: a result per command, then the events, in order;
    from version 2 on, its market data."""

    results: tuple[CommandResult, ...]
    events: tuple[EventRecord, ...]
    refused: str | None = None  # why the entry's bytes were refused whole
    # Per symbol (in symbol order) its trades, then its book update; empty in version 1.
    market: tuple[MarketRecord, ...] = ()

    def book_updates(self) -> tuple[BookUpdate, ...]:
        return tuple(record for record in self.market if isinstance(record, BookUpdate))

    def trades(self) -> tuple[PublicTrade, ...]:
        return tuple(record for record in self.market if isinstance(record, PublicTrade))

    def market_data_batch(self) -> matcher_pb2.MarketDataBatch | None:
        """The entry's market data as one message; None when it published none."""
        return codec.market_data_batch_message(self.market) if self.market else None

    def result_messages(self) -> list[matcher_pb2.MatcherCommandResult]:
        return [codec.result_message(result) for result in self.results]

    def result_batch(self) -> matcher_pb2.MatcherResultBatch:
        return codec.result_batch_message(self.results)

    def exception_results(self) -> tuple[CommandResult, ...]:
        """The results a caller asking for exceptions only gets: duplicates and cancels
        of unknown ids."""
        return tuple(result for result in self.results if result[1] or result[4])

    def event_messages(self) -> list[matcher_pb2.MatcherEvent]:
        return [codec.event_message(event) for event in self.events]

    def event_batches(self) -> dict[str, matcher_pb2.MatcherEventBatch]:
        """The events per owning OMS shard, each batch in sequence order."""
        by_shard: dict[str, list[EventRecord]] = {}
        for event in self.events:
            oms_shard = event.spec.oms_shard
            shard_events = by_shard.get(oms_shard)
            if shard_events is None:
                by_shard[oms_shard] = [event]
            else:
                shard_events.append(event)
        return {
            oms_shard: codec.event_batch_message(shard_events)
            for oms_shard, shard_events in by_shard.items()
        }


@dataclass(frozen=True, slots=True)
class MatcherStatistics:
    resting_orders: int
    known_order_ids: int  # live and finished within the dedup horizon
    pending_expiries: int
    oms_shards: int
    retained_events: int
    last_trade_id: int
    refused_entries: int  # since this process started


class MatcherMachine:
    """Implements `services.runtime.core.state_machine.StateMachine[MatcherEgress]`."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.engine = MatcherEngine(settings)
        self.refused_entries = 0

    def apply(self, command: bytes, context: ApplyContext) -> tuple[MatcherEgress]:
        try:
            commands = codec.decode_command_batch(command, self.settings.max_commands_per_batch)
        except CommandDecodeError as error:
            self.refused_entries += 1
            return (MatcherEgress((), (), refused=str(error)),)
        engine = self.engine
        if engine.feed is None:
            results, events = engine.execute(commands, context.consensus_time_ms)
            return (MatcherEgress(tuple(results), tuple(events)),)
        market: list[MarketRecord] = []
        results, events = engine.execute(commands, context.consensus_time_ms, market)
        return (MatcherEgress(tuple(results), tuple(events), None, tuple(market)),)

    def on_timer(self, context: ApplyContext) -> tuple[MatcherEgress, ...]:
        market: list[MarketRecord] = []
        events = self.engine.on_timer(context.consensus_time_ms, market)
        # Nothing at all when nothing expired: the sequencer spaces idle timers wider.
        if not events and not market:
            return ()
        return (MatcherEgress((), tuple(events), None, tuple(market)),)

    # --- versions (services/runtime/core/state_machine.py) ----------------------------

    @property
    def version(self) -> int:
        return self.engine.machine_version

    @property
    def implemented_versions(self) -> frozenset[int]:
        return versions.IMPLEMENTED_VERSIONS

    def activate_version(self, version: int) -> None:
        self.engine.activate_version(version)

    def snapshot(self) -> bytes:
        return write_snapshot(self.engine)

    def restore(self, data: bytes) -> None:
        restore_snapshot(self.engine, data)

    def state_hash(self) -> bytes:
        return self.engine.state_hash()

    # --- queries (not logged) ---------------------------------------------------------

    def order_state(self, order_id: str) -> matcher_pb2.OrderState | None:
        view = self.engine.order_view(order_id)
        return None if view is None else codec.order_state_message(view)

    def open_orders(self, oms_shard: str, user_id: int) -> matcher_pb2.OpenOrdersSnapshot:
        as_of, views = self.engine.open_orders(oms_shard, user_id)
        return codec.open_orders_message(as_of, views)

    def events_from(
        self, oms_shard: str, from_sequence: int, limit: int | None = None
    ) -> list[matcher_pb2.MatcherEvent]:
        """Retained events from `from_sequence` on; `SequenceTooOldError` if it is gone."""
        return [
            codec.event_message(event)
            for event in self.engine.events_from(oms_shard, from_sequence, limit)
        ]

    def book_snapshot(self, symbol: str, depth: int = 0) -> matcher_pb2.BookSnapshot:
        """A symbol's book, `depth` levels per side (0: all); `UnknownSymbolError`,
        `MarketFeedInactiveError` before version 2."""
        return codec.book_snapshot_message(symbol, self.engine.book_snapshot(symbol, depth))

    def book_updates_from(
        self, symbol: str, from_sequence: int, limit: int | None = None
    ) -> list[matcher_pb2.BookUpdate]:
        """Retained book updates from `from_sequence` on; `MarketSequenceTooOldError` if
        it is gone."""
        return [
            codec.book_update_message(update)
            for update in self.engine.book_updates_from(symbol, from_sequence, limit)
        ]

    def trades_from(
        self, symbol: str, from_sequence: int, limit: int | None = None
    ) -> list[matcher_pb2.PublicTrade]:
        """Retained public trades from `from_sequence` on; `MarketSequenceTooOldError` if
        it is gone."""
        return [
            codec.public_trade_message(trade)
            for trade in self.engine.trades_from(symbol, from_sequence, limit)
        ]

    def last_prices(self) -> list[matcher_pb2.LastPrice]:
        return [codec.last_price_message(trade) for trade in self.engine.last_trades()]

    def statistics(self) -> MatcherStatistics:
        engine = self.engine
        return MatcherStatistics(
            resting_orders=len(engine.dedup.orders) - len(engine.dedup.finished),
            known_order_ids=len(engine.dedup.orders),
            pending_expiries=len(engine.expiries),
            oms_shards=len(engine.streams),
            retained_events=sum(len(stream.retained) for stream in engine.streams.values()),
            last_trade_id=engine.last_trade_id,
            refused_entries=self.refused_entries,
        )
