"""Hydrate-ahead: a user who just authenticated is probably about to trade.

When a user's key is verified and the gateway has not seen that user resident
(or offered them) within `interval_s`, the user id is queued; one loop sends the
queued ids to the persister of each user's shard (`Prefetch`) in batches, fire
and forget (a user in transit is skipped), so the
user's state is usually loaded into the shard before the first order arrives
(the shard drops the offer for a user already resident). It is only a head
start: an order for a cold user still parks and hydrates on its own, so a full
queue drops offers rather than wait, and a failed call is counted, not retried.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

import structlog

from gateway.core.refusals import GatewayError
from gateway.persister_client import PersisterClient
from gateway.routing import Routing
from gateway.statistics import GatewayCounters

log = structlog.get_logger(__name__)
MAX_PENDING = 10_000
MAX_PER_CALL = 1_000
REMEMBERED_USERS = 200_000


class HydrateAhead:
    def __init__(
        self,
        routing: Routing,
        counters: GatewayCounters,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.routing = routing
        self.counters = counters
        self.interval_s = interval_s
        self.clock = clock
        self._last_seen: OrderedDict[int, float] = OrderedDict()  # user -> resident or offered
        self._pending: dict[int, None] = {}
        self._wake = asyncio.Event()

    def offer(self, user_id: int) -> None:
        """The user authenticated: queue a prefetch unless one is recent or the user is hot."""
        now = self.clock()
        last = self._last_seen.get(user_id)
        if last is not None and now - last < self.interval_s:
            return
        if len(self._pending) >= MAX_PENDING:
            self.counters.add("prefetch_dropped")
            return
        self._remember(user_id, now)
        self._pending[user_id] = None
        self._wake.set()

    def note_resident(self, user_id: int) -> None:
        """The shard showed this user resident just now: no prefetch needed for a while."""
        self._remember(user_id, self.clock())

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = list(self._pending)[:MAX_PER_CALL]
                for user_id in batch:
                    del self._pending[user_id]
                for cluster_id, (persister, users) in self._by_cluster(batch).items():
                    try:
                        await persister.prefetch(users)
                        self.counters.add("prefetch_users", len(users))
                    except GatewayError as error:
                        self.counters.add("prefetch_failures")
                        log.debug(
                            "gateway.prefetch_failed",
                            cluster=cluster_id,
                            users=len(users),
                            detail=error.detail,
                        )

    def _by_cluster(self, users: list[int]) -> dict[str, tuple[PersisterClient, list[int]]]:
        grouped: dict[str, tuple[PersisterClient, list[int]]] = {}
        for user_id in users:
            try:
                cluster = self.routing.route(user_id).cluster
            except GatewayError:
                cluster = None
            if cluster is None:
                self.counters.add("prefetch_skipped")
                continue
            grouped.setdefault(cluster.cluster_id, (cluster.persister, []))[1].append(user_id)
        return grouped

    def _remember(self, user_id: int, now: float) -> None:
        self._last_seen[user_id] = now
        self._last_seen.move_to_end(user_id)
        if len(self._last_seen) > REMEMBERED_USERS:
            self._last_seen.popitem(last=False)
