"""A user's order and fill history: PostgreSQL through the persister, in cursor pages.

Each page is read as of the shard's position at the call (the persister waits
until it has written everything before it), so a client that saw an order or a
fill on its stream finds it in the history. Pages run oldest first; the cursor
is opaque to clients: the last row's keys, plus a digest of the filters it was
made under, so a cursor passed back with other filters is refused instead of
silently skipping rows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from gateway.core.refusals import GatewayError, invalid_field, out_of_range
from gateway.core.validation import RequestValidator
from gateway.persister_client import PersisterClient
from gateway.routing import ShardRouter
from protos.oms.v1 import common_pb2, gateway_pb2, persister_pb2
from services.markets.catalog import Market

DEFAULT_PAGE = 100
MAX_PAGE = 1_000
CURSOR_VERSION = "h1"
ORDER_STATUSES = frozenset(common_pb2.OrderStatus.values()) - {0}


def _filter_digest(*parts: object) -> str:
    # repr of ints and strings is the same in every process (no hash seed involved).
    return hashlib.blake2b(repr(parts).encode(), digest_size=6).hexdigest()


def encode_cursor(digest: str, time_ms: int, sequence: int, order_id: str) -> str:
    """The keys of a page's last row: its time, then a sequence (an order's user_seq, a
    fill's trade id) and the fill's order id."""
    text = f"{CURSOR_VERSION}.{digest}.{time_ms}.{sequence}.{order_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, digest: str) -> tuple[int, int, str]:
    """(time_ms, sequence, order_id) after which the next page starts."""
    if not cursor:
        return 0, 0, ""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, made_under, time_ms, trade_id, order_id = text.split(".", 4)
        keys = int(time_ms), int(trade_id), order_id
    except (binascii.Error, UnicodeDecodeError, ValueError) as error:
        raise invalid_field("cursor", "not a cursor this API issued") from error
    if version != CURSOR_VERSION or keys[0] < 0 or keys[1] < 0:
        raise invalid_field("cursor", "not a cursor this API issued")
    if made_under != digest:
        raise invalid_field("cursor", "issued for other filters: pass the same filters back")
    return keys


def _page_size(limit: int) -> int:
    if limit > MAX_PAGE:
        raise out_of_range("limit", f"at most {MAX_PAGE}")
    return limit or DEFAULT_PAGE


def _time_range(from_ms: int, to_ms: int) -> None:
    if to_ms and to_ms <= from_ms:
        raise invalid_field("to_ms", "must be after from_ms (or 0: no bound)")


class HistoryQueries:
    def __init__(
        self,
        router: ShardRouter,
        validator: RequestValidator,
        markets: dict[str, Market],
    ) -> None:
        self.router = router
        self.validator = validator
        self.markets = markets

    async def _as_of(self, user_id: int) -> tuple[PersisterClient, int]:
        """The user's shard's persister, and that shard's applied position now: the page
        is exact as of it (a position means something only to its own shard's persister)."""
        cluster = await self.router.cluster(user_id)
        view = await cluster.shard.actor(user_id, orders_only=True)
        return cluster.persister, int(view.as_of_position)

    async def orders(self, request: gateway_pb2.ListOrdersRequest) -> gateway_pb2.OrderHistory:
        self.validator.symbol_filter(request.symbol)
        limit = _page_size(request.limit)
        _time_range(request.from_ms, request.to_ms)
        statuses = sorted(set(request.statuses))
        if any(status not in ORDER_STATUSES for status in statuses):
            raise invalid_field("statuses", "an OrderStatus other than UNSPECIFIED")
        digest = _filter_digest(
            "orders", request.user_id, request.symbol, statuses, request.from_ms, request.to_ms
        )
        after_ms, after_seq, _ = decode_cursor(request.cursor, digest)
        persister, as_of = await self._as_of(request.user_id)
        query = persister_pb2.OrderPageQuery(
            user_id=request.user_id,
            symbol=request.symbol,
            statuses=statuses,
            from_ms=request.from_ms,
            to_ms=request.to_ms,
            limit=limit,
            after_accepted_at_ms=after_ms,
            after_user_seq=after_seq,
            as_of_position=as_of,
        )
        page = await persister.order_page(query)
        history = gateway_pb2.OrderHistory()
        for stored in page.orders:
            history.orders.append(stored_order_view(stored))
        if page.more and page.orders:
            last = page.orders[-1]
            history.next_cursor = encode_cursor(digest, last.accepted_at_ms, last.user_seq, "")
        return history

    async def fills(self, request: gateway_pb2.ListFillsRequest) -> gateway_pb2.FillHistory:
        self.validator.symbol_filter(request.symbol)
        limit = _page_size(request.limit)
        _time_range(request.from_ms, request.to_ms)
        digest = _filter_digest(
            "fills", request.user_id, request.symbol, request.from_ms, request.to_ms
        )
        after_ms, after_trade_id, after_order_id = decode_cursor(request.cursor, digest)
        persister, as_of = await self._as_of(request.user_id)
        query = persister_pb2.FillPageQuery(
            user_id=request.user_id,
            symbol=request.symbol,
            from_ms=request.from_ms,
            to_ms=request.to_ms,
            limit=limit,
            after_time_ms=after_ms,
            after_order_id=after_order_id,
            after_trade_id=after_trade_id,
            as_of_position=as_of,
        )
        page = await persister.fill_page(query)
        history = gateway_pb2.FillHistory()
        for stored in page.fills:
            history.fills.append(self._fill_view(stored))
        if page.more and page.fills:
            last = page.fills[-1]
            history.next_cursor = encode_cursor(digest, last.time_ms, last.trade_id, last.order_id)
        return history

    def _fill_view(self, fill: persister_pb2.StoredFill) -> gateway_pb2.FillView:
        view = gateway_pb2.FillView(
            order_id=fill.order_id,
            client_order_id=fill.client_order_id,
            trade_id=fill.trade_id,
            symbol=fill.symbol,
            side=fill.side,
            price_ticks=fill.price_ticks,
            quantity_lots=fill.quantity_lots,
            maker=fill.maker,
            fee=fill.fee,
            time_ms=fill.time_ms,
        )
        market = self.markets.get(fill.symbol)
        if market is None:
            raise GatewayError(
                gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL,
                f"a fill of {fill.symbol}, which the market catalog no longer lists",
            )
        # The shard's settlement arithmetic (services/shard/core/settlement.py).
        view.base_asset = market.base_asset
        view.base_amount = fill.quantity_lots * market.lot_size
        view.quote_asset = market.quote_asset
        view.quote_amount = fill.price_ticks * fill.quantity_lots * market.tick_size
        return view


def stored_order_view(order: persister_pb2.StoredOrder) -> gateway_pb2.OrderView:
    return gateway_pb2.OrderView(
        order_id=order.order_id,
        client_order_id=order.client_order_id,
        symbol=order.symbol,
        side=order.side,
        order_type=order.order_type,
        price_ticks=order.price_ticks,
        quantity_lots=order.quantity_lots,
        filled_lots=order.filled_lots,
        remaining_lots=order.remaining_lots,
        status=order.status,
        time_in_force=order.time_in_force,
        quote_amount=order.quote_amount,
        accepted_at_ms=order.accepted_at_ms,
        updated_at_ms=order.updated_at_ms,
    )
