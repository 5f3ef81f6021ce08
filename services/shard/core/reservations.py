"""Funds set aside for one order: `available = total - sum(reservations)`.

A reservation is keyed by order id and belongs to exactly one live order (a
saga in flight or an order resting at the matcher). Fills consume it, an end
of the order releases what is left. The per-asset sum is cached on the actor
(`reserved`) so `available` is O(1); `check_actor` proves the cache.
"""

from __future__ import annotations

from services.shard.core.actor import Reservation, UserActor
from services.shard.core.errors import ReservationError


def available(actor: UserActor, asset: str) -> int:
    return actor.balances.get(asset, 0) - actor.reserved.get(asset, 0)


def reserve(actor: UserActor, order_id: str, asset: str, amount: int) -> None:
    """Set `amount` aside for `order_id`. The caller has checked availability."""
    if order_id in actor.reservations:
        raise ReservationError(f"order {order_id} already holds a reservation")
    actor.reservations[order_id] = Reservation(asset, amount)
    reserved = actor.reserved
    reserved[asset] = reserved.get(asset, 0) + amount


def consume(actor: UserActor, order_id: str, amount: int) -> int:
    """Use up to `amount` of the order's reservation; return how much it covered."""
    reservation = actor.reservations.get(order_id)
    if reservation is None:
        return 0
    used = amount if amount < reservation.amount else reservation.amount
    reservation.amount -= used
    actor.reserved[reservation.asset] -= used
    return used


def release(actor: UserActor, order_id: str) -> tuple[str, int]:
    """Drop the order's reservation; return (asset, amount that became available)."""
    reservation = actor.reservations.pop(order_id, None)
    if reservation is None:
        return "", 0
    asset = reservation.asset
    reserved = actor.reserved
    left = reserved[asset] - reservation.amount
    if left:
        reserved[asset] = left
    else:
        del reserved[asset]
    return asset, reservation.amount
