"""Order updates: one egress subscription per shard, for the users this gateway's
clients subscribe to, fanned out to each user's streams.

The gateway follows each shard's durable egress filtered to `order_update` and to
the users that have a subscriber here (`EgressSubscription.order_update_users`), and
hands each update to the queues of that user's subscribers only. A shard with no
subscribed user here sends this gateway nothing: most clients never subscribe, and
an update per order state for nobody was a third of the shard's messages. When the
set of users changes, the subscription is opened again with the new set, from the
position after the last update it delivered (a new subscriber's updates start at
the latest there). A queue is bounded: a subscriber that falls `capacity` updates
behind is disconnected with RESOURCE_EXHAUSTED (it reconnects and reads its open
orders) instead of making the shared feed wait. When a feed breaks it resumes from
the position it stopped at, skipping what it already delivered there; if the shard
no longer retains that position, updates were lost, so that shard's subscribers are
disconnected with UNAVAILABLE and the feed restarts from the shard's current
position. A feed is started for every cluster the routing names, as it names them;
a user's updates come from whichever shard holds the user, so a user who moves
keeps its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

import grpc
import structlog

from gateway.clusters import ShardCluster
from gateway.core.refusals import GatewayError, slow_consumer, unavailable
from gateway.routing import Routing
from gateway.shard_endpoint import ShardEndpoint
from gateway.statistics import GatewayCounters
from protos.oms.v1 import common_pb2, shard_pb2
from services.observability.tracing import context_of, tracer

log = structlog.get_logger(__name__)
_tracer = tracer(__name__)
RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0)
READY_TIMEOUT_S = 10.0
CLUSTER_CHECK_S = 1.0  # besides each new epoch, how often the feeds are checked
FOLLOWING_POLL_S = 0.01


class OrderUpdateSubscriber:
    def __init__(self, user_id: int, capacity: int) -> None:
        self.user_id = user_id
        self.capacity = capacity
        self.updates: deque[shard_pb2.OrderUpdate] = deque()
        self.changed = asyncio.Event()
        self.ended: GatewayError | None = None

    def offer(self, update: shard_pb2.OrderUpdate) -> bool:
        """Queue one update; False when the subscriber is full (and now ended)."""
        if len(self.updates) >= self.capacity:
            self.end(slow_consumer(f"more than {self.capacity} order updates not yet read"))
            return False
        self.updates.append(update)
        self.changed.set()
        return True

    def end(self, error: GatewayError) -> None:
        if self.ended is None:
            self.ended = error
        self.changed.set()


class ShardUpdateFeed:
    """One shard's order updates for the users subscribed here, followed from where
    this feed started (or, after a time with nobody subscribed, started again)."""

    def __init__(self, shard: ShardEndpoint, fanout: OrderUpdateFanout) -> None:
        self.shard = shard
        self.fanout = fanout
        self.counters = fanout.counters
        self.following = asyncio.Event()  # a start position is known: updates are not missed
        # Resume point: the position being delivered and how many of its updates went out.
        self._position = 0
        self._delivered_at_position = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                if not self.fanout.user_ids():
                    # Nobody to deliver to: no subscription, and the next one starts from
                    # the shard's position then (nothing before it is wanted).
                    self._position = 0
                    self.following.clear()
                    await self.fanout.wait_users_changed()
                    continue
                if self._position == 0:
                    self._position = await self.shard.applied_position() + 1
                    self._delivered_at_position = 0
                self.following.set()
                if await self._follow():
                    continue  # the users changed: subscribe again at once
                failures = 0
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.OUT_OF_RANGE:
                    self._lost_updates(error.details() or "")
                    continue
                failures += 1
                self.counters.add("order_update_feed_breaks")
            except GatewayError:
                failures += 1
            await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])

    async def _follow(self) -> bool:
        """Deliver until the subscription ends (False; a break raises) or the users to
        follow change (True)."""
        changed = asyncio.ensure_future(self.fanout.wait_users_changed())
        request = shard_pb2.EgressSubscription(
            from_position=self._position,
            kinds=["order_update"],
            order_update_users=self.fanout.user_ids(),
        )
        call = (await self.shard.stub()).SubscribeEgress(request)
        reader = asyncio.ensure_future(self._deliver(call))
        try:
            await asyncio.wait({reader, changed}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # a break raises
                return False
            # Cancelled between two messages (delivering one never awaits), so every
            # update of the positions seen so far went out: start after them.
            if self._delivered_at_position:
                self._position += 1
                self._delivered_at_position = 0
            return True
        finally:
            changed.cancel()
            reader.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader

    async def _deliver(self, call: AsyncIterator[shard_pb2.ShardEgressBatch]) -> None:
        deliver = self.fanout.deliver
        skip = self._delivered_at_position
        async for batch in call:
            for item in batch.items:
                position = item.stamp.position
                if position == self._position:
                    if skip:
                        skip -= 1
                        continue
                    self._delivered_at_position += 1
                else:
                    skip = 0
                    self._position = position
                    self._delivered_at_position = 1
                update = item.order_update
                update.stamp.CopyFrom(item.stamp)
                if item.trace_parent:
                    # A sampled order's update: its way to the subscribers, in its trace.
                    with _tracer.start_as_current_span(
                        "gateway.order_update",
                        context=context_of(item.trace_parent),
                        attributes={
                            "oms.order_id": update.order_id,
                            "oms.status": common_pb2.OrderStatus.Name(update.status),
                            "oms.log_position": position,
                        },
                    ):
                        deliver(update)
                else:
                    deliver(update)

    def _lost_updates(self, detail: str) -> None:
        self.counters.add("order_update_feed_gaps")
        log.warning("gateway.order_updates_lost", shard=self.shard.address, detail=detail)
        # Whose updates came from this shard is not known here: every subscriber is told
        # to re-read its open orders (a gap is rare: the shard retains a long tail).
        self.fanout.end_all(unavailable("order updates were interrupted; read open orders"))
        self._position = 0


class OrderUpdateFanout:
    def __init__(self, routing: Routing, counters: GatewayCounters, *, capacity: int) -> None:
        self.routing = routing
        self.counters = counters
        self.capacity = capacity
        self.feeds: dict[str, ShardUpdateFeed] = {}  # cluster id -> its feed
        self._subscribers: dict[int, dict[OrderUpdateSubscriber, None]] = {}
        self._count = 0
        self._users_changed = asyncio.Event()

    def user_ids(self) -> list[int]:
        """The users with a subscriber here, in order (what the feeds ask the shards for)."""
        return sorted(self._subscribers)

    async def wait_users_changed(self) -> None:
        """Until a user gains its first subscriber or loses its last one."""
        event = self._users_changed
        await event.wait()

    def _note_users_changed(self) -> None:
        # Every waiter of this event wakes; later waiters wait on a fresh one.
        self._users_changed.set()
        self._users_changed = asyncio.Event()

    @property
    def subscriber_count(self) -> int:
        return self._count

    # --- the shared feeds -----------------------------------------------------------------

    async def run(self) -> None:
        """A feed for every cluster of the current epoch, started as the epochs name them
        (a cluster that leaves keeps its feed: the gateway may still see its updates)."""
        tasks: list[asyncio.Task[None]] = []
        try:
            while True:
                for cluster in self._clusters_now():
                    if cluster.cluster_id not in self.feeds:
                        feed = ShardUpdateFeed(cluster.shard, self)
                        self.feeds[cluster.cluster_id] = feed
                        tasks.append(asyncio.create_task(feed.run()))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLUSTER_CHECK_S):
                        await self.routing.changed()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _clusters_now(self) -> tuple[ShardCluster, ...]:
        try:
            return self.routing.clusters()
        except GatewayError:
            return ()

    def deliver(self, update: shard_pb2.OrderUpdate) -> None:
        self.counters.add("order_updates_seen")
        subscribers = self._subscribers.get(update.user_id)
        if not subscribers:
            return
        for subscriber in list(subscribers):
            if subscriber.offer(update):
                self.counters.add("order_updates_delivered")
            else:
                self.counters.add("order_update_slow_subscribers")
                self._remove(subscriber)

    def end_all(self, error: GatewayError) -> None:
        for subscribers in list(self._subscribers.values()):
            for subscriber in list(subscribers):
                subscriber.end(error)
                self._remove(subscriber)

    async def _following(self) -> None:
        """Returns once every feed of the current epoch's clusters has a start position."""
        while True:
            clusters = self._clusters_now()
            feeds = [self.feeds.get(cluster.cluster_id) for cluster in clusters]
            if clusters and all(feed is not None and feed.following.is_set() for feed in feeds):
                return
            await asyncio.sleep(FOLLOWING_POLL_S)

    # --- subscribers ----------------------------------------------------------------------

    async def stream(
        self, user_id: int, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[shard_pb2.OrderUpdate]:
        """The user's updates from now on; initial metadata tells the client it is live."""
        subscriber = OrderUpdateSubscriber(user_id, self.capacity)
        if user_id not in self._subscribers:
            self._subscribers[user_id] = {}
            self._note_users_changed()
        self._subscribers[user_id][subscriber] = None
        self._count += 1
        try:
            # Once every feed has a start position at or before now, its next
            # subscription includes this user: the updates from here on are delivered.
            try:
                async with asyncio.timeout(READY_TIMEOUT_S):
                    await self._following()
            except TimeoutError as error:
                raise unavailable("the shards' order updates cannot be followed") from error
            await context.send_initial_metadata(())
            while True:
                await subscriber.changed.wait()
                subscriber.changed.clear()
                while subscriber.updates:
                    if subscriber.ended is not None:
                        break
                    yield subscriber.updates.popleft()
                if subscriber.ended is not None:
                    raise subscriber.ended
        finally:
            self._remove(subscriber)

    def _remove(self, subscriber: OrderUpdateSubscriber) -> None:
        subscribers = self._subscribers.get(subscriber.user_id)
        if subscribers is None or subscriber not in subscribers:
            return
        del subscribers[subscriber]
        self._count -= 1
        if not subscribers:
            del self._subscribers[subscriber.user_id]
            self._note_users_changed()
