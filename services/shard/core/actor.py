"""A hot user actor: one user's account, orders, sagas, risk and session state.

The actor is a write-back cache over the system of record: hydrated from a
`UserState`, dehydrated back to one when it is flat and idle. Its lifecycle is
a literal table:

    (parked) --HydrateUser--> RESIDENT --sweep/valve--> DEHYDRATING
    DEHYDRATING --activity or FlushRefused--> RESIDENT
    DEHYDRATING --FlushComplete(same epoch)--> EVICTED

"Parked" users are not actors yet: their commands wait in `Hydration`.
Health is a second, independent table (supervision):

    HEALTHY --failure, own invariant broken--> QUARANTINED
    HEALTHY | QUARANTINED --N failures in the window--> HALTED

Health only ever leaves QUARANTINED or HALTED with the actor itself: it is flushed
(the sweep does it for a quarantined actor once flat and consistent again; an
operator's restart, `operator_controls.py`, for any flat one) and its next
hydration builds a new, HEALTHY actor from PostgreSQL.

Mutations of an actor go through the shard, which marks it dirty for the
incremental state hash; the actor itself only holds data.
"""

from __future__ import annotations

from services.shard.core.commands import ClientCommand
from services.shard.core.dedup import Recent
from services.shard.core.errors import (
    ActorLifecycleError,
    NegativeBalanceError,
    OrderIndexError,
    ReservationError,
)
from services.shard.core.orders import LIVE, OpenOrder
from services.shard.core.positions import Position
from services.shard.core.rate_limit import TokenBucket
from services.shard.core.risk import NO_LIMITS, RiskLimits
from services.shard.core.vocabulary import PENDING


class Reservation:
    __slots__ = ("amount", "asset")

    def __init__(self, asset: str, amount: int) -> None:
        self.asset = asset
        self.amount = amount


RESIDENT = 1
DEHYDRATING = 2
EVICTED = 3

LIFECYCLE_TRANSITIONS: dict[int, tuple[int, ...]] = {
    RESIDENT: (DEHYDRATING,),
    DEHYDRATING: (RESIDENT, EVICTED),
    EVICTED: (),
}
LIFECYCLE_NAMES = {RESIDENT: "RESIDENT", DEHYDRATING: "DEHYDRATING", EVICTED: "EVICTED"}

HEALTHY = 0
QUARANTINED = 1
HALTED = 2

HEALTH_TRANSITIONS: dict[int, tuple[int, ...]] = {
    HEALTHY: (QUARANTINED, HALTED),
    QUARANTINED: (HALTED,),
    HALTED: (),
}


class DedupWait:
    """A place waiting for the DB's exact dedup answer, and the user's commands behind it."""

    __slots__ = ("client_order_id", "parked", "requested_at_ms")

    def __init__(
        self, client_order_id: str, requested_at_ms: int, parked: list[ClientCommand]
    ) -> None:
        self.client_order_id = client_order_id
        self.requested_at_ms = requested_at_ms
        self.parked = parked  # client commands, in log order; the first is the place


class UserActor:
    __slots__ = (
        "balances",
        "bucket",
        "cancel_all_at_ms",
        "control_version",
        "db_version",
        "dedup_wait",
        "digest",
        "dirty",
        "epoch",
        "event_sequences",
        "failures",
        "health",
        "last_active_ms",
        "last_control_id",
        "lifecycle",
        "limits",
        "open_by_client",
        "orders",
        "peak_equity",
        "positions",
        "recency_seq",
        "recent",
        "reduce_only",
        "reservations",
        "reserved",
        "sessions",
        "tier",
        "trading_halted",
        "transfers",
        "user_id",
        "user_seq",
    )

    def __init__(self, user_id: int, epoch: int, now_ms: int, bucket: TokenBucket) -> None:
        self.user_id = user_id
        self.epoch = epoch  # fencing epoch of hydrate/flush
        self.db_version = 0  # CAS version of the user's row
        self.user_seq = 0  # last order sequence used: order ids continue after it
        self.tier = 0
        self.lifecycle = RESIDENT
        self.health = HEALTHY
        self.balances: dict[str, int] = {}  # asset -> total
        self.reserved: dict[str, int] = {}  # asset -> sum of reservations (derived)
        self.reservations: dict[str, Reservation] = {}  # order id -> reservation
        self.orders: dict[str, OpenOrder] = {}  # open-orders index, sagas included
        self.open_by_client: dict[str, str] = {}  # client order id -> order id (live)
        self.positions: dict[str, Position] = {}
        # Exact dedup maps, oldest first: client order id / transfer id -> Recent.
        self.recent: dict[str, Recent] = {}
        self.transfers: dict[str, Recent] = {}
        self.limits: RiskLimits = NO_LIMITS
        self.reduce_only = False
        self.peak_equity = 0
        self.trading_halted = False  # an operator's halt (UserControl), kept in UserState
        self.control_version = 0  # operator controls accepted (operator_controls.py)
        self.last_control_id = ""  # the request id of the last of them
        self.bucket = bucket
        self.last_active_ms = now_ms
        self.recency_seq = 0
        self.failures: list[int] = []  # consensus times of recent supervised failures
        self.dedup_wait: DedupWait | None = None
        # Matcher group -> sequence of the last event of this user's orders applied: a
        # reconcile report as-of an earlier sequence no longer describes this user.
        self.event_sequences: dict[str, int] = {}
        # A dead man's switch armed (`CancelAllAfter`, version 3): at this consensus time
        # every live order is cancelled unless it is armed again or disarmed (0: none).
        self.cancel_all_at_ms = 0
        # Cancel-on-disconnect sessions open (`KeepSession`, version 3): id -> the
        # consensus time at which it expires and its orders are cancelled.
        self.sessions: dict[int, int] = {}
        self.digest = 0  # this actor's term in the shard's set-hash
        self.dirty = False

    def is_flat(self) -> bool:
        """No resting order, no saga in flight, no reservation, nothing parked, no dead
        man's switch armed and no session open (their timers run in this shard only)."""
        return (
            not self.orders
            and not self.reservations
            and self.dedup_wait is None
            and not self.cancel_all_at_ms
            and not self.sessions
        )

    def move_to(self, lifecycle: int) -> None:
        if lifecycle not in LIFECYCLE_TRANSITIONS[self.lifecycle]:
            raise ActorLifecycleError(
                f"user {self.user_id}: {LIFECYCLE_NAMES[self.lifecycle]} -> "
                f"{LIFECYCLE_NAMES.get(lifecycle, lifecycle)} is not a lifecycle move"
            )
        self.lifecycle = lifecycle

    def change_health(self, health: int) -> None:
        if health not in HEALTH_TRANSITIONS[self.health]:
            raise ActorLifecycleError(f"user {self.user_id}: health {self.health} -> {health}")
        self.health = health


def check_actor(
    actor: UserActor, pending_submits: dict[str, int], pending_cancels: dict[str, int]
) -> None:
    """Raise the specific invariant error if this actor's own state is inconsistent."""
    user = actor.user_id
    check_balances(actor)
    sums: dict[str, int] = {}
    for order_id, reservation in actor.reservations.items():
        order = actor.orders.get(order_id)
        if order is None:
            raise ReservationError(f"user {user}: reservation for {order_id} has no live order")
        if reservation.amount < 0 or reservation.asset != order.reserve_asset:
            raise ReservationError(f"user {user}: reservation of {order_id} is malformed")
        sums[reservation.asset] = sums.get(reservation.asset, 0) + reservation.amount
    for asset in {**sums, **actor.reserved}:
        if sums.get(asset, 0) != actor.reserved.get(asset, 0):
            raise ReservationError(
                f"user {user}: {asset} reservations sum to {sums.get(asset, 0)}, "
                f"cached {actor.reserved.get(asset, 0)}"
            )
        if sums.get(asset, 0) > actor.balances.get(asset, 0):
            raise ReservationError(f"user {user}: {asset} reserved above the total")
    if len(actor.open_by_client) != len(actor.orders):
        raise OrderIndexError(f"user {user}: client-id map and open orders differ in size")
    for order_id, order in actor.orders.items():
        if order.order_id != order_id or order.status not in LIVE:
            raise OrderIndexError(f"user {user}: order {order_id} is not a live order")
        if actor.open_by_client.get(order.client_order_id) != order_id:
            raise OrderIndexError(f"user {user}: {order_id} missing from the client-id map")
        if (order.status == PENDING) != (pending_submits.get(order_id) == user):
            raise OrderIndexError(f"user {user}: {order_id} and the saga registry disagree")
        if order.cancel_in_flight != (pending_cancels.get(order_id) == user):
            raise OrderIndexError(f"user {user}: {order_id} and the cancel registry disagree")
    if actor.lifecycle == DEHYDRATING and not actor.is_flat():
        raise ActorLifecycleError(f"user {user} is dehydrating but not flat")


def check_balances(actor: UserActor) -> None:
    for asset, total in actor.balances.items():
        if total < 0:
            raise NegativeBalanceError(f"user {actor.user_id}: {asset} total {total} < 0")
