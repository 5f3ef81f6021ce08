"""The matching engine: decides every command and timer tick of one matcher group.

Pure and deterministic: it reads time only from the `now_ms` it is given (the
consensus time of the log entry) and walks only dicts, lists and deques.

Per submitted order, in this order:
1. a malformed id (`order_ids`) is answered INVALID_ORDER_ID and recorded
   nowhere: no dedup entry, no event (there is no owning shard to sequence it);
2. a known id is answered `duplicate` with the existing order, nothing else;
3. admission checks (`validation`), then POST_ONLY_WOULD_CROSS, FOK_NOT_FILLABLE,
   NO_LIQUIDITY: a reject records the order as REJECTED in the dedup index and
   emits Rejected; nothing else changes;
4. Accepted, then matching in price-time priority at the resting orders' prices:
   per trade one Fill for the resting order (maker) then one for the incoming
   order (taker), sharing a `trade_id`; then the remainder rests (GTC, GTD,
   POST_ONLY) or is cancelled (IOC, FOK, market: IOC_REMAINDER; market beyond
   the band: PRICE_BAND; self-trade: SELF_TRADE).

Market orders: the price band is fixed at the order's arrival (its reference is
the last trade before it); a buy takes asks up to ref + ref*band/10000, a sell
bids down to ref - ref*band/10000. A market buy takes, at each resting order
in turn, the most lots whose notional plus taker fee fits in what is left of
`quote_amount` (one fill per resting order); it stops at the first resting
order it cannot take whole. It is FILLED when it spent its quote amount
exactly, else its remainder is cancelled. A market order is rejected
NO_LIQUIDITY when its first step fills nothing for want of liquidity: no
contra order, the best one beyond the band, or (buy) one lot at the best price
costs more than the quote amount. Self-trade prevention does not count as
liquidity missing: such an order is accepted and then cancelled SELF_TRADE.

Self-trade prevention, when the next resting order belongs to the incoming
order's user: CANCEL_NEWEST (and UNSPECIFIED) cancels the incoming remainder;
CANCEL_OLDEST cancels that resting order and goes on; CANCEL_BOTH cancels the
resting order, then the incoming remainder. A FOK counts only what it could
take before such a stop (CANCEL_OLDEST: skipping the user's own orders).

Halt with `cancel_resting` cancels the symbol's resting orders in book order
(bids best first, then asks, FIFO within a level); a kill switch cancels the
user's resting orders in arrival order.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Final

from protos.oms.v1 import matcher_pb2
from services.matcher.core.commands import (
    CancelCommand,
    Command,
    CommandResult,
    HaltCommand,
    KillSwitchCommand,
    ResumeCommand,
    SubmitCommand,
)
from services.matcher.core.dedup import DedupIndex
from services.matcher.core.errors import MatcherInvariantError
from services.matcher.core.event_log import ACCEPTED as ACCEPTED_KIND
from services.matcher.core.event_log import CANCELLED as CANCELLED_KIND
from services.matcher.core.event_log import FILL as FILL_KIND
from services.matcher.core.event_log import (
    AcceptedEvent,
    CancelledEvent,
    EventRecord,
    ExpiredEvent,
    FillEvent,
    RejectedEvent,
    ShardStream,
    retained_event,
)
from services.matcher.core.expiry import ExpiryQueue
from services.matcher.core.money import affordable_lots, market_reach
from services.matcher.core.order_book import BookSide
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import (
    BUY,
    CANCELLED,
    EXPIRED,
    FILLED,
    FOK,
    GTC,
    GTD,
    IOC,
    LAST_LIVE,
    LIMIT,
    MARKET,
    OPEN,
    PARTIALLY_FILLED,
    POST_ONLY,
    REJECTED,
    SELL,
    OrderSpec,
    OrderView,
    new_record,
    unrecorded_view,
)
from services.matcher.core.settings import BPS, INT64_MAX, PPM, EngineSettings, SymbolSettings
from services.matcher.core.state_digest import (
    FINISH,
    M_END,
    M_FEES,
    M_FILLED,
    M_NOTIONAL,
    M_REMAINING,
    M_SPENT,
    M_STATUS,
    MASK,
    S_ARRIVAL,
    S_EXPIRE,
    S_FLAGS,
    S_PRICE,
    S_QUANTITY,
    S_QUOTE,
    S_SEQ,
    S_USER,
    order_digest,
    static_digest,
    text_digest,
)
from services.matcher.core.symbols import LastTrade, SymbolBook
from services.matcher.core.validation import (
    BELOW_MIN_NOTIONAL,
    FOK_NOT_FILLABLE,
    INVALID_ORDER,
    INVALID_ORDER_ID,
    NO_LIQUIDITY,
    OUTSIDE_PRICE_BAND,
    POST_ONLY_WOULD_CROSS,
    SYMBOL_HALTED,
    UNKNOWN_SYMBOL,
    USER_KILL_SWITCHED,
    admission_reject_reason,
)

REQUESTED: Final[int] = matcher_pb2.CANCEL_REASON_REQUESTED
IOC_REMAINDER: Final[int] = matcher_pb2.CANCEL_REASON_IOC_REMAINDER
SELF_TRADE: Final[int] = matcher_pb2.CANCEL_REASON_SELF_TRADE
KILL_SWITCH: Final[int] = matcher_pb2.CANCEL_REASON_KILL_SWITCH
HALT: Final[int] = matcher_pb2.CANCEL_REASON_HALT
PRICE_BAND: Final[int] = matcher_pb2.CANCEL_REASON_PRICE_BAND

CANCEL_OLDEST: Final[int] = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_OLDEST
CANCEL_BOTH: Final[int] = matcher_pb2.SELF_TRADE_PREVENTION_CANCEL_BOTH

# Builds an OrderRecord without running `OrderRecord.__init__` (the hot path sets every slot).
_new_order = object.__new__
_OPEN_STATUS_DIGEST: Final[int] = OPEN * M_STATUS
_PARTIAL_STATUS_DIGEST: Final[int] = PARTIALLY_FILLED * M_STATUS
_FILLED_STATUS_DIGEST: Final[int] = FILLED * M_STATUS
_CANCELLED_STATUS_DIGEST: Final[int] = CANCELLED * M_STATUS
# state_digest.static_digest's flags term, by [side][order_type][time_in_force][stp], for
# the values an accepted order can have (rejected ones use `static_digest` itself).
_FLAG_DIGESTS: Final = tuple(
    tuple(
        tuple(
            tuple(
                (side + (order_type << 8) + (time_in_force << 16) + (stp << 24)) * S_FLAGS
                for stp in range(CANCEL_BOTH + 1)
            )
            for time_in_force in range(POST_ONLY + 1)
        )
        for order_type in range(MARKET + 1)
    )
    for side in range(SELL + 1)
)
_SIDES: Final = (BUY, SELL)
_IOC_FOK: Final = (IOC, FOK)

_HASH_HEADER = struct.Struct("<QQQQQQ")
_HASH_SETTINGS = struct.Struct("<QQQQQ")
_HASH_SYMBOL = struct.Struct("<qqqqqqqBqQQ")
_HASH_STREAM = struct.Struct("<QQ")
_HASH_USER = struct.Struct("<Q")


class MatcherEngine:
    """Books, dedup index, event streams and counters of one matcher group."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.books: dict[str, SymbolBook] = {}
        self.dedup = DedupIndex()
        self.streams: dict[str, ShardStream] = {}
        self.user_orders: dict[int, dict[str, OrderRecord]] = {}  # resting, arrival order
        self.kill_switched: dict[int, None] = {}  # used as an ordered set
        self.expiries = ExpiryQueue()
        self.last_trade_id = 0
        self.last_arrival = 0
        self.digest_sum = 0  # sum of every dedup record's digest, mod 2^64
        self.install_symbols(settings.symbols)

    def install_symbols(self, symbols: Sequence[SymbolSettings]) -> None:
        """Replace the symbol table (at construction, or by a restore before its orders)."""
        self.books = {symbol.symbol: SymbolBook(symbol) for symbol in symbols}

    # --- commands ---------------------------------------------------------------------

    def execute(
        self, commands: Sequence[Command], now_ms: int
    ) -> tuple[list[CommandResult], list[EventRecord]]:
        """Apply commands in order at consensus time `now_ms`: one result each, and events."""
        results: list[CommandResult] = []
        events: list[EventRecord] = []
        append = results.append
        for command in commands:
            if isinstance(command, SubmitCommand):
                append(self._submit(command, now_ms, events))
            elif isinstance(command, CancelCommand):
                append(self._cancel(command, now_ms, events))
            elif isinstance(command, HaltCommand):
                append(self._halt(command, now_ms, events))
            elif isinstance(command, ResumeCommand):
                append(self._resume(command))
            elif isinstance(command, KillSwitchCommand):
                append(self._kill_switch(command, now_ms, events))
            else:
                append(CommandResult(command.correlation_id, False, None, INVALID_ORDER, False))
        return results, events

    def _stream(self, oms_shard: str) -> ShardStream:
        stream = self.streams.get(oms_shard)
        if stream is None:
            stream = ShardStream(
                oms_shard, self.settings.retained_events_per_shard, text_digest(oms_shard)
            )
            self.streams[oms_shard] = stream
        return stream

    def order_key_digest(
        self, spec: OrderSpec, stream: ShardStream, arrival: int, reject_reason: int
    ) -> int:
        book = self.books.get(spec.symbol)
        symbol_digest = text_digest(spec.symbol) if book is None else book.digest
        return static_digest(spec, stream.digest, symbol_digest, arrival, reject_reason)

    def _rehash(self, order: OrderRecord) -> None:
        digest = order_digest(order)
        self.digest_sum = (self.digest_sum + digest - order.digest) & MASK
        order.digest = digest

    def _submit(self, command: SubmitCommand, now: int, events: list[EventRecord]) -> CommandResult:
        # The hot path of the engine: written with locals and inlined helpers. What it
        # inlines is stated once elsewhere: the admission checks in `validation`, the
        # record's fields in `OrderRecord.__init__`, the digests in `state_digest`,
        # resting in `BookSide.rest`.
        spec = command.spec
        (
            order_id,
            user_id,
            symbol,
            side,
            order_type,
            time_in_force,
            price,
            quantity,
            quote_amount,
            expire_at_ms,
            stp,
            oms_shard,
            user_seq,
        ) = spec
        if not user_seq:
            return CommandResult(
                command.correlation_id, False, unrecorded_view(spec), INVALID_ORDER_ID, False
            )
        dedup_orders = self.dedup.orders
        known = dedup_orders.get(order_id)
        if known is not None:
            return CommandResult(
                command.correlation_id, True, known.view(), known.reject_reason, False
            )
        book = self.books.get(symbol)
        if book is None:
            return self._reject(command.correlation_id, spec, UNKNOWN_SYMBOL, now, events)
        is_limit = order_type == LIMIT
        if (
            is_limit
            and price > 0
            and quantity > 0
            and not quote_amount
            and not expire_at_ms
            and side in _SIDES
            and (GTC <= time_in_force <= FOK or time_in_force == POST_ONLY)
            and 0 <= stp <= CANCEL_BOTH
        ):
            # `admission_reject_reason` for a limit order whose fields are consistent
            # (`field_reject_reason` is 0) and that is not GTD.
            kill_switched = self.kill_switched
            if kill_switched and user_id in kill_switched:
                reason = USER_KILL_SWITCHED
            elif book.halted:
                reason = SYMBOL_HALTED
            else:
                settings = book.settings
                limit_notional = price * quantity * settings.tick_size
                if limit_notional < settings.min_notional:
                    reason = BELOW_MIN_NOTIONAL
                elif limit_notional > INT64_MAX:
                    reason = INVALID_ORDER
                else:
                    reference = book.last_price_ticks or settings.reference_price_ticks
                    distance = price - reference if price >= reference else reference - price
                    if distance * BPS > reference * settings.price_band_bps:
                        reason = OUTSIDE_PRICE_BAND
                    else:
                        reason = 0
        else:
            reason = admission_reject_reason(spec, book, now, self.kill_switched)
        if reason:
            return self._reject(command.correlation_id, spec, reason, now, events)

        is_buy = side == BUY
        contra = book.asks if is_buy else book.bids
        contra_keys = contra.keys
        best = (-contra_keys[-1] if is_buy else contra_keys[-1]) if contra_keys else None
        if is_limit:
            crosses = best is not None and (best <= price if is_buy else best >= price)
            if crosses:
                if time_in_force == POST_ONLY:
                    reason = POST_ONLY_WOULD_CROSS
                elif time_in_force == FOK and not self._fok_fillable(spec, contra):
                    reason = FOK_NOT_FILLABLE
            elif time_in_force == FOK:
                reason = FOK_NOT_FILLABLE
            if not reason and not is_buy and best is not None:
                # INVALID_ORDER when a sell's worst-case proceeds would not fit in int64.
                highest = price if price > best else best
                if quantity * highest * book.settings.tick_size > INT64_MAX:
                    reason = INVALID_ORDER
        else:
            crosses = True
            reason = self._market_liquidity(spec, book, best, is_buy)
            if not reason and not is_buy and best is not None:
                reason = _sell_overflow(quantity, best, book)
        if reason:
            return self._reject(command.correlation_id, spec, reason, now, events)

        stream = self.streams.get(oms_shard) or self._stream(oms_shard)
        arrival = self.last_arrival + 1
        self.last_arrival = arrival
        # state_digest.static_digest(spec, stream.digest, book.digest, arrival, 0)
        key_digest = (
            stream.digest
            + book.digest
            + user_id * S_USER
            + user_seq * S_SEQ
            + price * S_PRICE
            + quantity * S_QUANTITY
            + _FLAG_DIGESTS[side][order_type][time_in_force][stp]
            + arrival * S_ARRIVAL
        )
        if quote_amount:
            key_digest += quote_amount * S_QUOTE
        if expire_at_ms:
            key_digest += expire_at_ms * S_EXPIRE
        key_digest &= MASK
        # OrderRecord(spec, stream, arrival, key_digest), moved NEW -> OPEN
        order = _new_order(OrderRecord)
        order.spec = spec
        order.order_id = order_id
        order.user_id = user_id
        order.side = side
        order.price_ticks = price
        order.stream = stream
        order.arrival = arrival
        order.key_digest = key_digest
        order.digest = 0
        order.status = OPEN
        order.filled_lots = 0
        order.remaining_lots = quantity
        order.filled_notional = 0
        order.fees_paid = 0
        order.quote_spent = 0
        order.end_time_ms = 0
        order.reject_reason = 0
        dedup_orders[order_id] = order
        sequence = stream.next_sequence
        stream.next_sequence = sequence + 1
        events.append(new_record(AcceptedEvent, (sequence, now, spec)))
        stream.retained.append((ACCEPTED_KIND, sequence, now) + spec)  # noqa: RUF005

        if not crosses and is_limit and time_in_force not in _IOC_FOK:
            # Rests untouched (GTC, GTD, POST_ONLY): BookSide.rest, the user index, the digest.
            own = book.bids if is_buy else book.asks
            level = own.levels.get(price)
            if level is None:
                own.rest(order)
            else:
                level.orders.append(order)
                level.live_count += 1
            by_user = self.user_orders.get(user_id)
            if by_user is None:
                self.user_orders[user_id] = {order_id: order}
            else:
                by_user[order_id] = order
            if time_in_force == GTD:
                self.expiries.push(order)
            # state_digest.order_digest(order): only status and remaining are non-zero.
            value = (key_digest + _OPEN_STATUS_DIGEST + quantity * M_REMAINING) & MASK
            value = ((value ^ (value >> 32)) * FINISH) & MASK
            digest = value ^ (value >> 29)
            order.digest = digest
            self.digest_sum = (self.digest_sum + digest) & MASK
            return new_record(
                CommandResult,
                (
                    command.correlation_id,
                    False,
                    new_record(OrderView, (spec, OPEN, 0, quantity, 0, 0, 0)),
                    0,
                    False,
                ),
            )

        stop = self._match(order, book, contra, now, events) if crosses else 0
        if order.status <= LAST_LIVE:
            if stop:
                self._close(order, CANCELLED, stop, now, events)
            elif not is_limit or time_in_force in _IOC_FOK:
                self._close(order, CANCELLED, IOC_REMAINDER, now, events)
            else:
                (book.bids if is_buy else book.asks).rest(order)
                by_user = self.user_orders.get(user_id)
                if by_user is None:
                    self.user_orders[user_id] = {order_id: order}
                else:
                    by_user[order_id] = order
                if time_in_force == GTD:
                    self.expiries.push(order)
        else:
            order.end_time_ms = now
            self.dedup.finished.append(order)
        self._rehash(order)
        return new_record(CommandResult, (command.correlation_id, False, order.view(), 0, False))

    def _market_liquidity(
        self, spec: OrderSpec, book: SymbolBook, best: int | None, is_buy: bool
    ) -> int:
        """NO_LIQUIDITY when the first step of a market order could fill nothing, else 0."""
        if best is None:
            return NO_LIQUIDITY
        settings = book.settings
        reach = market_reach(book.reference_price_ticks(), settings.price_band_bps, is_buy)
        if best > reach if is_buy else best < reach:
            return NO_LIQUIDITY
        if is_buy and not affordable_lots(
            spec.quote_amount, best * settings.tick_size, settings.taker_fee_ppm
        ):
            return NO_LIQUIDITY
        return 0

    def _fok_fillable(self, spec: OrderSpec, contra: BookSide) -> bool:
        needed = spec.quantity_lots
        limit = spec.price_ticks
        user_id = spec.user_id
        skip_own = spec.self_trade_prevention == CANCEL_OLDEST
        for level in contra.levels_best_first():
            if level.price_ticks > limit if not contra.is_bid else level.price_ticks < limit:
                return False
            for maker in level.live_orders():
                if maker.user_id == user_id:
                    if skip_own:
                        continue
                    return False
                needed -= maker.remaining_lots
                if needed <= 0:
                    return True
        return False

    def _match(
        self,
        taker: OrderRecord,
        book: SymbolBook,
        contra: BookSide,
        now: int,
        events: list[EventRecord],
    ) -> int:
        """Trade the taker against `contra` (its opposite side); return what stopped it, or 0.

        0 means the taker is filled, or no resting order is left within its limit
        price (or, for a market buy, its budget): the caller rests or cancels it.
        """
        spec = taker.spec
        contra_is_bid = contra.is_bid
        is_buy = not contra_is_bid
        settings = book.settings
        tick_size = settings.tick_size
        maker_fee_ppm = settings.maker_fee_ppm
        taker_fee_ppm = settings.taker_fee_ppm
        is_market = spec.order_type != LIMIT
        market_buy = is_market and is_buy
        quote_amount = spec.quote_amount
        if is_market:
            reach = market_reach(book.reference_price_ticks(), settings.price_band_bps, is_buy)
        else:
            reach = spec.price_ticks
        stp = spec.self_trade_prevention
        taker_user = taker.user_id
        taker_stream = taker.stream
        keys = contra.keys
        levels = contra.levels
        dedup_finished = self.dedup.finished
        user_orders = self.user_orders
        emit = events.append
        while keys:
            key = keys[-1]
            price = key if contra_is_bid else -key
            if price > reach if is_buy else price < reach:
                return PRICE_BAND if is_market else 0
            level = levels[price]
            queue = level.orders
            lot_cost = price * tick_size
            while True:
                maker = queue[0]
                if maker.status > LAST_LIVE:  # lazily deleted
                    queue.popleft()
                    continue
                if maker.user_id == taker_user:
                    if stp != CANCEL_OLDEST and stp != CANCEL_BOTH:  # noqa: PLR1714
                        return SELF_TRADE
                    queue.popleft()
                    level.live_count -= 1
                    if not level.live_count:
                        keys.pop()
                        del levels[price]
                    self._retire(maker, CANCELLED, now)
                    self._emit_cancelled(maker, SELF_TRADE, now, events)
                    self._rehash(maker)
                    if stp == CANCEL_BOTH:
                        return SELF_TRADE
                    if not level.live_count:
                        break
                    continue
                maker_remaining = maker.remaining_lots
                if market_buy:
                    quantity = affordable_lots(
                        quote_amount - taker.quote_spent, lot_cost, taker_fee_ppm
                    )
                    if not quantity:
                        return 0
                    quantity = maker_remaining if maker_remaining < quantity else quantity
                else:
                    quantity = taker.remaining_lots
                    quantity = maker_remaining if maker_remaining < quantity else quantity
                trade_id = self.last_trade_id + 1
                self.last_trade_id = trade_id
                notional = lot_cost * quantity
                maker_fee = notional * maker_fee_ppm // PPM
                taker_fee = notional * taker_fee_ppm // PPM

                maker_remaining -= quantity
                maker_filled = maker.filled_lots + quantity
                maker_notional = maker.filled_notional + notional
                maker_fees = maker.fees_paid + maker_fee
                maker.remaining_lots = maker_remaining
                maker.filled_lots = maker_filled
                maker.filled_notional = maker_notional
                maker.fees_paid = maker_fees
                stream = maker.stream
                sequence = stream.next_sequence
                stream.next_sequence = sequence + 1
                maker_spec = maker.spec
                maker_done = not maker_remaining
                emit(
                    new_record(
                        FillEvent,
                        (
                            sequence,
                            now,
                            maker_spec,
                            trade_id,
                            price,
                            quantity,
                            notional,
                            maker_fee,
                            True,
                            maker_remaining,
                            maker_done,
                        ),
                    )
                )
                row = (
                    FILL_KIND,
                    sequence,
                    now,
                    trade_id,
                    price,
                    quantity,
                    notional,
                    maker_fee,
                    True,
                    maker_remaining,
                    maker_done,
                )
                stream.retained.append(row + maker_spec)

                taker.filled_lots += quantity
                taker.filled_notional += notional
                taker.fees_paid += taker_fee
                if market_buy:
                    spent = taker.quote_spent + notional + taker_fee
                    taker.quote_spent = spent
                    taker_done = spent == quote_amount
                else:
                    taker.remaining_lots -= quantity
                    taker_done = not taker.remaining_lots
                taker.status = FILLED if taker_done else PARTIALLY_FILLED
                sequence = taker_stream.next_sequence
                taker_stream.next_sequence = sequence + 1
                taker_remaining = taker.remaining_lots
                emit(
                    new_record(
                        FillEvent,
                        (
                            sequence,
                            now,
                            spec,
                            trade_id,
                            price,
                            quantity,
                            notional,
                            taker_fee,
                            False,
                            taker_remaining,
                            taker_done,
                        ),
                    )
                )
                row = (
                    FILL_KIND,
                    sequence,
                    now,
                    trade_id,
                    price,
                    quantity,
                    notional,
                    taker_fee,
                    False,
                    taker_remaining,
                    taker_done,
                )
                taker_stream.retained.append(row + spec)

                book.last_price_ticks = price
                book.last_trade_id = trade_id
                book.last_trade_time_ms = now

                if maker_remaining:
                    maker.status = PARTIALLY_FILLED
                    # state_digest.order_digest(maker), inlined (end_time_ms is 0)
                    value = (
                        maker.key_digest
                        + _PARTIAL_STATUS_DIGEST
                        + maker_remaining * M_REMAINING
                        + maker_filled * M_FILLED
                        + maker_notional * M_NOTIONAL
                        + maker_fees * M_FEES
                        + maker.quote_spent * M_SPENT
                    ) & MASK
                    value = ((value ^ (value >> 32)) * FINISH) & MASK
                    digest = value ^ (value >> 29)
                    self.digest_sum = (self.digest_sum + digest - maker.digest) & MASK
                    maker.digest = digest
                    # Only a market buy's budget stops short of a resting order.
                    return 0
                maker.status = FILLED
                queue.popleft()
                maker.end_time_ms = now
                dedup_finished.append(maker)
                by_user = user_orders[maker.user_id]
                del by_user[maker.order_id]
                if not by_user:
                    del user_orders[maker.user_id]
                if maker.spec.time_in_force == GTD:
                    self.expiries.note_finished()
                # state_digest.order_digest(maker), inlined (remaining_lots is 0)
                value = (
                    maker.key_digest
                    + _FILLED_STATUS_DIGEST
                    + maker_filled * M_FILLED
                    + maker_notional * M_NOTIONAL
                    + maker_fees * M_FEES
                    + maker.quote_spent * M_SPENT
                    + now * M_END
                ) & MASK
                value = ((value ^ (value >> 32)) * FINISH) & MASK
                digest = value ^ (value >> 29)
                self.digest_sum = (self.digest_sum + digest - maker.digest) & MASK
                maker.digest = digest
                level.live_count -= 1
                if not level.live_count:
                    keys.pop()
                    del levels[price]
                    if taker_done:
                        return 0
                    break
                if taker_done:
                    return 0
        return 0

    def _retire(self, order: OrderRecord, status: int, now: int) -> None:
        """A resting order ends: leave the per-user index and queue for the dedup sweep.

        The caller has already taken it out of its book.
        """
        order.move_to(status)
        order.end_time_ms = now
        self.dedup.finished.append(order)
        by_user = self.user_orders.get(order.user_id)
        if by_user is None or by_user.pop(order.order_id, None) is not order:
            raise MatcherInvariantError(f"resting order {order.order_id} is not indexed")
        if not by_user:
            del self.user_orders[order.user_id]
        if order.spec.time_in_force == GTD and status != EXPIRED:
            self.expiries.note_finished()

    def _close(
        self, order: OrderRecord, status: int, reason: int, now: int, events: list[EventRecord]
    ) -> None:
        """An incoming order that will not rest ends with its remainder cancelled."""
        order.move_to(status)
        order.end_time_ms = now
        self.dedup.finished.append(order)
        self._emit_cancelled(order, reason, now, events)

    def _emit_cancelled(
        self, order: OrderRecord, reason: int, now: int, events: list[EventRecord]
    ) -> None:
        stream = order.stream
        sequence = stream.next_sequence
        stream.next_sequence = sequence + 1
        spec = order.spec
        remaining = order.remaining_lots
        events.append(new_record(CancelledEvent, (sequence, now, spec, reason, remaining)))
        stream.retained.append((CANCELLED_KIND, sequence, now, reason, remaining) + spec)  # noqa: RUF005

    def _cancel_resting(
        self, order: OrderRecord, status: int, reason: int, now: int, events: list[EventRecord]
    ) -> None:
        """Cancel or expire a resting order: out of its book, one event."""
        book = self.books[order.spec.symbol]
        side = book.bids if order.side == BUY else book.asks
        self._retire(order, status, now)
        side.withdraw(order)
        if status == EXPIRED:
            stream = order.stream
            sequence = stream.next_sequence
            stream.next_sequence = sequence + 1
            spec = order.spec
            remaining = order.remaining_lots
            event: EventRecord = ExpiredEvent(sequence, now, spec, remaining)
            events.append(event)
            stream.retained.append(retained_event(event))
        else:
            self._emit_cancelled(order, reason, now, events)
        self._rehash(order)

    def _reject(
        self, correlation_id: int, spec: OrderSpec, reason: int, now: int, events: list[EventRecord]
    ) -> CommandResult:
        stream = self._stream(spec.oms_shard)
        order = OrderRecord(spec, stream, 0, self.order_key_digest(spec, stream, 0, reason))
        order.move_to(REJECTED)
        order.reject_reason = reason
        order.end_time_ms = now
        self.dedup.orders[spec.order_id] = order
        self.dedup.finished.append(order)
        sequence = stream.next_sequence
        stream.next_sequence = sequence + 1
        event = RejectedEvent(sequence, now, spec, reason)
        events.append(event)
        stream.retained.append(retained_event(event))
        self._rehash(order)
        return CommandResult(correlation_id, False, order.view(), reason, False)

    def _cancel(self, command: CancelCommand, now: int, events: list[EventRecord]) -> CommandResult:
        correlation_id, order_id, user_id = command
        order = self.dedup.orders.get(order_id)
        if order is None or order.user_id != user_id:
            return new_record(CommandResult, (correlation_id, False, None, 0, True))
        if order.status > LAST_LIVE:
            return new_record(CommandResult, (correlation_id, False, order.view(), 0, False))
        # _cancel_resting(order, CANCELLED, REQUESTED, ...), inlined. `_retire`: a live
        # record is OPEN or PARTIALLY_FILLED, both of which may move to CANCELLED.
        order.status = CANCELLED
        order.end_time_ms = now
        self.dedup.finished.append(order)
        user_orders = self.user_orders
        by_user = user_orders.get(user_id)
        if by_user is None or by_user.pop(order_id, None) is not order:
            raise MatcherInvariantError(f"resting order {order_id} is not indexed")
        if not by_user:
            del user_orders[user_id]
        spec = order.spec
        if spec.time_in_force == GTD:
            self.expiries.note_finished()
        book = self.books[spec.symbol]
        (book.bids if order.side == BUY else book.asks).withdraw(order)
        # _emit_cancelled(order, REQUESTED, ...)
        stream = order.stream
        sequence = stream.next_sequence
        stream.next_sequence = sequence + 1
        remaining = order.remaining_lots
        events.append(new_record(CancelledEvent, (sequence, now, spec, REQUESTED, remaining)))
        stream.retained.append((CANCELLED_KIND, sequence, now, REQUESTED, remaining) + spec)  # noqa: RUF005
        # _rehash(order): state_digest.order_digest, inlined
        filled = order.filled_lots
        notional = order.filled_notional
        fees = order.fees_paid
        spent = order.quote_spent
        value = (
            order.key_digest
            + _CANCELLED_STATUS_DIGEST
            + remaining * M_REMAINING
            + filled * M_FILLED
            + notional * M_NOTIONAL
            + fees * M_FEES
            + spent * M_SPENT
            + now * M_END
        ) & MASK
        value = ((value ^ (value >> 32)) * FINISH) & MASK
        digest = value ^ (value >> 29)
        self.digest_sum = (self.digest_sum + digest - order.digest) & MASK
        order.digest = digest
        view = new_record(OrderView, (spec, CANCELLED, filled, remaining, notional, fees, spent))
        return new_record(CommandResult, (correlation_id, False, view, 0, False))

    def _halt(self, command: HaltCommand, now: int, events: list[EventRecord]) -> CommandResult:
        book = self.books.get(command.symbol)
        if book is None:
            return CommandResult(command.correlation_id, False, None, UNKNOWN_SYMBOL, False)
        book.halted = True
        if command.cancel_resting:
            for order in list(book.resting_orders()):
                self._cancel_resting(order, CANCELLED, HALT, now, events)
        return CommandResult(command.correlation_id, False, None, 0, False)

    def _resume(self, command: ResumeCommand) -> CommandResult:
        book = self.books.get(command.symbol)
        if book is None:
            return CommandResult(command.correlation_id, False, None, UNKNOWN_SYMBOL, False)
        book.halted = False
        return CommandResult(command.correlation_id, False, None, 0, False)

    def _kill_switch(
        self, command: KillSwitchCommand, now: int, events: list[EventRecord]
    ) -> CommandResult:
        user_id = command.user_id
        if command.enable:
            self.kill_switched[user_id] = None
            for order in list(self.user_orders.get(user_id, {}).values()):
                self._cancel_resting(order, CANCELLED, KILL_SWITCH, now, events)
        else:
            self.kill_switched.pop(user_id, None)
        return CommandResult(command.correlation_id, False, None, 0, False)

    # --- timers -----------------------------------------------------------------------

    def on_timer(self, now_ms: int) -> list[EventRecord]:
        """Expire due GTD orders, then forget ids past the dedup horizon; both bounded."""
        events: list[EventRecord] = []
        settings = self.settings
        for order in self.expiries.pop_due(now_ms, settings.max_expiries_per_timer):
            self._cancel_resting(order, EXPIRED, 0, now_ms, events)
        forgotten = self.dedup.sweep(
            now_ms, settings.dedup_horizon_ms, settings.max_dedup_sweeps_per_timer
        )
        digest_sum = self.digest_sum
        for order in forgotten:
            digest_sum -= order.digest
        self.digest_sum = digest_sum & MASK
        return events

    # --- queries (not logged) ---------------------------------------------------------

    def order_view(self, order_id: str) -> OrderView | None:
        order = self.dedup.orders.get(order_id)
        return None if order is None else order.view()

    def open_orders(self, oms_shard: str, user_id: int) -> tuple[int, list[OrderView]]:
        """(as-of sequence of the shard's stream, the user's resting orders from that shard)."""
        stream = self.streams.get(oms_shard)
        as_of = 0 if stream is None else stream.last_sequence
        resting = self.user_orders.get(user_id, {})
        return as_of, [
            order.view() for order in resting.values() if order.stream.oms_shard == oms_shard
        ]

    def events_from(
        self, oms_shard: str, from_sequence: int, limit: int | None = None
    ) -> list[EventRecord]:
        stream = self.streams.get(oms_shard)
        if stream is None:
            # Nothing was ever sequenced for this shard: every sequence is still to come.
            return []
        return stream.events_from(from_sequence, limit)

    def last_trades(self) -> list[LastTrade]:
        """The last trade of every symbol that traded, in symbol order."""
        trades = [book.last_trade() for _, book in sorted(self.books.items())]
        return [trade for trade in trades if trade is not None]

    def levels(self, symbol: str, side: int) -> list[tuple[int, list[OrderView]]]:
        """One side of a book, best level first: (price, resting orders in time priority)."""
        book = self.books[symbol]
        book_side = book.bids if side == BUY else book.asks
        return [
            (level.price_ticks, [order.view() for order in level.live_orders()])
            for level in book_side.levels_best_first()
        ]

    def state_hash(self) -> bytes:
        """Digest of the whole state in O(symbols + shards + kill-switched users)."""
        settings = self.settings
        digest = hashlib.blake2b(digest_size=16)
        digest.update(
            _HASH_HEADER.pack(
                self.digest_sum,
                self.last_trade_id,
                self.last_arrival,
                len(self.dedup.orders),
                len(self.dedup.finished),
                len(self.expiries),
            )
        )
        digest.update(
            _HASH_SETTINGS.pack(
                settings.dedup_horizon_ms,
                settings.retained_events_per_shard,
                settings.max_expiries_per_timer,
                settings.max_dedup_sweeps_per_timer,
                settings.max_commands_per_batch,
            )
        )
        for symbol, book in sorted(self.books.items()):
            config = book.settings
            digest.update(symbol.encode() + b"\x00")
            digest.update(
                f"{config.base_asset}\x00{config.quote_asset}\x00".encode()
                + _HASH_SYMBOL.pack(
                    config.lot_size,
                    config.tick_size,
                    config.min_notional,
                    config.price_band_bps,
                    config.reference_price_ticks,
                    config.maker_fee_ppm,
                    config.taker_fee_ppm,
                    book.halted,
                    book.last_price_ticks,
                    book.last_trade_id,
                    book.last_trade_time_ms,
                )
            )
        for oms_shard, stream in sorted(self.streams.items()):
            digest.update(oms_shard.encode() + b"\x00")
            digest.update(_HASH_STREAM.pack(stream.next_sequence, len(stream.retained)))
        for user_id in sorted(self.kill_switched):
            digest.update(_HASH_USER.pack(user_id))
        return digest.digest()


def _sell_overflow(quantity_lots: int, highest_price: int, book: SymbolBook) -> int:
    """INVALID_ORDER when a sell's worst-case proceeds would not fit in int64."""
    if quantity_lots * highest_price * book.settings.tick_size > INT64_MAX:
        return INVALID_ORDER
    return 0
