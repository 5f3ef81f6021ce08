"""Shape and range checks of client input, each failure with its specific reason.

The gateway refuses what no account state could make valid (unknown symbol,
inconsistent type/side/time in force, a number out of range, a malformed id)
before anything reaches the shard, naming the field in the detail. What depends
on the account or the book (funds, tick and lot rules, risk, price band) is the
shard's and the matcher's business: it comes back as a refused OrderAck.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.refusals import GatewayError, invalid_field, out_of_range
from protos.oms.v1 import common_pb2, gateway_pb2, matcher_pb2, shard_pb2
from services.markets.catalog import INT64_MAX, Market, MarketCatalog

MAX_CLIENT_ORDER_ID = 64
MAX_ORDER_ID = 128
MAX_TRANSFER_ID = 64
MAX_NOTE_CHARS = 256
MAX_REQUEST_ID_CHARS = 64
PPM = 1_000_000
MAX_EXPIRY_AHEAD_MS = 366 * 24 * 3600 * 1000  # GTD at most about a year ahead

LIMIT_TIME_IN_FORCE = frozenset(
    {
        common_pb2.TIME_IN_FORCE_UNSPECIFIED,
        common_pb2.TIME_IN_FORCE_GTC,
        common_pb2.TIME_IN_FORCE_IOC,
        common_pb2.TIME_IN_FORCE_FOK,
        common_pb2.TIME_IN_FORCE_POST_ONLY,
        common_pb2.TIME_IN_FORCE_GTD,
    }
)
MARKET_TIME_IN_FORCE = frozenset(
    {common_pb2.TIME_IN_FORCE_UNSPECIFIED, common_pb2.TIME_IN_FORCE_IOC}
)
SIDES = frozenset({common_pb2.SIDE_BUY, common_pb2.SIDE_SELL})
SELF_TRADE_PREVENTIONS = frozenset(matcher_pb2.SelfTradePrevention.values())
TIERS = frozenset(shard_pb2.UserTier.values())


def printable_ascii(value: str) -> bool:
    return all(" " <= character <= "~" for character in value)


def check_identifier(field: str, value: str, longest: int) -> None:
    if not value:
        raise invalid_field(field, "required")
    if len(value) > longest:
        raise invalid_field(field, f"at most {longest} characters")
    if not printable_ascii(value):
        raise invalid_field(field, "printable ASCII only")


class RequestValidator:
    def __init__(self, catalog: MarketCatalog, wall_clock_ms: Callable[[], int]) -> None:
        self.markets = catalog.by_symbol()
        self.assets = frozenset(catalog.assets())
        self.wall_clock_ms = wall_clock_ms

    # --- orders ---------------------------------------------------------------------------

    def place(self, request: gateway_pb2.PlaceOrderRequest) -> None:
        check_identifier("client_order_id", request.client_order_id, MAX_CLIENT_ORDER_ID)
        market = self.market(request.symbol)
        if request.side not in SIDES:
            raise invalid_field("side", "BUY or SELL")
        if request.self_trade_prevention not in SELF_TRADE_PREVENTIONS:
            raise invalid_field("self_trade_prevention", "not a known mode")
        if request.order_type == common_pb2.ORDER_TYPE_LIMIT:
            self._limit(request, market)
        elif request.order_type == common_pb2.ORDER_TYPE_MARKET:
            self._market(request, market)
        else:
            raise invalid_field("order_type", "LIMIT or MARKET")

    def _limit(self, request: gateway_pb2.PlaceOrderRequest, market: Market) -> None:
        if request.time_in_force not in LIMIT_TIME_IN_FORCE:
            raise invalid_field("time_in_force", "not a known time in force")
        if request.quote_amount:
            raise invalid_field("quote_amount", "only market buys are sized by quote amount")
        if request.price_ticks <= 0:
            raise out_of_range("price_ticks", "must be > 0")
        if request.quantity_lots <= 0:
            raise out_of_range("quantity_lots", "must be > 0")
        if request.quantity_lots > INT64_MAX // market.lot_size:
            raise out_of_range("quantity_lots", "base amount exceeds int64")
        notional = request.price_ticks * request.quantity_lots * market.tick_size
        highest_fee = max(market.maker_fee_ppm, market.taker_fee_ppm)
        if notional + notional * highest_fee // PPM > INT64_MAX:
            raise out_of_range("price_ticks", "price * quantity (with fee) exceeds int64")
        if request.time_in_force == common_pb2.TIME_IN_FORCE_GTD:
            if not request.expire_at_ms:
                raise invalid_field("expire_at_ms", "a GTD order needs expire_at_ms")
            now_ms = self.wall_clock_ms()
            if request.expire_at_ms <= now_ms:
                raise out_of_range("expire_at_ms", "already passed")
            if request.expire_at_ms > now_ms + MAX_EXPIRY_AHEAD_MS:
                raise out_of_range("expire_at_ms", "more than a year ahead")
        elif request.expire_at_ms:
            raise invalid_field("expire_at_ms", "only GTD orders expire")

    def _market(self, request: gateway_pb2.PlaceOrderRequest, market: Market) -> None:
        if request.time_in_force not in MARKET_TIME_IN_FORCE:
            raise invalid_field("time_in_force", "a market order is IOC")
        if request.expire_at_ms:
            raise invalid_field("expire_at_ms", "only GTD orders expire")
        if request.price_ticks:
            raise invalid_field("price_ticks", "a market order has no price")
        if request.side == common_pb2.SIDE_BUY:
            if request.quantity_lots:
                raise invalid_field("quantity_lots", "a market buy is sized by quote_amount")
            if request.quote_amount <= 0:
                raise out_of_range("quote_amount", "must be > 0")
            return
        if request.quote_amount:
            raise invalid_field("quote_amount", "a market sell is sized by quantity_lots")
        if request.quantity_lots <= 0:
            raise out_of_range("quantity_lots", "must be > 0")
        if request.quantity_lots > INT64_MAX // market.lot_size:
            raise out_of_range("quantity_lots", "base amount exceeds int64")

    def order_reference(self, order_id: str, client_order_id: str) -> None:
        """Cancel and GetOrder name one order: by its order id or by the client's id."""
        if order_id and client_order_id:
            raise invalid_field("order_id", "give order_id or client_order_id, not both")
        if order_id:
            check_identifier("order_id", order_id, MAX_ORDER_ID)
        else:
            check_identifier("client_order_id", client_order_id, MAX_CLIENT_ORDER_ID)

    def symbol_filter(self, symbol: str) -> None:
        if symbol:
            self.market(symbol)

    def market(self, symbol: str) -> Market:
        market = self.markets.get(symbol)
        if market is None:
            raise GatewayError(
                gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL,
                f"symbol: {symbol[:32]!r} is not traded here",
            )
        return market

    # --- admin ----------------------------------------------------------------------------

    def transfer(self, request: gateway_pb2.TransferRequest) -> None:
        check_user_id(request.user_id)
        if request.asset not in self.assets:
            raise GatewayError(
                gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_ASSET,
                f"asset: {request.asset[:32]!r} is not held here",
            )
        if request.amount <= 0:
            raise out_of_range("amount", "must be > 0")
        check_identifier("transfer_id", request.transfer_id, MAX_TRANSFER_ID)

    def new_user(self, request: gateway_pb2.CreateUserRequest) -> None:
        if request.user_id > INT64_MAX:
            raise out_of_range("user_id", "exceeds int64")
        if request.tier not in TIERS:
            raise invalid_field("tier", "not a known tier")
        check_risk_limits(request.risk_limits)


def check_risk_limits(limits: shard_pb2.RiskLimits) -> None:
    for field, value in (
        ("max_order_notional", limits.max_order_notional),
        ("max_position_lots", limits.max_position_lots),
        ("max_open_orders", limits.max_open_orders),
        ("price_band_bps", limits.price_band_bps),
        ("max_drawdown", limits.max_drawdown),
    ):
        if value < 0:
            raise out_of_range(f"risk_limits.{field}", "must be >= 0 (0: no limit)")


def check_note(note: str) -> None:
    """An operator's note: free text, but bounded (it is logged and audited)."""
    if len(note) > MAX_NOTE_CHARS:
        raise out_of_range("note", f"at most {MAX_NOTE_CHARS} characters")
    if not note.isprintable():
        # No control characters: PostgreSQL text refuses NUL, and the audit row must land.
        raise invalid_field("note", "printable characters only")


def check_request_id(request_id: str) -> None:
    """An admin request's id (empty: the gateway makes one): logged with the command."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise out_of_range("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters")
    if not request_id.isprintable():
        raise invalid_field("request_id", "printable characters only")


def check_user_id(user_id: int) -> None:
    if user_id == 0:
        raise invalid_field("user_id", "required")
    if user_id > INT64_MAX:
        raise out_of_range("user_id", "exceeds int64")
