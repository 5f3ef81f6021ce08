"""The reconciler's filter: which disagreements between matcher and shard are worth a report."""

from __future__ import annotations

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2
from services.reconciler.drift import group_drift, leaked_reservation

GROUPS = {"BTC-USDT": "g1", "SOL-USDT": "g2"}
OPEN = common_pb2.ORDER_STATUS_OPEN
PENDING = common_pb2.ORDER_STATUS_PENDING


def _view(*orders: tuple[str, str, int, int], reserved: int | None = None) -> shard_pb2.ActorView:
    view = shard_pb2.ActorView(resident=True)
    for order_id, symbol, status, remaining in orders:
        view.open_orders.add(
            order_id=order_id,
            symbol=symbol,
            status=status,
            remaining_lots=remaining,
            reserved=100,
            reserved_asset="USDT",
        )
    total_reserved = 100 * len(orders) if reserved is None else reserved
    view.state.balances.add(asset="USDT", total=10_000, reserved=total_reserved)
    return view


def _snapshot(*orders: tuple[str, int]) -> matcher_pb2.OpenOrdersSnapshot:
    snapshot = matcher_pb2.OpenOrdersSnapshot(as_of_sequence=9)
    for order_id, remaining in orders:
        state = snapshot.orders.add(status=OPEN, remaining_lots=remaining)
        state.order.order_id = order_id
    return snapshot


def test_agreement_and_each_kind_of_drift() -> None:
    group_of = GROUPS.get
    agreeing = _view(("a", "BTC-USDT", OPEN, 2), ("s", "SOL-USDT", OPEN, 5))
    assert group_drift(agreeing, "g1", _snapshot(("a", 2)), group_of) is None
    assert group_drift(agreeing, "g2", _snapshot(("s", 5)), group_of) is None
    # A pending order the matcher does not list yet is in flight, not drift.
    assert group_drift(_view(("p", "BTC-USDT", PENDING, 1)), "g1", _snapshot(), group_of) is None

    phantom = group_drift(agreeing, "g1", _snapshot(), group_of)
    assert phantom is not None and "open in the shard" in phantom
    lost_acceptance = group_drift(
        _view(("p", "BTC-USDT", PENDING, 1)), "g1", _snapshot(("p", 1)), group_of
    )
    assert lost_acceptance is not None and "pending" in lost_acceptance
    unknown = group_drift(agreeing, "g1", _snapshot(("a", 2), ("x", 1)), group_of)
    assert unknown is not None and "unknown to the shard" in unknown
    fewer = group_drift(agreeing, "g1", _snapshot(("a", 1)), group_of)
    assert fewer is not None and "lots left" in fewer
    absent = shard_pb2.ActorView(resident=False)
    assert group_drift(absent, "g1", _snapshot(), group_of) is None
    assert group_drift(absent, "g1", _snapshot(("x", 1)), group_of) is not None


def test_reservations_backed_by_open_orders_or_leaked() -> None:
    assert leaked_reservation(_view(("a", "BTC-USDT", OPEN, 2))) is None
    assert leaked_reservation(_view()) is None
    leak = leaked_reservation(_view(("a", "BTC-USDT", OPEN, 2), reserved=250))
    assert leak is not None and leak.startswith("USDT")
