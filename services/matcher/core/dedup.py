"""The dedup index (contract points 1 and 2): every order id known to the matcher.

An id is known while its order lives and for `dedup_horizon_ms` after it ends.
Finished records queue in `finished` by end time (consensus time never goes
back, so the queue is sorted); a timer sweep forgets ids from the front only,
once consensus time reaches end time + horizon, at most `budget` per tick.
"""

from __future__ import annotations

from collections import deque

from services.matcher.core.errors import MatcherInvariantError
from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import LAST_LIVE


class DedupIndex:
    __slots__ = ("finished", "orders")

    def __init__(self) -> None:
        self.orders: dict[str, OrderRecord] = {}
        self.finished: deque[OrderRecord] = deque()

    def __len__(self) -> int:
        return len(self.orders)

    def sweep(self, now_ms: int, horizon_ms: int, budget: int) -> list[OrderRecord]:
        """Forget up to `budget` finished orders whose horizon has passed; return them."""
        finished = self.finished
        orders = self.orders
        forgotten: list[OrderRecord] = []
        cutoff = now_ms - horizon_ms  # forget when end_time_ms + horizon_ms <= now_ms
        while finished and len(forgotten) < budget:
            order = finished[0]
            if order.end_time_ms > cutoff:
                break
            finished.popleft()
            if order.status <= LAST_LIVE or orders.get(order.order_id) is not order:
                raise MatcherInvariantError(f"dedup queue holds {order.order_id} out of place")
            del orders[order.order_id]
            forgotten.append(order)
        return forgotten
