"""One tradable symbol: its settings, its two book sides, halt flag and last trade."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from services.matcher.core.order_book import BookSide
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.settings import SymbolSettings
from services.matcher.core.state_digest import text_digest


class LastTrade(NamedTuple):
    symbol: str
    price_ticks: int
    trade_id: int
    consensus_time_ms: int


class SymbolBook:
    __slots__ = (
        "asks",
        "bids",
        "digest",
        "halted",
        "last_price_ticks",
        "last_trade_id",
        "last_trade_time_ms",
        "settings",
        "symbol",
    )

    def __init__(self, settings: SymbolSettings) -> None:
        self.settings = settings
        self.symbol = settings.symbol
        self.digest = text_digest(settings.symbol)  # stable, for order digests
        self.bids = BookSide(is_bid=True)
        self.asks = BookSide(is_bid=False)
        self.halted = False
        self.last_price_ticks = 0  # 0 until the first trade
        self.last_trade_id = 0
        self.last_trade_time_ms = 0

    def reference_price_ticks(self) -> int:
        """The price band's reference: the last trade, else the configured reference."""
        return self.last_price_ticks or self.settings.reference_price_ticks

    def last_trade(self) -> LastTrade | None:
        if not self.last_trade_id:
            return None
        return LastTrade(
            self.symbol, self.last_price_ticks, self.last_trade_id, self.last_trade_time_ms
        )

    def resting_orders(self) -> Iterator[OrderRecord]:
        """Bids best first, then asks best first, FIFO within each level."""
        yield from self.bids.live_orders()
        yield from self.asks.live_orders()
