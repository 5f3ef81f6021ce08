"""Market data that is not public (OMS_MARKETDATA_PUBLIC=false), on real processes.

Every call, unary or stream, must then be signed as the gateway's calls are, by a key
holding the READ scope: the service reads keys through the persister, as the gateway
does, so a key the admin API creates works at once. Refusals carry the gateway's
reasons in the `x-oms-reason` trailer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gateway.client import AdminClient, GatewayCallError, MarketDataClient
from protos.oms.v1 import common_pb2, market_data_pb2
from tests.gateway.accounts import open_account
from tests.market_data.conftest import MarketMesh
from tests.market_data.market_flow import (
    BTC,
    BTC_PRICE,
    DEPOSITS,
    GROUP_OF,
    FlowOrder,
    closing,
    matcher_book,
    next_message,
    place_flow,
    settle,
    until,
)

C = common_pb2
M = market_data_pb2


@pytest.fixture(scope="module")
def market_data_environment() -> dict[str, str]:
    return {"OMS_MARKETDATA_PUBLIC": "false"}


async def first_message(stream: AsyncIterator[Any]) -> Any:
    """A stream's first message; the stream is closed after it."""
    async with closing(stream) as messages:
        return await next_message(messages)


def calls(market: MarketDataClient) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One call of each RPC (streams: their first message)."""
    return {
        "ListInstruments": market.instruments,
        "GetOrderBook": lambda: market.order_book(BTC, 5),
        "GetTicker": lambda: market.tickers([BTC]),
        "GetCandles": lambda: market.candles(BTC, M.CANDLE_INTERVAL_1M),
        "StreamOrderBook": lambda: first_message(market.book_events(BTC, 0)),
        "StreamTrades": lambda: first_message(market.trades(BTC, 0)),
    }


async def assert_every_call_refused(
    market: MarketDataClient, code: grpc.StatusCode, reason: str
) -> None:
    for name, call in calls(market).items():
        with pytest.raises(GatewayCallError) as refused:
            await call()
        assert (refused.value.code, refused.value.reason) == (
            code,
            f"GATEWAY_ERROR_REASON_{reason}",
        ), f"{name}: {refused.value}"


async def two_trades(market_mesh: MarketMesh, admin: AdminClient) -> int:
    """Two trades on BTC-USDT through the gateway; the last one's trade sequence (at least
    2, so a trade stream can resume from just before it: from 0 it only sends new ones)."""
    seller = await open_account(admin, DEPOSITS)
    buyer = await open_account(admin, DEPOSITS)
    address = market_mesh.mesh.gateway.address
    async with seller.client(address) as sell, buyer.client(address) as buy:
        placed = await place_flow(
            [sell, buy],
            [FlowOrder(0, C.SIDE_SELL, False, 0, 1), FlowOrder(1, C.SIDE_BUY, True, 0, 1)] * 2,
            symbol=BTC,
            base_price=BTC_PRICE,
            tag=f"access-{seller.user_id}",
        )
        await settle(placed)
    snapshot = await matcher_book(market_mesh.mesh.matchers[GROUP_OF[BTC]].address, BTC)
    assert snapshot.trade_sequence >= 2
    return snapshot.trade_sequence


async def book_through(market: MarketDataClient, trade_sequence: int) -> M.OrderBook:
    """GetOrderBook once the service's book has the trade with `trade_sequence`."""

    async def probe() -> M.OrderBook:
        return await market.order_book(BTC, 5)

    return await until(
        probe,
        lambda book: book.trade_sequence >= trade_sequence,
        f"the service's book through trade {trade_sequence}",
    )


async def test_unsigned_calls_are_refused_missing_credentials(market_mesh: MarketMesh) -> None:
    async with MarketDataClient(market_mesh.market_data.address) as anonymous:
        await assert_every_call_refused(
            anonymous, grpc.StatusCode.UNAUTHENTICATED, "MISSING_CREDENTIALS"
        )


async def test_a_read_key_reads_books_trades_tickers_candles_and_instruments(
    market_mesh: MarketMesh, admin: AdminClient
) -> None:
    trade_sequence = await two_trades(market_mesh, admin)
    account = await open_account(admin, {})
    hmac_key = await admin.create_api_key(account.user_id, scopes=[C.API_KEY_SCOPE_READ])
    private_key = Ed25519PrivateKey.generate()
    ed25519_key = await admin.create_api_key(
        account.user_id,
        kind=C.API_KEY_KIND_ED25519,
        public_key=private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
        scopes=[C.API_KEY_SCOPE_READ],
    )
    address = market_mesh.market_data.address
    async with (
        MarketDataClient(
            address, api_key=hmac_key.key.api_key, api_secret=hmac_key.api_secret
        ) as hmac_reader,
        MarketDataClient(
            address, api_key=ed25519_key.key.api_key, private_key=private_key
        ) as ed25519_reader,
    ):
        for market in (hmac_reader, ed25519_reader):
            instruments = await market.instruments()
            assert BTC in [instrument.symbol for instrument in instruments]
            book = await book_through(market, trade_sequence)
            (ticker,) = await market.tickers([BTC])
            assert ticker.last_price_ticks == BTC_PRICE
            candles = await market.candles(BTC, M.CANDLE_INTERVAL_1M)
            assert candles.symbol == BTC
            first = await first_message(market.book_events(BTC, 0))
            assert first.book.book_sequence == book.book_sequence
            # From just before the trade: the trade itself comes first.
            trades = await first_message(market.trades(BTC, trade_sequence - 1))
            assert [trade.trade_sequence for trade in trades.trades] == [trade_sequence]


async def test_a_key_without_read_is_refused_scope_required(
    market_mesh: MarketMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {})
    trade_only = await admin.create_api_key(account.user_id, scopes=[C.API_KEY_SCOPE_TRADE])
    async with MarketDataClient(
        market_mesh.market_data.address,
        api_key=trade_only.key.api_key,
        api_secret=trade_only.api_secret,
    ) as market:
        await assert_every_call_refused(market, grpc.StatusCode.PERMISSION_DENIED, "SCOPE_REQUIRED")


async def test_a_wrong_secret_is_refused_bad_signature(
    market_mesh: MarketMesh, admin: AdminClient
) -> None:
    account = await open_account(admin, {})
    key = await admin.create_api_key(account.user_id, scopes=[C.API_KEY_SCOPE_READ])
    async with MarketDataClient(
        market_mesh.market_data.address,
        api_key=key.key.api_key,
        api_secret=key.api_secret[::-1],
    ) as market:
        await assert_every_call_refused(market, grpc.StatusCode.UNAUTHENTICATED, "BAD_SIGNATURE")
