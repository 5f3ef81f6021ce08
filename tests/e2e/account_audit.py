"""What a client can check of its account from the public API alone.

`audit_account` reads the order history, the fill history and the balances and
checks they tell one story, per asset: what was deposited, minus what was
withdrawn, plus every fill's signed amounts, minus its fees, is the balance;
each order's filled quantity is the sum of its fills; and with `flat`, nothing
is open and nothing is reserved.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.client import OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2

FINAL = (
    common_pb2.ORDER_STATUS_FILLED,
    common_pb2.ORDER_STATUS_CANCELLED,
    common_pb2.ORDER_STATUS_EXPIRED,
    common_pb2.ORDER_STATUS_REJECTED,
)


@dataclass(frozen=True)
class AccountStory:
    orders: list[gateway_pb2.OrderView]
    fills: list[gateway_pb2.FillView]
    balances: dict[str, tuple[int, int]]  # asset -> (total, reserved)


def fill_amounts(fill: gateway_pb2.FillView) -> dict[str, int]:
    """What one fill moved in and out of the user's account, per asset."""
    if fill.side == common_pb2.SIDE_BUY:
        return {
            fill.base_asset: fill.base_amount,
            fill.quote_asset: -(fill.quote_amount + fill.fee),
        }
    return {fill.base_asset: -fill.base_amount, fill.quote_asset: fill.quote_amount - fill.fee}


async def audit_account(
    client: OmsClient,
    deposits: Mapping[str, int],
    *,
    withdrawals: Mapping[str, int] | None = None,
    flat: bool = True,
    page_size: int = 0,
) -> AccountStory:
    orders = await client.order_history(limit=page_size)
    fills = await client.fill_history(limit=page_size)
    balances = {a: (b.total, b.reserved) for a, b in (await client.balances()).items()}

    ids = [order.order_id for order in orders]
    assert len(ids) == len(set(ids)), "an order twice in the history"
    # Oldest first: by acceptance time, then the user's order sequence ("<shard>:<user>:<seq>").
    keys = [(order.accepted_at_ms, int(order.order_id.rsplit(":", 1)[1])) for order in orders]
    assert keys == sorted(keys), "order history out of order"
    fill_keys = [(fill.time_ms, fill.order_id, fill.trade_id) for fill in fills]
    assert fill_keys == sorted(fill_keys) and len(set(fill_keys)) == len(fill_keys)

    by_order = {order.order_id: order for order in orders}
    filled: Counter[str] = Counter()
    expected: defaultdict[str, int] = defaultdict(int)
    for asset, amount in deposits.items():
        expected[asset] += amount
    for asset, amount in (withdrawals or {}).items():
        expected[asset] -= amount
    for fill in fills:
        order = by_order.get(fill.order_id)
        assert order is not None, f"fill of {fill.order_id}, which the order history lacks"
        assert order.client_order_id == fill.client_order_id and order.side == fill.side
        filled[fill.order_id] += fill.quantity_lots
        for asset, amount in fill_amounts(fill).items():
            expected[asset] += amount
    for order in orders:
        assert order.filled_lots == filled[order.order_id], order
    for asset in set(expected) | set(balances):
        total = balances.get(asset, (0, 0))[0]
        assert total == expected[asset], (asset, total, expected[asset])
    if flat:
        assert all(order.status in FINAL for order in orders), [
            o for o in orders if o.status not in FINAL
        ][:3]
        assert all(reserved == 0 for _, reserved in balances.values()), balances
    return AccountStory(orders, fills, balances)
