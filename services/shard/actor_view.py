"""What operators see of one user actor (`GetActor`): read-only, never mutating."""

from __future__ import annotations

from protos.oms.v1 import shard_pb2
from services.shard.core.actor import DEHYDRATING, HALTED, QUARANTINED, UserActor
from services.shard.core.codec import fill_user_state
from services.shard.core.hydration import user_state_of
from services.shard.core.shard_machine import ShardMachine


def actor_view(
    machine: ShardMachine, user_id: int, *, orders_only: bool = False
) -> shard_pb2.ActorView:
    actor = machine.actor(user_id)
    if actor is None:
        return shard_pb2.ActorView(resident=False)
    view = shard_pb2.ActorView(
        resident=True,
        epoch=actor.epoch,
        dehydrating=actor.lifecycle == DEHYDRATING,
        halted=actor.health == HALTED,
        quarantined=actor.health == QUARANTINED,
        last_active_ms=actor.last_active_ms,
    )
    if not orders_only:
        _fill_state(view, machine, actor)
    for order_id, order in actor.orders.items():
        request = order.request
        reservation = actor.reservations.get(order_id)
        view.open_orders.add(
            order_id=order_id,
            client_order_id=request.client_order_id,
            symbol=request.symbol,
            side=request.side,
            order_type=request.order_type,
            price_ticks=request.price_ticks,
            quantity_lots=request.quantity_lots,
            time_in_force=request.time_in_force,
            quote_amount=request.quote_amount,
            remaining_lots=order.remaining_lots,
            filled_lots=order.filled_lots,
            status=order.status,
            cancel_in_flight=order.cancel_in_flight,
            reserved=reservation.amount if reservation else 0,
            reserved_asset=reservation.asset if reservation else "",
        )
    return view


def _fill_state(view: shard_pb2.ActorView, machine: ShardMachine, actor: UserActor) -> None:
    """Balances (with what is reserved), marks and unrealized P&L."""
    state = machine.state
    fill_user_state(
        view.state, user_state_of(actor, state.now_ms, machine.settings.dedup_horizon_ms)
    )
    for balance in view.state.balances:
        balance.reserved = actor.reserved.get(balance.asset, 0)
    unrealized = 0
    for symbol, position in actor.positions.items():
        mark = state.marks.get(symbol)
        settings = state.symbols.get(symbol)
        if mark is not None and settings is not None:
            unrealized += position.unrealized_pnl(mark, settings.tick_size)
            view.marks.add(symbol=symbol, price_ticks=mark)
    view.unrealized_pnl = unrealized
