"""An independent, deliberately simple matcher: the oracle of the differential tests.

Written from the rules (the proto contract, `services/matcher/core/engine.py`'s
docstring and the validation order), not from the engine's code: one flat list of
orders, linear scans, sorting on every use, and a brute-force search for what a
market buy can afford. It consumes the protobuf commands directly (not the core's
decoder) and produces the same tuples `support` reads from the machine's output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protos.oms.v1 import matcher_pb2
from services.matcher.core import SymbolSettings
from tests.matcher.support import (
    BUY,
    CANCELLED,
    EXPIRED,
    FILLED,
    FOK,
    GTD,
    IOC,
    LIMIT,
    MARKET,
    OPEN,
    PARTIALLY_FILLED,
    POST_ONLY,
    REJECTED,
    SELL,
    OrderFields,
    Row,
    order_fields,
)

R = matcher_pb2  # reject and cancel reasons live here
ORDER_ID = re.compile(r"^([A-Za-z0-9._-]+):([0-9]+):([0-9]+)$")


@dataclass
class RefOrder:
    fields: OrderFields
    shard: str
    status: int
    remaining: int
    filled: int = 0
    notional: int = 0
    fees: int = 0
    spent: int = 0
    end: int = -1
    arrival: int = 0
    reason: int = 0

    @property
    def order_id(self) -> str:
        return self.fields[0]

    @property
    def user(self) -> int:
        return self.fields[1]

    @property
    def symbol(self) -> str:
        return self.fields[2]

    @property
    def side(self) -> int:
        return self.fields[3]

    @property
    def order_type(self) -> int:
        return self.fields[4]

    @property
    def tif(self) -> int:
        return self.fields[5]

    @property
    def price(self) -> int:
        return self.fields[6]

    @property
    def quote(self) -> int:
        return self.fields[8]

    @property
    def expire(self) -> int:
        return self.fields[9]

    @property
    def live(self) -> bool:
        return self.status in (OPEN, PARTIALLY_FILLED)

    def state(self) -> Row:
        return (
            self.fields,
            self.status,
            self.filled,
            self.remaining,
            self.notional,
            self.fees,
            self.spent,
        )


@dataclass
class ReferenceMatcher:
    symbols: dict[str, SymbolSettings]
    horizon_ms: int
    max_expiries: int
    max_sweeps: int
    orders: dict[str, RefOrder] = field(default_factory=dict)  # the dedup index
    finished: list[RefOrder] = field(default_factory=list)  # in the order they finished
    sequences: dict[str, int] = field(default_factory=dict)
    last_price: dict[str, int] = field(default_factory=dict)
    halted: dict[str, bool] = field(default_factory=dict)
    killed: list[int] = field(default_factory=list)
    trade_id: int = 0
    arrival: int = 0
    now: int = 0
    out: list[Row] = field(default_factory=list)

    # --- helpers -------------------------------------------------------------------------

    def emit(self, order: RefOrder, kind: str, *payload: object) -> None:
        sequence = self.sequences.get(order.shard, 0) + 1
        self.sequences[order.shard] = sequence
        self.out.append(
            (order.shard, sequence, order.order_id, order.user, self.now, kind, *payload)
        )

    def finish(self, order: RefOrder, status: int) -> None:
        order.status = status
        order.end = self.now
        self.finished.append(order)

    def resting(self) -> list[RefOrder]:
        return [order for order in self.orders.values() if order.live]

    def sorted_side(self, symbol: str, side: int) -> list[RefOrder]:
        """Resting orders of one side, best price first, then arrival."""
        orders = [o for o in self.resting() if o.symbol == symbol and o.side == side]
        if side == BUY:
            return sorted(orders, key=lambda o: (-o.price, o.arrival))
        return sorted(orders, key=lambda o: (o.price, o.arrival))

    def reference(self, symbol: str) -> int:
        return self.last_price.get(symbol, self.symbols[symbol].reference_price_ticks)

    @staticmethod
    def parse(order_id: str, user_id: int) -> str | None:
        if len(order_id) > 128 or not order_id.isascii():
            return None
        match = ORDER_ID.match(order_id)
        if match is None or user_id == 0:
            return None
        shard, user_text, sequence_text = match.groups()
        if user_text != str(user_id):
            return None
        if sequence_text.startswith("0") or int(sequence_text) >= 2**64:
            return None
        return shard

    # --- commands ------------------------------------------------------------------------

    def execute(
        self, commands: list[matcher_pb2.MatcherCommand], now: int
    ) -> tuple[list[Row], list[Row]]:
        self.now = now
        self.out = []
        results = [self.command(command) for command in commands]
        return results, self.out

    def command(self, command: matcher_pb2.MatcherCommand) -> Row:
        cid = command.correlation_id
        which = command.WhichOneof("command")
        if which == "submit":
            return self.submit(cid, command.submit.order)
        if which == "cancel":
            order = self.orders.get(command.cancel.order_id)
            if order is None or order.user != command.cancel.user_id:
                return (cid, False, None, 0, True)
            if order.live:
                self.cancel_resting(order, R.CANCEL_REASON_REQUESTED)
            return (cid, False, order.state(), 0, False)
        if which in ("halt", "resume"):
            symbol = command.halt.symbol if which == "halt" else command.resume.symbol
            if symbol not in self.symbols:
                return (cid, False, None, R.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL, False)
            self.halted[symbol] = which == "halt"
            if which == "halt" and command.halt.cancel_resting:
                for order in self.sorted_side(symbol, BUY) + self.sorted_side(symbol, SELL):
                    self.cancel_resting(order, R.CANCEL_REASON_HALT)
            return (cid, False, None, 0, False)
        if which == "kill_switch":
            user = command.kill_switch.user_id
            if command.kill_switch.enable:
                if user not in self.killed:
                    self.killed.append(user)
                mine = sorted(
                    (o for o in self.resting() if o.user == user), key=lambda o: o.arrival
                )
                for order in mine:
                    self.cancel_resting(order, R.CANCEL_REASON_KILL_SWITCH)
            elif user in self.killed:
                self.killed.remove(user)
            return (cid, False, None, 0, False)
        return (cid, False, None, R.MATCHER_REJECT_REASON_INVALID_ORDER, False)

    def cancel_resting(self, order: RefOrder, reason: int) -> None:
        self.finish(order, CANCELLED)
        self.emit(order, "cancelled", reason, order.remaining)

    def validate(self, fields: OrderFields) -> int:
        _, user, symbol, side, order_type, tif, price, quantity, quote, expire, stp = fields
        config = self.symbols.get(symbol)
        if config is None:
            return R.MATCHER_REJECT_REASON_UNKNOWN_SYMBOL
        invalid = R.MATCHER_REJECT_REASON_INVALID_ORDER
        if side not in (BUY, SELL) or stp not in (0, 1, 2, 3):
            return invalid
        if order_type == LIMIT:
            if tif not in (1, 2, 3, 4, 5) or quote != 0 or price == 0:
                return invalid
            if (tif == GTD) != (expire != 0):
                return invalid
            if price < 0:
                return R.MATCHER_REJECT_REASON_PRICE_OFF_TICK
            if quantity <= 0:
                return R.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT
        elif order_type == MARKET:
            if tif not in (0, IOC) or price != 0 or expire != 0:
                return invalid
            if side == BUY and (quote <= 0 or quantity != 0):
                return invalid
            if side == SELL and quote != 0:
                return invalid
            if side == SELL and quantity <= 0:
                return R.MATCHER_REJECT_REASON_QUANTITY_OFF_LOT
        else:
            return invalid
        if tif == GTD and expire <= self.now:
            return R.MATCHER_REJECT_REASON_EXPIRE_TIME_PASSED
        if user in self.killed:
            return R.MATCHER_REJECT_REASON_USER_KILL_SWITCHED
        if self.halted.get(symbol, False):
            return R.MATCHER_REJECT_REASON_SYMBOL_HALTED
        if order_type == LIMIT:
            if price * quantity * config.tick_size < config.min_notional:
                return R.MATCHER_REJECT_REASON_BELOW_MIN_NOTIONAL
            ref = self.reference(symbol)
            if abs(price - ref) * 10_000 > ref * config.price_band_bps:
                return R.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND
        return 0

    def in_reach(self, symbol: str, is_buy: bool, price: int, ref: int) -> bool:
        band = self.symbols[symbol].price_band_bps
        if is_buy:
            return (price - ref) * 10_000 <= ref * band
        return (ref - price) * 10_000 <= ref * band

    def lot_cost(self, symbol: str, price: int, lots: int) -> int:
        config = self.symbols[symbol]
        notional = price * lots * config.tick_size
        return notional + notional * config.taker_fee_ppm // 1_000_000

    def submit(self, cid: int, message: matcher_pb2.Order) -> Row:
        fields = order_fields(message)
        shard = self.parse(message.order_id, message.user_id)
        if shard is None:
            state = (fields, REJECTED, 0, fields[7], 0, 0, 0)
            return (cid, False, state, R.MATCHER_REJECT_REASON_INVALID_ORDER_ID, False)
        known = self.orders.get(message.order_id)
        if known is not None:
            return (cid, True, known.state(), known.reason, False)
        order = RefOrder(fields, shard, OPEN, remaining=fields[7])
        reason = self.validate(fields) or self.book_reason(order)
        if reason:
            order.status = REJECTED
            order.reason = reason
            self.orders[order.order_id] = order
            self.finish(order, REJECTED)
            self.emit(order, "rejected", fields, reason)
            return (cid, False, order.state(), reason, False)
        self.arrival += 1
        order.arrival = self.arrival
        self.orders[order.order_id] = order
        self.emit(order, "accepted", (fields, OPEN, 0, fields[7], 0, 0, 0))
        stop = self.match(order)
        if order.live:
            if stop:
                self.cancel_resting(order, stop)
            elif order.order_type == MARKET or order.tif in (IOC, FOK):
                self.cancel_resting(order, R.CANCEL_REASON_IOC_REMAINDER)
            # else: it rests, as a live order in `orders`
        elif order.status == FILLED:
            self.finish(order, FILLED)
        return (cid, False, order.state(), 0, False)

    def book_reason(self, order: RefOrder) -> int:
        is_buy = order.side == BUY
        contra = self.sorted_side(order.symbol, SELL if is_buy else BUY)
        if order.order_type == LIMIT:
            crosses = bool(contra) and (
                contra[0].price <= order.price if is_buy else contra[0].price >= order.price
            )
            if order.tif == POST_ONLY and crosses:
                return R.MATCHER_REJECT_REASON_POST_ONLY_WOULD_CROSS
            if order.tif == FOK and not self.fok_fillable(order, contra):
                return R.MATCHER_REJECT_REASON_FOK_NOT_FILLABLE
            return 0
        if not contra:
            return R.MATCHER_REJECT_REASON_NO_LIQUIDITY
        best = contra[0].price
        if not self.in_reach(order.symbol, is_buy, best, self.reference(order.symbol)):
            return R.MATCHER_REJECT_REASON_NO_LIQUIDITY
        if is_buy and self.lot_cost(order.symbol, best, 1) > order.quote:
            return R.MATCHER_REJECT_REASON_NO_LIQUIDITY
        return 0

    def fok_fillable(self, order: RefOrder, contra: list[RefOrder]) -> bool:
        available = 0
        for maker in contra:
            crosses = (
                maker.price <= order.price if order.side == BUY else maker.price >= order.price
            )
            if not crosses:
                break
            if maker.user == order.user:
                if order.fields[10] == 2:  # CANCEL_OLDEST skips the user's own orders
                    continue
                break
            available += maker.remaining
        return available >= order.remaining

    def match(self, taker: RefOrder) -> int:
        is_buy = taker.side == BUY
        config = self.symbols[taker.symbol]
        ref = self.reference(taker.symbol)
        market_buy = taker.order_type == MARKET and is_buy
        for maker in self.sorted_side(taker.symbol, SELL if is_buy else BUY):
            if not maker.live:
                continue
            price = maker.price
            if taker.order_type == LIMIT:
                if price > taker.price if is_buy else price < taker.price:
                    return 0
            elif not self.in_reach(taker.symbol, is_buy, price, ref):
                return R.CANCEL_REASON_PRICE_BAND
            if maker.user == taker.user:
                mode = taker.fields[10]
                if mode in (0, 1):
                    return R.CANCEL_REASON_SELF_TRADE
                self.cancel_resting(maker, R.CANCEL_REASON_SELF_TRADE)
                if mode == 3:
                    return R.CANCEL_REASON_SELF_TRADE
                continue
            if market_buy:
                budget = taker.quote - taker.spent
                lots = maker.remaining
                while lots > 0 and self.lot_cost(taker.symbol, price, lots) > budget:
                    lots -= 1
                if lots == 0:
                    return 0
            else:
                lots = min(taker.remaining, maker.remaining)
            self.trade_id += 1
            notional = price * lots * config.tick_size
            maker_fee = notional * config.maker_fee_ppm // 1_000_000
            taker_fee = notional * config.taker_fee_ppm // 1_000_000
            for party, fee in ((maker, maker_fee), (taker, taker_fee)):
                party.filled += lots
                party.notional += notional
                party.fees += fee
                if party is taker and market_buy:
                    party.spent += notional + fee
                    done = party.spent == party.quote
                else:
                    party.remaining -= lots
                    done = party.remaining == 0
                party.status = FILLED if done else PARTIALLY_FILLED
                self.emit(
                    party,
                    "fill",
                    self.trade_id,
                    taker.symbol,
                    party.side,
                    price,
                    lots,
                    notional,
                    fee,
                    party is maker,
                    party.remaining,
                    done,
                )
                if party is maker and done:
                    self.finish(maker, FILLED)
            self.last_price[taker.symbol] = price
            if maker.live or not taker.live:
                return 0
        return 0

    # --- timers --------------------------------------------------------------------------

    def timer(self, now: int) -> list[Row]:
        self.now = now
        self.out = []
        due = sorted(
            (o for o in self.resting() if o.tif == GTD and o.expire <= now),
            key=lambda o: (o.expire, o.arrival),
        )
        for order in due[: self.max_expiries]:
            self.finish(order, EXPIRED)
            self.emit(order, "expired", order.remaining)
        swept = 0
        while self.finished and swept < self.max_sweeps:
            oldest = self.finished[0]
            if oldest.end + self.horizon_ms > now:
                break
            del self.finished[0]
            del self.orders[oldest.order_id]
            swept += 1
        return self.out

    # --- views ---------------------------------------------------------------------------

    def book(self, symbol: str) -> dict[str, list[tuple[int, list[tuple[str, int]]]]]:
        view: dict[str, list[tuple[int, list[tuple[str, int]]]]] = {}
        for name, side in (("bids", BUY), ("asks", SELL)):
            levels: list[tuple[int, list[tuple[str, int]]]] = []
            for order in self.sorted_side(symbol, side):
                if not levels or levels[-1][0] != order.price:
                    levels.append((order.price, []))
                levels[-1][1].append((order.order_id, order.remaining))
            view[name] = levels
        return view

    def open_orders(self, shard: str, user: int) -> tuple[int, list[Row]]:
        mine = sorted(
            (o for o in self.resting() if o.user == user and o.shard == shard),
            key=lambda o: o.arrival,
        )
        return self.sequences.get(shard, 0), [o.state() for o in mine]
