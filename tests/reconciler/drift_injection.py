"""Ways to make the shard and the matcher disagree, for the reconciler to heal.

Orders are placed on the matcher directly (as if the shard had sent them) with
ids in the shard's own format but user sequences the shard never reaches.
"""

from __future__ import annotations

import itertools

from protos.oms.v1 import common_pb2, matcher_pb2
from tests.bridge.mesh import SHARD_ID

BTC = "BTC-USDT"
_sequences = itertools.count(9_001)
_correlations = itertools.count(1)


def foreign_order(
    user_id: int, *, price_ticks: int, time_in_force: int = common_pb2.TIME_IN_FORCE_GTC
) -> matcher_pb2.Order:
    """A one-lot BTC-USDT buy the shard never placed."""
    return matcher_pb2.Order(
        order_id=f"{SHARD_ID}:{user_id}:{next(_sequences)}",
        user_id=user_id,
        symbol=BTC,
        side=common_pb2.SIDE_BUY,
        order_type=common_pb2.ORDER_TYPE_LIMIT,
        time_in_force=time_in_force,  # type: ignore[arg-type]
        price_ticks=price_ticks,
        quantity_lots=1,
    )


def matcher_cancel(order_id: str, user_id: int) -> matcher_pb2.MatcherCommand:
    return matcher_pb2.MatcherCommand(
        correlation_id=next(_correlations),
        cancel=matcher_pb2.CancelOrder(order_id=order_id, user_id=user_id),
    )
