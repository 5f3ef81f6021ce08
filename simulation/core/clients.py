"""Clients of the API: users who fund themselves, trade, cancel and withdraw, and retry
the way the API tells them.

One request per user at a time. A request unanswered within the gateway's deadline
is sent again under the same client order id (or transfer id) with a new
correlation id; a parked answer means wait for the final one; a retryable refusal
(rate limit, backpressure, halted, not the owner) is sent again a little later; any
other refusal is final. What a client was told is what the audit holds the mesh to:
an order acknowledged under a client order id must be there, once, under that id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from auditor.core.rows import AcknowledgedOrder, AcknowledgedTransfer
from services.shard.core.commands import CancelOrder, Command, Deposit, PlaceOrder, Withdraw
from services.shard.core.egress import ShardResult
from services.shard.core.vocabulary import (
    BUY,
    LIMIT,
    MARKET,
    PPM,
    RETRYABLE_REASONS,
    SELL,
    RejectReason,
    TimeInForce,
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


@dataclass(slots=True)
class Request:
    kind: str  # place, cancel, deposit, withdraw
    user_id: int
    key: str  # client order id, transfer id, or the order id cancelled
    build: Callable[[int], Command]  # correlation id -> the command
    first_sent_ms: int = 0
    attempts: int = 0
    correlation_id: int = 0
    timed_out: bool = False
    amount: tuple[str, int] = ("", 0)  # a transfer's asset and signed amount


@dataclass(slots=True)
class ClientFigures:
    ok: int = 0
    refused: int = 0
    timed_out_then_answered: int = 0  # outcome unknown to the client, then learnt by retry
    answered_as_duplicate: int = 0
    attempts: int = 0
    waits_ms: list[int] = field(default_factory=list)


class SimClients:
    def __init__(self, world: SimWorld, users: tuple[int, ...]) -> None:
        self.world = world
        self.users = users
        self.settling = False
        self.outstanding: dict[int, Request] = {}  # user -> its request
        self.by_correlation: dict[int, Request] = {}
        self.funded: dict[int, int] = dict.fromkeys(users, 0)  # deposits acknowledged
        self.next_id: dict[int, int] = dict.fromkeys(users, 0)
        self.orders: dict[tuple[int, str], str] = {}  # (user, client order id) -> order id
        self.transfers: dict[tuple[int, str], tuple[str, int]] = {}
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
        if roll < 65:
            self.submit(self._place(user))
        elif roll < 85:
            mine = [(c, o) for (u, c), o in self.orders.items() if u == user]
            if mine:
                _, order_id = mine[-1 - rng.randrange(min(len(mine), 8))]
                self.submit(self.cancel(user, order_id))
            else:
                self.submit(self._place(user))
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
        symbol = market.symbol

        def build(correlation: int) -> Command:
            return PlaceOrder(
                correlation,
                user,
                client_id,
                symbol,
                side,
                order_type,
                time_in_force,
                price_ticks,
                quantity,
                quote,
                0,
                0,
                0,
            )

        return Request("place", user, client_id, build)

    def cancel(self, user: int, order_id: str) -> Request:
        def build(correlation: int) -> Command:
            return CancelOrder(correlation, user, order_id, "", 0)

        return Request("cancel", user, order_id, build)

    def _transfer(self, user: int, kind: str, asset: str, amount: int) -> Request:
        transfer_id = self._new_key(user, "t")
        command = Deposit if kind == "deposit" else Withdraw
        signed = amount if kind == "deposit" else -amount

        def build(correlation: int) -> Command:
            return command(correlation, user, asset, amount, transfer_id)

        return Request(kind, user, transfer_id, build, amount=(asset, signed))

    # --- sending and answers -----------------------------------------------------------

    def submit(self, request: Request) -> None:
        request.first_sent_ms = self.world.scheduler.now_ms
        self.outstanding[request.user_id] = request
        self._send(request)

    def _send(self, request: Request) -> None:
        world = self.world
        correlation = world.new_correlation()
        request.correlation_id = correlation
        request.attempts += 1
        self.figures.attempts += 1
        if not world.send_to_shard(request.user_id, request.build(correlation)):
            request.correlation_id = 0
            world.scheduler.after(RETRY_PAUSE_MS, "client retry", lambda: self._send(request))
            return
        self.by_correlation[correlation] = request
        world.scheduler.after(
            DEADLINE_MS, f"deadline {correlation}", lambda: self._deadline(request, correlation)
        )

    def _deadline(self, request: Request, correlation: int) -> None:
        if self.outstanding.get(request.user_id) is not request:
            return
        if request.correlation_id != correlation:
            return
        request.timed_out = True
        self.by_correlation.pop(correlation, None)
        self._send(request)

    def on_result(self, result: ShardResult) -> None:
        request = self.by_correlation.get(result.correlation_id)
        if request is None or self.outstanding.get(request.user_id) is not request:
            return  # a duplicate answer, or one to an attempt given up
        if result.parked:
            return  # the final answer follows; the deadline still runs
        del self.by_correlation[result.correlation_id]
        if not result.accepted and result.reject_reason in _RETRY_REASONS:
            request.correlation_id = 0
            self.world.scheduler.after(RETRY_PAUSE_MS, "client retry", lambda: self._send(request))
            return
        self._finish(request, result)

    def _finish(self, request: Request, result: ShardResult) -> None:
        world = self.world
        figures = self.figures
        del self.outstanding[request.user_id]
        figures.waits_ms.append(world.scheduler.now_ms - request.first_sent_ms)
        figures.timed_out_then_answered += request.timed_out
        figures.answered_as_duplicate += result.duplicate
        user = request.user_id
        if result.accepted:
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
            elif request.kind in ("deposit", "withdraw"):
                self.transfers[(user, request.key)] = request.amount
                if request.kind == "deposit" and self.funded[user] < len(world.assets):
                    self.funded[user] += 1
        else:
            figures.refused += 1
        if not self.settling:
            self._think(user)
