"""Clients of the API: users who fund themselves, trade, cancel (one order, or all of a
symbol's or all of their orders at once) and withdraw, and retry the way the API tells
them.

Each request is the API's own message (`PlaceOrderRequest`, `CancelOrderRequest`,
`CancelAllOrdersRequest`, `TransferRequest`) handed to the simulated gateway
(`gateway_model.py`), and each answer the gateway's ack or refusal. One request per
user at a time. A request unanswered within the client's deadline is sent again
(under the same client order id or transfer id; a cancel-all as it was); a retryable
refusal (rate limit, backpressure, halted, not the owner, the gateway UNAVAILABLE) is
sent again a little later; any other refusal is final. What a client was told is what
the mesh is held to: an order acknowledged under a client order id must be there,
once, under that id (the audit); a cancel-all accepted lists only the client's own
orders, and is never refused MALFORMED (every shard group runs the version that
decides it); after settling, every order whose cancel was accepted (by `CancelOrder`,
or listed by `CancelAllOrders`) is CANCELLED or FILLED in the database (or REJECTED:
the matcher refused the order itself while it was PENDING; it never rested). That a
cancel-all covered exactly the user's live orders at its log position is judged on
the shard's egress (`cancel_all_check.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from auditor.core.rows import AcknowledgedOrder, AcknowledgedTransfer
from gateway.core.refusals import GatewayError
from protos.oms.v1 import gateway_pb2
from services.shard.core.vocabulary import (
    BUY,
    CANCELLED,
    FILLED,
    LIMIT,
    MARKET,
    PPM,
    REJECTED,
    RETRYABLE_REASONS,
    SELL,
    RejectReason,
    TimeInForce,
)
from simulation.core.cancel_all_check import CANCEL_ALL as CANCEL_ALL_VIOLATION
from simulation.core.cancel_all_check import CANCEL_OUTCOME
from simulation.core.gateway_model import (
    CANCEL,
    CANCEL_ALL,
    DEPOSIT,
    PLACE,
    refusal_is_retryable,
)

GTC = int(TimeInForce.GTC)
IOC = int(TimeInForce.IOC)

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

DEADLINE_MS = 2_000
RETRY_PAUSE_MS = 50
THINK_MS = (1, 40)
FUNDING = 10**12
_RETRY_REASONS = frozenset((*RETRYABLE_REASONS, int(RejectReason.NOT_OWNER)))
_MALFORMED = int(RejectReason.MALFORMED)
UNKNOWN_SYMBOL = "NOPE-USD"


@dataclass(slots=True)
class Request:
    kind: str  # place, cancel, cancel-all, deposit, withdraw
    user_id: int
    key: str  # client order id, transfer id, the order id cancelled, or a cancel-all's symbol
    message: Any  # the API's request, the same on every attempt
    first_sent_ms: int = 0
    attempts: int = 0
    waiting: bool = False  # an attempt is out, its answer not yet in
    timed_out: bool = False
    amount: tuple[str, int] = ("", 0)  # a transfer's asset and signed amount
    refusal_expected: int = 0  # a malformed request: the gateway's reason for refusing it


@dataclass(slots=True)
class ClientFigures:
    ok: int = 0
    refused: int = 0
    timed_out_then_answered: int = 0  # outcome unknown to the client, then learnt by retry
    answered_as_duplicate: int = 0
    attempts: int = 0
    malformed_refused: int = 0  # malformed requests the gateway refused, each checked
    cancel_alls: int = 0  # cancel-alls answered accepted
    cancel_alls_listing: int = 0  # ... that listed at least one order
    waits_ms: list[int] = field(default_factory=list)


class SimClients:
    def __init__(self, world: SimWorld, users: tuple[int, ...]) -> None:
        self.world = world
        self.users = users
        self.settling = False
        self.outstanding: dict[int, Request] = {}  # user -> its request
        self.funded: dict[int, int] = dict.fromkeys(users, 0)  # deposits acknowledged
        self.next_id: dict[int, int] = dict.fromkeys(users, 0)
        self.orders: dict[tuple[int, str], str] = {}  # (user, client order id) -> order id
        self.transfers: dict[tuple[int, str], tuple[str, int]] = {}
        self.cancelled: dict[str, int] = {}  # order id -> user: its cancel accepted
        self.figures = ClientFigures()
        for user in users:
            self._think(user)

    # --- what was acknowledged ---------------------------------------------------------

    def acknowledged_orders(self) -> list[AcknowledgedOrder]:
        return [AcknowledgedOrder(o, u, c) for (u, c), o in sorted(self.orders.items())]

    def acknowledged_transfers(self) -> list[AcknowledgedTransfer]:
        return [
            AcknowledgedTransfer(user, transfer, asset, amount)
            for (user, transfer), (asset, amount) in sorted(self.transfers.items())
        ]

    # --- choosing what to do -----------------------------------------------------------

    def _think(self, user: int) -> None:
        self.world.scheduler.after(
            self.world.rng.randrange(*THINK_MS), f"client {user}", lambda: self._act(user)
        )

    def _new_key(self, user: int, prefix: str) -> str:
        self.next_id[user] += 1
        return f"{prefix}{user}-{self.next_id[user]}"

    def _act(self, user: int) -> None:
        if self.settling or user in self.outstanding:
            return
        world = self.world
        rng = world.rng
        assets = world.assets
        if self.funded[user] < len(assets):
            asset = assets[self.funded[user]]
            self.submit(self._transfer(user, "deposit", asset, FUNDING))
            return
        roll = rng.randrange(100)
        if roll < 2:
            self.submit(self._malformed(user))
        elif roll < 65:
            self.submit(self._place(user))
        elif roll < 82:
            mine = [(c, o) for (u, c), o in self.orders.items() if u == user]
            if mine:
                _, order_id = mine[-1 - rng.randrange(min(len(mine), 8))]
                self.submit(self.cancel(user, order_id))
            else:
                self.submit(self._place(user))
        elif roll < 85:
            self.submit(self._cancel_all(user))
        elif roll < 93:
            asset = assets[rng.randrange(len(assets))]
            self.submit(self._transfer(user, "deposit", asset, rng.randrange(1, 10**9)))
        else:
            asset = assets[rng.randrange(len(assets))]
            self.submit(self._transfer(user, "withdraw", asset, rng.randrange(1, 10**9)))

    def _place(self, user: int) -> Request:
        world = self.world
        rng = world.rng
        market = world.markets[rng.randrange(len(world.markets))]
        side = BUY if rng.randrange(2) else SELL
        lots = rng.randrange(1, 6)
        reference = market.reference_price_ticks
        price = reference + rng.randrange(-reference // 100, reference // 100 + 1)
        client_id = self._new_key(user, "c")
        # Unspecified, GTC or IOC: a limit without one is GTC.
        time_in_force = (0, GTC, IOC)[rng.randrange(3)]
        if rng.randrange(10) == 0:
            order_type, price_ticks, time_in_force = MARKET, 0, time_in_force and IOC
            quote = price * market.tick_size * lots * (PPM + market.taker_fee_ppm) // PPM
            quantity, quote = (0, quote) if side == BUY else (lots, 0)
        else:
            order_type, price_ticks, quantity, quote = LIMIT, price, lots, 0
        message = gateway_pb2.PlaceOrderRequest(
            user_id=user,
            client_order_id=client_id,
            symbol=market.symbol,
            side=side,  # type: ignore[arg-type]
            order_type=order_type,  # type: ignore[arg-type]
            time_in_force=time_in_force,  # type: ignore[arg-type]
            price_ticks=price_ticks,
            quantity_lots=quantity,
            quote_amount=quote,
        )
        return Request(PLACE, user, client_id, message)

    def _malformed(self, user: int) -> Request:
        """An order the gateway must refuse with its reason, sending nothing on."""
        request = self._place(user)
        message = request.message
        flaw = self.world.rng.randrange(3)
        if flaw == 0:
            message.quantity_lots, message.quote_amount = 0, 0
            message.order_type = LIMIT
            request.refusal_expected = gateway_pb2.GATEWAY_ERROR_REASON_OUT_OF_RANGE
        elif flaw == 1:
            message.symbol = UNKNOWN_SYMBOL
            request.refusal_expected = gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL
        else:
            message.client_order_id = "not printable \x7f"
            request.refusal_expected = gateway_pb2.GATEWAY_ERROR_REASON_INVALID_FIELD
        return request

    def cancel(self, user: int, order_id: str) -> Request:
        message = gateway_pb2.CancelOrderRequest(user_id=user, order_id=order_id)
        return Request(CANCEL, user, order_id, message)

    def _cancel_all(self, user: int) -> Request:
        """Every symbol's orders, or one symbol's; now and then a symbol not traded
        here, which the gateway refuses UNKNOWN_SYMBOL, sending nothing on."""
        world = self.world
        which = world.rng.randrange(20)
        if which == 0:
            symbol = UNKNOWN_SYMBOL
        elif which < 10:
            symbol = ""
        else:
            symbol = world.markets[world.rng.randrange(len(world.markets))].symbol
        message = gateway_pb2.CancelAllOrdersRequest(user_id=user, symbol=symbol)
        request = Request(CANCEL_ALL, user, symbol or "*", message)
        if which == 0:
            request.refusal_expected = gateway_pb2.GATEWAY_ERROR_REASON_UNKNOWN_SYMBOL
        return request

    def _transfer(self, user: int, kind: str, asset: str, amount: int) -> Request:
        transfer_id = self._new_key(user, "t")
        signed = amount if kind == DEPOSIT else -amount
        message = gateway_pb2.TransferRequest(
            user_id=user, asset=asset, amount=amount, transfer_id=transfer_id
        )
        return Request(kind, user, transfer_id, message, amount=(asset, signed))

    # --- sending and answers -----------------------------------------------------------

    def submit(self, request: Request) -> None:
        request.first_sent_ms = self.world.scheduler.now_ms
        self.outstanding[request.user_id] = request
        self._send(request)

    def _send(self, request: Request) -> None:
        world = self.world
        request.attempts += 1
        request.waiting = True
        attempt = request.attempts
        self.figures.attempts += 1
        world.gateway.call(
            request.kind, request.message, lambda answer: self._answered(request, attempt, answer)
        )
        world.scheduler.after(
            DEADLINE_MS, f"deadline {request.key}", lambda: self._deadline(request, attempt)
        )

    def _current(self, request: Request, attempt: int) -> bool:
        """Whether `attempt` is the request's latest, still waiting for its answer."""
        return (
            self.outstanding.get(request.user_id) is request
            and request.attempts == attempt
            and request.waiting
        )

    def _deadline(self, request: Request, attempt: int) -> None:
        if not self._current(request, attempt):
            return
        request.timed_out = True
        self._send(request)

    def _answered(self, request: Request, attempt: int, answer: Any) -> None:
        if not self._current(request, attempt):
            return  # an answer to an attempt given up
        request.waiting = False
        if isinstance(answer, GatewayError):
            retry = refusal_is_retryable(answer)
        else:
            retry = not answer.accepted and (
                answer.reject_reason in _RETRY_REASONS or getattr(answer, "retryable", False)
            )
        if retry:
            self.world.scheduler.after(RETRY_PAUSE_MS, "client retry", lambda: self._send(request))
            return
        self._finish(request, answer)

    def _finish(self, request: Request, answer: Any) -> None:
        """The final answer: an ack, or the gateway's refusal (`GatewayError`)."""
        world = self.world
        figures = self.figures
        del self.outstanding[request.user_id]
        figures.waits_ms.append(world.scheduler.now_ms - request.first_sent_ms)
        figures.timed_out_then_answered += request.timed_out
        refused = isinstance(answer, GatewayError) or not answer.accepted
        figures.answered_as_duplicate += not refused and getattr(answer, "duplicate", False)
        user = request.user_id
        if request.refusal_expected:
            figures.malformed_refused += 1
            reason = answer.reason if isinstance(answer, GatewayError) else None
            if reason != request.refusal_expected:
                expected = gateway_pb2.GatewayErrorReason.Name(request.refusal_expected)  # type: ignore[arg-type]
                world.violation(
                    "gateway-check",
                    f"user {user} {request.key!r}: expected refusal {expected}, got {answer}",
                )
        if not refused:
            result = answer
            figures.ok += 1
            if request.kind == "place":
                key = (user, request.key)
                earlier = self.orders.setdefault(key, result.order_id)
                if earlier != result.order_id:
                    world.violation(
                        "client-order-twice",
                        f"user {user} {request.key!r} acknowledged as {earlier} and "
                        f"{result.order_id}",
                    )
            elif request.kind == CANCEL:
                self.cancelled[result.order_id] = user
            elif request.kind == CANCEL_ALL:
                self._cancel_all_accepted(request, result)
            elif request.kind in ("deposit", "withdraw"):
                self.transfers[(user, request.key)] = request.amount
                if request.kind == "deposit" and self.funded[user] < len(world.assets):
                    self.funded[user] += 1
        else:
            figures.refused += 1
            if request.kind == CANCEL_ALL and getattr(answer, "reject_reason", 0) == _MALFORMED:
                world.violation(
                    CANCEL_ALL_VIOLATION,
                    f"user {user}'s cancel-all of {request.key} refused MALFORMED: its shard"
                    " group does not decide it (state-machine version below 3)",
                )
        if not self.settling:
            self._think(user)

    def _cancel_all_accepted(self, request: Request, ack: gateway_pb2.CancelAllAck) -> None:
        """What the client can tell from the ack alone: it lists only the client's own
        orders (their ids name the user: `shard:user:sequence`), each once; they are
        cancelled (checked after settling). Not only acknowledged ones: a place whose
        first attempt was decided unanswered, then refused final on a retry (an
        operator's halt comes first), is the user's order all the same."""
        user = request.user_id
        self.figures.cancel_alls += 1
        listed = list(ack.cancelled_order_ids)
        self.figures.cancel_alls_listing += bool(listed)
        strangers = [o for o in listed if o.split(":")[1:2] != [str(user)]]
        if strangers or len(set(listed)) != len(listed):
            self.world.violation(
                CANCEL_ALL_VIOLATION,
                f"user {user}'s cancel-all of {request.key} lists {listed[:4]}: others'"
                f" orders {strangers[:4]}, or one twice",
            )
        for order_id in listed:
            self.cancelled[order_id] = user

    def check_cancelled(self) -> None:
        """After settling: every order whose cancel was accepted ended CANCELLED, or
        FILLED (a fill got there first), as the database answers `GetOrder`; or
        REJECTED, the matcher's refusal of the order itself, which never rested (that it
        was PENDING then is checked on the egress, `cancel_all_check.py`)."""
        world = self.world
        orders = world.store.orders
        for order_id, user in sorted(self.cancelled.items()):
            row = orders.get(order_id)
            world.figures["cancelled_orders_checked"] += 1
            if row is None or row.status not in (FILLED, CANCELLED, REJECTED):
                status = "no row" if row is None else f"status {row.status}"
                world.violation(
                    CANCEL_OUTCOME, f"user {user}'s order {order_id}, its cancel accepted: {status}"
                )
                return
