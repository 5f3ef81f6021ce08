"""The credit-reservation saga, client side: admit, reserve exactly, send; cancel.

Per PlaceOrder, in this order (each refusal changes no state at all):

1. static checks (`place_problem`), before the user is even looked up;
2. health: a quarantined or halted actor refuses client commands (USER_HALTED);
   an operator's trading halt refuses places (TRADING_HALTED; cancels pass);
3. dedup: Bloom "never seen" -> new; "possibly seen" -> the exact map (or a
   live order with that client id) answers a duplicate with the original
   result; a miss parks the order behind a `DedupLookup` to the persister;
4. backpressure (sagas in flight across the shard), then the rate limit;
5. risk limits (`risk.admission_reason`), then funds;
6. accept: take a token, user_seq += 1, reserve, index the order as PENDING,
   remember the client id (Bloom + exact map), and emit SubmitToMatcher, the
   provisional result and the order row.

Reservations: a limit buy reserves notional plus the fee at the higher of the
two rates; a limit or market sell its base quantity; a market buy its quote
amount, which already includes the fee.
"""

from __future__ import annotations

from services.shard.core.actor import QUARANTINED, DedupWait, UserActor
from services.shard.core.commands import (
    CancelAllAfter,
    CancelAllOrders,
    CancelOrder,
    ClientCommand,
    DedupAnswer,
    EndSession,
    KeepSession,
    PlaceOrder,
)
from services.shard.core.dedup import Recent, as_recent, remember, within_horizon
from services.shard.core.egress import (
    CancelToMatcher,
    DedupLookup,
    Egress,
    OrderUpdate,
    ShardResult,
    SubmitToMatcher,
)
from services.shard.core.errors import InjectedFault
from services.shard.core.mailbox import mailbox_full
from services.shard.core.orders import OpenOrder, parse_order_id
from services.shard.core.rate_limit import COST_MILLI_TOKENS
from services.shard.core.reservations import reserve
from services.shard.core.risk import NO_LIMITS
from services.shard.core.risk_checks import admission_reason
from services.shard.core.settings import FAULT_CORRUPT
from services.shard.core.shard_state import ShardState
from services.shard.core.vocabulary import (
    BUY,
    GTD,
    INT64_MAX,
    LIMIT,
    MARKET,
    PENDING,
    PPM,
    SELL,
    RejectReason,
    SelfTradePrevention,
    TimeInForce,
)

_LIMIT_TIME_IN_FORCE = (
    TimeInForce.UNSPECIFIED,
    TimeInForce.GTC,
    TimeInForce.IOC,
    TimeInForce.FOK,
    TimeInForce.POST_ONLY,
)
_MARKET_TIME_IN_FORCE = (TimeInForce.UNSPECIFIED, TimeInForce.IOC)
_MAX_CLIENT_ORDER_ID = 64
_MALFORMED = int(RejectReason.MALFORMED)
_BACKPRESSURE = int(RejectReason.BACKPRESSURE)
_RATE_LIMITED = int(RejectReason.RATE_LIMITED)
_INSUFFICIENT_FUNDS = int(RejectReason.INSUFFICIENT_FUNDS)
_USER_HALTED = int(RejectReason.USER_HALTED)
_TRADING_HALTED = int(RejectReason.TRADING_HALTED)
_NOT_FOUND = int(RejectReason.ORDER_NOT_FOUND)
_NOT_CANCELLABLE = int(RejectReason.ORDER_NOT_CANCELLABLE)
_INVALID_ORDER = int(RejectReason.INVALID_ORDER)
_SESSION_CLOSED = int(RejectReason.SESSION_CLOSED)
_TOO_MANY_SESSIONS = int(RejectReason.TOO_MANY_SESSIONS)
MAX_SESSIONS_PER_USER = 100  # a user's Trade streams with cancel on disconnect, at once


def refused(correlation_id: int, reason: int, retryable: bool = False) -> ShardResult:
    return ShardResult(correlation_id, False, reason, 0, retryable, False, "", 0, False)


def parked(correlation_id: int) -> ShardResult:
    return ShardResult(correlation_id, False, 0, 0, False, False, "", 0, True)


def duplicate_of(correlation_id: int, original: Recent) -> ShardResult:
    """The original answer again: accepted (PENDING, its order id) or its rejection."""
    order_id, reject_reason, _ = original
    if reject_reason:
        return ShardResult(correlation_id, False, reject_reason, 0, False, True, order_id)
    return ShardResult(correlation_id, True, 0, 0, False, True, order_id, PENDING, False)


class OrderSaga:
    def __init__(self, state: ShardState) -> None:
        self.state = state
        settings = state.settings
        self.shard_id = settings.shard_id
        self.horizon_ms = settings.dedup_horizon_ms
        self.max_recent = settings.max_recent_per_user
        self.max_in_flight = settings.max_in_flight_sagas
        self.max_parked_per_user = settings.max_parked_per_user
        self.max_parked_total = settings.max_parked_total

    # --- static checks -------------------------------------------------------------

    def place_problem(self, command: PlaceOrder, now_ms: int) -> int:
        """The reason a place is refused whatever the user's state, or 0."""
        client_order_id = command.client_order_id
        if (
            not client_order_id
            or len(client_order_id) > _MAX_CLIENT_ORDER_ID
            or not client_order_id.isprintable()
        ):
            return _MALFORMED
        symbol = self.state.symbols.get(command.symbol)
        if symbol is None:
            return RejectReason.UNKNOWN_SYMBOL
        side = command.side
        if side != BUY and side != SELL:  # noqa: PLR1714
            return _INVALID_ORDER
        if not 0 <= command.self_trade_prevention <= SelfTradePrevention.CANCEL_BOTH:
            return _INVALID_ORDER
        quantity = command.quantity_lots
        if command.order_type == LIMIT:
            price = command.price_ticks
            if price <= 0:
                return RejectReason.INVALID_PRICE
            if quantity <= 0:
                return RejectReason.INVALID_QUANTITY
            if command.quote_amount:
                return _INVALID_ORDER
            if command.time_in_force == GTD:
                if command.expire_at_ms <= now_ms:
                    return _INVALID_ORDER
            elif command.time_in_force not in _LIMIT_TIME_IN_FORCE or command.expire_at_ms:
                return _INVALID_ORDER
            notional = price * quantity * symbol.tick_size
            if (
                notional + notional * symbol.max_fee_ppm // PPM > INT64_MAX
                or quantity * symbol.lot_size > INT64_MAX
            ):
                return RejectReason.INVALID_QUANTITY
            return 0
        if command.order_type != MARKET:
            return _INVALID_ORDER
        if command.price_ticks:
            return RejectReason.INVALID_PRICE
        if command.time_in_force not in _MARKET_TIME_IN_FORCE or command.expire_at_ms:
            return _INVALID_ORDER
        if side == BUY:
            if quantity:
                return _INVALID_ORDER
            if not 0 < command.quote_amount <= INT64_MAX:
                return RejectReason.INVALID_AMOUNT
            return 0
        if command.quote_amount:
            return _INVALID_ORDER
        if quantity <= 0 or quantity * symbol.lot_size > INT64_MAX:
            return RejectReason.INVALID_QUANTITY
        return 0

    def cancel_problem(self, command: CancelOrder) -> int:
        if not command.order_id and not command.client_order_id:
            return _MALFORMED
        if command.order_id:
            parsed = parse_order_id(command.order_id)
            # Another shard's or another user's order: not found, never "not yours".
            if parsed is None or parsed[0] != self.shard_id or parsed[1] != command.user_id:
                return _NOT_FOUND
        return 0

    # --- place ---------------------------------------------------------------------

    def place(
        self,
        actor: UserActor,
        command: PlaceOrder,
        now_ms: int,
        out: list[Egress],
        dedup_decided: bool = False,
    ) -> None:
        state = self.state
        counters = state.counters
        correlation_id = command.correlation_id
        client_order_id = command.client_order_id
        if actor.health:
            counters.orders_refused += 1
            out.append(refused(correlation_id, _USER_HALTED, actor.health == QUARANTINED))
            return
        if actor.trading_halted:
            counters.orders_refused += 1
            counters.refused_trading_halted += 1
            out.append(refused(correlation_id, _TRADING_HALTED))
            return
        if state.faults:
            self._fault_injection_point(actor, client_order_id)
        dedup = state.dedup
        positions = None
        if not dedup_decided:
            positions = dedup.positions(actor.user_id, client_order_id)
            if not dedup.possibly_seen(positions):
                counters.dedup_never_seen += 1
            elif self._answered_from_memory(actor, command, now_ms, out):
                return  # a duplicate, or parked behind a DB lookup
        if command.session_id and command.session_id not in actor.sessions:
            # Its session expired or ended: nothing would cancel it on a disconnect.
            counters.orders_refused += 1
            out.append(refused(correlation_id, _SESSION_CLOSED))
            return
        if len(state.pending_submits) + len(state.pending_cancels) >= self.max_in_flight:
            counters.refused_backpressure += 1
            out.append(refused(correlation_id, _BACKPRESSURE, True))
            return
        limit = state.rate_limits.get(actor.tier, state.normal_rate_limit)
        bucket = actor.bucket
        tokens = bucket.level(now_ms, limit)
        if tokens < COST_MILLI_TOKENS:
            counters.refused_rate_limited += 1
            out.append(refused(correlation_id, _RATE_LIMITED, True))
            return
        symbol = state.symbols[command.symbol]
        side = command.side
        order_type = command.order_type
        quantity = command.quantity_lots
        if order_type == LIMIT:
            notional = command.price_ticks * quantity * symbol.tick_size
            if side == BUY:
                asset = symbol.quote_asset
                amount = notional + notional * symbol.max_fee_ppm // PPM
            else:
                asset = symbol.base_asset
                amount = quantity * symbol.lot_size
        elif side == BUY:
            notional = amount = command.quote_amount
            asset = symbol.quote_asset
        else:
            notional = 0
            asset = symbol.base_asset
            amount = quantity * symbol.lot_size
        if actor.reduce_only or actor.limits is not NO_LIMITS:
            mark = state.marks.get(command.symbol, 0)
            reason = admission_reason(actor, symbol, command, notional, mark)
            if reason:
                counters.orders_refused += 1
                out.append(refused(correlation_id, reason))
                return
        if actor.balances.get(asset, 0) - actor.reserved.get(asset, 0) < amount:
            counters.orders_refused += 1
            out.append(refused(correlation_id, _INSUFFICIENT_FUNDS))
            return
        # Accepted: from here on nothing can refuse, so state changes begin.
        bucket.spend(tokens, now_ms)
        user_id = actor.user_id
        user_seq = actor.user_seq + 1
        actor.user_seq = user_seq
        order_id = f"{self.shard_id}:{user_id}:{user_seq}"
        matcher_group = symbol.matcher_group
        order = OpenOrder(order_id, command, matcher_group, asset)
        reserve(actor, order_id, asset, amount)
        state.add_order(actor, order)
        if positions is None:
            positions = dedup.positions(user_id, client_order_id)
        dedup.insert(positions)
        remember(
            actor.recent,
            client_order_id,
            (order_id, 0, now_ms),
            now_ms - self.horizon_ms,
            self.max_recent,
        )
        state.touch(actor, now_ms)
        counters.orders_accepted += 1
        out.append(SubmitToMatcher(matcher_group, order_id, command))
        out.append(ShardResult(correlation_id, True, 0, 0, False, False, order_id, PENDING, False))
        out.append(
            OrderUpdate(
                user_id, order_id, client_order_id, command.symbol, PENDING, 0, quantity, 0, 0, 0
            )
        )

    def _answered_from_memory(
        self, actor: UserActor, command: PlaceOrder, now_ms: int, out: list[Egress]
    ) -> bool:
        """ "Possibly seen": answer from the exact map or a live order; else ask the DB.

        Returns False only when the id turns out to be new (seen past the horizon);
        True when the command was answered or parked.
        """
        state = self.state
        counters = state.counters
        client_order_id = command.client_order_id
        original = actor.recent.get(client_order_id)
        if original is None:
            live = actor.open_by_client.get(client_order_id)
            if live is not None:
                original = (live, 0, now_ms)
        if original is not None:
            if within_horizon(original, now_ms, self.horizon_ms):
                counters.dedup_exact_hits += 1
                out.append(duplicate_of(command.correlation_id, original))
                return True
            counters.dedup_past_horizon += 1
            return False
        if state.parked_client_commands >= self.max_parked_total:
            counters.refused_backpressure += 1
            out.append(refused(command.correlation_id, _BACKPRESSURE, True))
            return True
        actor.dedup_wait = DedupWait(client_order_id, now_ms, [command])
        state.parked_client_commands += 1
        state.dedup_waits[actor.user_id] = None
        state.touch(actor, now_ms)  # not flat while parked: an eviction in progress stops
        counters.dedup_lookups_sent += 1
        counters.commands_parked += 1
        out.append(DedupLookup(actor.user_id, client_order_id))
        out.append(parked(command.correlation_id))
        return True

    def _fault_injection_point(self, actor: UserActor, client_order_id: str) -> None:
        """FAULT INJECTION (tests only): fail this place as `ShardSettings.fault_injection` says."""
        mode = self.state.faults.get((actor.user_id, client_order_id))
        if mode is None:
            return
        if mode == FAULT_CORRUPT:
            # Break only the derived reservation sum: money stays conserved, the
            # actor's own invariant check fails, supervision must quarantine it.
            actor.reserved["\x00corrupt"] = 1
        raise InjectedFault(f"injected fault for user {actor.user_id} order {client_order_id}")

    # --- parking behind a DB dedup lookup --------------------------------------------

    def park_behind(
        self, actor: UserActor, command: ClientCommand, now_ms: int, out: list[Egress]
    ) -> None:
        """Keep the user's log order: later client commands wait behind the lookup."""
        wait = actor.dedup_wait
        if wait is None:
            raise RuntimeError("park_behind needs a dedup wait")
        state = self.state
        if mailbox_full(
            command,
            len(wait.parked),
            state.parked_client_commands,
            self.max_parked_per_user,
            self.max_parked_total,
        ):
            state.counters.refused_backpressure += 1
            state.counters.refused_mailbox_full += 1
            out.append(refused(command.correlation_id, _BACKPRESSURE, True))
            return
        wait.parked.append(command)
        state.parked_client_commands += 1
        state.counters.commands_parked += 1
        state.mark_dirty(actor)
        out.append(parked(command.correlation_id))

    def end_dedup_wait(self, actor: UserActor, answer: DedupAnswer) -> list[ClientCommand] | None:
        """Take the parked commands if `answer` is the one this actor waits for."""
        wait = actor.dedup_wait
        if wait is None or wait.client_order_id != answer.client_order_id:
            return None
        state = self.state
        actor.dedup_wait = None
        state.dedup_waits.pop(actor.user_id, None)
        state.parked_client_commands -= len(wait.parked)
        state.mark_dirty(actor)
        return wait.parked

    def resolve_dedup(
        self,
        actor: UserActor,
        command: PlaceOrder,
        answer: DedupAnswer,
        now_ms: int,
        out: list[Egress],
    ) -> None:
        """The DB's exact answer for the parked place: its original result, or a new order."""
        counters = self.state.counters
        original = as_recent(answer.original) if answer.original is not None else None
        if answer.seen and (original is None or within_horizon(original, now_ms, self.horizon_ms)):
            counters.dedup_answers_seen += 1
            if original is None:
                # Seen, but the DB kept no result: never risk a second order.
                out.append(
                    ShardResult(command.correlation_id, True, 0, 0, False, True, "", 0, False)
                )
                return
            remember(
                actor.recent,
                command.client_order_id,
                original,
                now_ms - self.horizon_ms,
                self.max_recent,
            )
            self.state.mark_dirty(actor)
            out.append(duplicate_of(command.correlation_id, original))
            return
        counters.dedup_answers_not_seen += 1
        self.place(actor, command, now_ms, out, dedup_decided=True)

    def redrive_lookups(self, now_ms: int, redrive_after_ms: int, out: list[Egress]) -> None:
        state = self.state
        for user_id in state.dedup_waits:
            wait = state.actors[user_id].dedup_wait
            if wait is not None and now_ms - wait.requested_at_ms >= redrive_after_ms:
                wait.requested_at_ms = now_ms
                state.mark_dirty(state.actors[user_id])
                state.counters.dedup_lookups_redriven += 1
                out.append(DedupLookup(user_id, wait.client_order_id))

    # --- cancel --------------------------------------------------------------------

    def cancel(
        self, actor: UserActor, command: CancelOrder, now_ms: int, out: list[Egress]
    ) -> None:
        state = self.state
        correlation_id = command.correlation_id
        if actor.health:
            out.append(refused(correlation_id, _USER_HALTED, actor.health == QUARANTINED))
            return
        order_id = command.order_id
        if order_id:
            order = actor.orders.get(order_id)
            if (
                order is not None
                and command.client_order_id
                and order.client_order_id != command.client_order_id
            ):
                out.append(refused(correlation_id, _INVALID_ORDER))
                return
        else:
            order_id = actor.open_by_client.get(command.client_order_id, "")
            order = actor.orders.get(order_id) if order_id else None
        if order is None:
            out.append(refused(correlation_id, self._missing_reason(actor, command)))
            return
        if order.cancel_in_flight:
            out.append(
                ShardResult(
                    correlation_id, True, 0, 0, False, True, order.order_id, order.status, False
                )
            )
            return
        order.cancel_in_flight = True
        state.pending_cancels[order.order_id] = actor.user_id
        state.touch(actor, now_ms)
        state.counters.cancels_accepted += 1
        out.append(CancelToMatcher(order.matcher_group, order.order_id, actor.user_id))
        out.append(
            ShardResult(correlation_id, True, 0, 0, False, False, order.order_id, order.status)
        )

    def cancel_all(
        self, actor: UserActor, command: CancelAllOrders, now_ms: int, out: list[Egress]
    ) -> None:
        """Every live order of the user (of `command.symbol`, if set) gets its cancel, as
        `cancel` sends one (`_cancel_live`)."""
        correlation_id = command.correlation_id
        if actor.health:
            out.append(refused(correlation_id, _USER_HALTED, actor.health == QUARANTINED))
            return
        sent, already = self._cancel_live(actor, now_ms, out, symbol=command.symbol)
        out.append(
            ShardResult(correlation_id, True, cancelled_order_ids=sent, already_cancelling=already)
        )

    def cancel_all_after(
        self, actor: UserActor, command: CancelAllAfter, now_ms: int, out: list[Egress]
    ) -> None:
        """Arm (or re-arm) the user's dead man's switch `timeout_ms` from now; 0 disarms.
        The shard's timer entries fire it (`fire_switches`)."""
        correlation_id = command.correlation_id
        if actor.health:
            out.append(refused(correlation_id, _USER_HALTED, actor.health == QUARANTINED))
            return
        state = self.state
        at_ms = now_ms + command.timeout_ms if command.timeout_ms else 0
        actor.cancel_all_at_ms = at_ms
        if at_ms:
            state.switches[actor.user_id] = at_ms
        else:
            state.switches.pop(actor.user_id, None)
        state.touch(actor, now_ms)
        out.append(ShardResult(correlation_id, True, cancel_all_at_ms=at_ms))

    def keep_session(
        self, actor: UserActor, command: KeepSession, now_ms: int, out: list[Egress]
    ) -> None:
        """Open a cancel-on-disconnect session, or keep it alive, `timeout_ms` from now;
        the timer entries end it when it is not kept alive in time (`expire_sessions`)."""
        correlation_id = command.correlation_id
        if actor.health:
            out.append(refused(correlation_id, _USER_HALTED, actor.health == QUARANTINED))
            return
        session_id = command.session_id
        if session_id not in actor.sessions and len(actor.sessions) >= MAX_SESSIONS_PER_USER:
            out.append(refused(correlation_id, _TOO_MANY_SESSIONS))
            return
        expires_ms = now_ms + command.timeout_ms
        actor.sessions[session_id] = expires_ms
        self.state.sessions[(actor.user_id, session_id)] = expires_ms
        self.state.touch(actor, now_ms)
        out.append(ShardResult(correlation_id, True, cancel_all_at_ms=expires_ms))

    def end_session(
        self, actor: UserActor, command: EndSession, now_ms: int, out: list[Egress]
    ) -> None:
        """End a session: its live orders rest on (a clean close) or are cancelled."""
        sent: tuple[str, ...] = ()
        if actor.sessions.pop(command.session_id, None) is not None:
            self.state.sessions.pop((actor.user_id, command.session_id), None)
            self.state.touch(actor, now_ms)
            if command.cancel_orders:
                sent, _ = self._cancel_live(actor, now_ms, out, session_id=command.session_id)
        out.append(ShardResult(command.correlation_id, True, cancelled_order_ids=sent))

    def expire_sessions(self, now_ms: int, out: list[Egress]) -> None:
        """Each session not kept alive in time ends and cancels its live orders, earliest
        first (ties by user, then session): the same order on every replica."""
        state = self.state
        due = sorted(
            (expires_ms, key) for key, expires_ms in state.sessions.items() if expires_ms <= now_ms
        )
        for _, key in due:
            del state.sessions[key]
            user_id, session_id = key
            actor = state.actors[user_id]
            del actor.sessions[session_id]
            state.mark_dirty(actor)
            self._cancel_live(actor, now_ms, out, session_id=session_id)

    def fire_switches(self, now_ms: int, out: list[Egress]) -> None:
        """Each dead man's switch whose time has come cancels its user's live orders and
        disarms, earliest first (ties by user id): the same order on every replica."""
        state = self.state
        due = sorted(
            (at_ms, user_id) for user_id, at_ms in state.switches.items() if at_ms <= now_ms
        )
        for _, user_id in due:
            del state.switches[user_id]
            actor = state.actors[user_id]
            actor.cancel_all_at_ms = 0
            state.mark_dirty(actor)
            self._cancel_live(actor, now_ms, out)

    def _cancel_live(
        self,
        actor: UserActor,
        now_ms: int,
        out: list[Egress],
        *,
        symbol: str = "",
        session_id: int = 0,
    ) -> tuple[tuple[str, ...], int]:
        """Send a cancel for each live order (of `symbol`, or placed on `session_id`, if
        set) without one in flight, in the order they were placed (their user sequence:
        the same on every replica, whatever order a snapshot restored them in). The
        orders sent for, and how many already had a cancel in flight."""
        state = self.state
        chosen = sorted(
            (
                order
                for order in actor.orders.values()
                if (not symbol or order.symbol == symbol)
                and (not session_id or order.request.session_id == session_id)
            ),
            key=_user_seq,
        )
        sent: list[str] = []
        already = 0
        for order in chosen:
            if order.cancel_in_flight:
                already += 1
                continue
            order.cancel_in_flight = True
            state.pending_cancels[order.order_id] = actor.user_id
            state.counters.cancels_accepted += 1
            out.append(CancelToMatcher(order.matcher_group, order.order_id, actor.user_id))
            sent.append(order.order_id)
        if sent:
            state.touch(actor, now_ms)
        return tuple(sent), already

    def _missing_reason(self, actor: UserActor, command: CancelOrder) -> int:
        """NOT_CANCELLABLE for an order that existed and ended, else NOT_FOUND."""
        if command.order_id:
            parsed = parse_order_id(command.order_id)
            if parsed is not None and 0 < parsed[2] <= actor.user_seq:
                return _NOT_CANCELLABLE
            return _NOT_FOUND
        if command.client_order_id in actor.recent:
            return _NOT_CANCELLABLE
        return _NOT_FOUND


def _user_seq(order: OpenOrder) -> int:
    parsed = parse_order_id(order.order_id)
    assert parsed is not None  # the shard made it
    return parsed[2]
