"""The conflating mailbox for market ticks (seeds/actor-model-risk-engine.txt).

Ticks may arrive far faster than risk needs them. The mailbox holds at most one
price per symbol: a newer tick replaces the older one (drop-head), so its size
is bounded by the number of symbols however fast ticks come. Once per turn the
leader drains it into a single logged MarkPrices command, which bounds risk
work per second by the cadence, not by the tick rate. Orders, cancels, fills
and hydrations never pass through here: they are never dropped.

Orders are served ahead of ticks (`MarkCadence`): while the shard's ingress queue
is more than half full, the drained marks wait (and keep conflating) so the log
takes the queued orders first; never for more than `max_deferrals` turns, because
drawdown checks need prices most when the market is busiest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MailboxStatistics:
    received: int
    replaced: int  # ticks dropped because a newer one for the symbol arrived
    drained_batches: int
    pending_symbols: int


class MarkCadence:
    """Whether this turn's marks go to the log now, or wait behind queued orders."""

    def __init__(self, busy_fraction: float = 0.5, max_deferrals: int = 10) -> None:
        self.busy_fraction = busy_fraction
        self.max_deferrals = max_deferrals
        self._deferred_turns = 0
        self.deferrals = 0  # turns the marks waited, in all

    def due(self, ingress_fill_fraction: float) -> bool:
        if ingress_fill_fraction > self.busy_fraction and self._deferred_turns < self.max_deferrals:
            self._deferred_turns += 1
            self.deferrals += 1
            return False
        self._deferred_turns = 0
        return True


class TickMailbox:
    def __init__(self, max_symbols: int = 10_000) -> None:
        self.max_symbols = max_symbols
        self._latest: dict[str, int] = {}
        self._received = 0
        self._replaced = 0
        self._drained = 0
        self.refused_symbols = 0

    def offer(self, symbol: str, price_ticks: int) -> bool:
        """Keep the newest price of `symbol`; False if a new symbol would pass the bound."""
        self._received += 1
        if symbol in self._latest:
            self._replaced += 1
        elif len(self._latest) >= self.max_symbols:
            self.refused_symbols += 1
            return False
        self._latest[symbol] = price_ticks
        return True

    def __len__(self) -> int:
        return len(self._latest)

    def drain(self) -> list[tuple[str, int]]:
        """Everything pending, oldest symbol first; the mailbox is empty afterwards."""
        if not self._latest:
            return []
        drained = list(self._latest.items())
        self._latest = {}
        self._drained += 1
        return drained

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(self._received, self._replaced, self._drained, len(self._latest))
