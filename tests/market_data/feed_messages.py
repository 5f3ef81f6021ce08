"""The matcher's market-data messages (`matcher_pb2`) as the tests write them: levels as
(price_ticks, total_lots, order_count) rows, status TRADING unless said."""

from __future__ import annotations

from collections.abc import Iterable

from protos.oms.v1 import common_pb2, matcher_pb2

Row = tuple[int, int, int]  # (price_ticks, total_lots, order_count)
TRADING = matcher_pb2.BOOK_STATUS_TRADING
HALTED = matcher_pb2.BOOK_STATUS_HALTED


def levels(rows: Iterable[Row]) -> list[matcher_pb2.BookLevel]:
    return [
        matcher_pb2.BookLevel(price_ticks=price, total_lots=lots, order_count=count)
        for price, lots, count in rows
    ]


def snapshot(
    symbol: str,
    book_sequence: int,
    bids: Iterable[Row] = (),
    asks: Iterable[Row] = (),
    *,
    status: matcher_pb2.BookStatus.ValueType = TRADING,
    trade_sequence: int = 0,
    last_trade_id: int = 0,
    last_price_ticks: int = 0,
    consensus_time_ms: int = 0,
) -> matcher_pb2.BookSnapshot:
    return matcher_pb2.BookSnapshot(
        symbol=symbol,
        book_sequence=book_sequence,
        trade_sequence=trade_sequence,
        status=status,
        bids=levels(bids),
        asks=levels(asks),
        last_trade_id=last_trade_id,
        consensus_time_ms=consensus_time_ms,
        last_price_ticks=last_price_ticks,
    )


def update(
    symbol: str,
    book_sequence: int,
    bids: Iterable[Row] = (),
    asks: Iterable[Row] = (),
    *,
    status: matcher_pb2.BookStatus.ValueType = TRADING,
    consensus_time_ms: int = 0,
) -> matcher_pb2.BookUpdate:
    return matcher_pb2.BookUpdate(
        symbol=symbol,
        book_sequence=book_sequence,
        consensus_time_ms=consensus_time_ms or 1_000 * book_sequence,
        status=status,
        bids=levels(bids),
        asks=levels(asks),
    )


def trade(
    symbol: str,
    trade_sequence: int,
    *,
    trade_id: int = 0,
    price_ticks: int = 100,
    quantity_lots: int = 1,
    consensus_time_ms: int = 0,
    taker_side: common_pb2.Side.ValueType = common_pb2.SIDE_BUY,
) -> matcher_pb2.PublicTrade:
    return matcher_pb2.PublicTrade(
        symbol=symbol,
        trade_sequence=trade_sequence,
        trade_id=trade_id or 1_000 + trade_sequence,
        price_ticks=price_ticks,
        quantity_lots=quantity_lots,
        taker_side=taker_side,
        consensus_time_ms=consensus_time_ms or 1_000 * trade_sequence,
    )
