"""GTD expiry: a heap of resting GTD orders by (expire_at_ms, arrival).

Expiry happens only on timer ticks, so it sits at a deterministic log position.
Records that finish otherwise stay in the heap as stale entries, skipped when
popped (free: they do not count against the per-tick budget, so a replica
restored from a snapshot, which has no stale entries, expires exactly the same
orders). The heap is rebuilt once stale entries dominate it.
"""

from __future__ import annotations

import heapq

from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import LAST_LIVE

_REBUILD_FLOOR = 1024


class ExpiryQueue:
    __slots__ = ("heap", "stale")

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, OrderRecord]] = []
        self.stale = 0

    def __len__(self) -> int:
        return len(self.heap) - self.stale

    def push(self, order: OrderRecord) -> None:
        heapq.heappush(self.heap, (order.spec.expire_at_ms, order.arrival, order))

    def note_finished(self) -> None:
        """A GTD record in the heap stopped being live other than by expiry."""
        self.stale += 1
        if self.stale > _REBUILD_FLOOR and 2 * self.stale > len(self.heap):
            self.heap = [entry for entry in self.heap if entry[2].status <= LAST_LIVE]
            heapq.heapify(self.heap)
            self.stale = 0

    def pop_due(self, now_ms: int, budget: int) -> list[OrderRecord]:
        """Up to `budget` live records with expire_at_ms <= now_ms, earliest first."""
        heap = self.heap
        due: list[OrderRecord] = []
        while heap and len(due) < budget and heap[0][0] <= now_ms:
            order = heapq.heappop(heap)[2]
            if order.status <= LAST_LIVE:
                due.append(order)
            else:
                self.stale -= 1
        return due
