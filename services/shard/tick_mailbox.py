"""The conflating mailbox for market ticks (seeds/actor-model-risk-engine.txt).

Ticks may arrive far faster than risk needs them. The mailbox holds at most one
price per symbol: a newer tick replaces the older one (drop-head), so its size
is bounded by the number of symbols however fast ticks come. Once per turn the
leader drains it into a single logged MarkPrices command, which bounds risk
work per second by the cadence, not by the tick rate. Orders, cancels, fills
and hydrations never pass through here: they are never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MailboxStatistics:
    received: int
    replaced: int  # ticks dropped because a newer one for the symbol arrived
    drained_batches: int
    pending_symbols: int


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
