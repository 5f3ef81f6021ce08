"""Everything one shard holds, and the small mutations every part of it shares.

The engines (`saga`, `settlement`, `balances`, `hydration`, `eviction`,
`reconcile`, `supervision`, `marks`) decide; this object is where their
decisions land. Three rules every mutation of an actor follows:

- `touch` on activity: the actor moves to the hot end of the recency order,
  its last-active time advances and a pending eviction is cancelled (the
  flushed state would be stale);
- `mark_dirty` on any change, so the next state hash recomputes its digest;
- a change of a user's total goes through `credit`/`debit`, which keep the
  shard's incremental resident totals (conservation) in step.
"""

from __future__ import annotations

import hashlib
import marshal
from collections import OrderedDict
from typing import NamedTuple

from services.routing.core.routing_document import RoutingDocument
from services.shard.core.accounts import ShardAccounts
from services.shard.core.actor import DEHYDRATING, HALTED, QUARANTINED, RESIDENT, UserActor
from services.shard.core.commands import ClientCommand, MatcherEvent, Reconcile
from services.shard.core.dedup import RotatingDedupIndex
from services.shard.core.errors import NegativeBalanceError, OrderIndexError
from services.shard.core.orders import OpenOrder
from services.shard.core.positions import Position
from services.shard.core.rate_limit import TokenBucket
from services.shard.core.settings import RateLimitSettings, ShardSettings, SymbolSettings
from services.shard.core.statistics import ShardCounters, SweepStatistics
from services.shard.core.vocabulary import PENDING, WHALE


class ParkedEvent(NamedTuple):
    """A matcher event for a user who is not resident, waiting for the hydration."""

    matcher_group: str
    event: MatcherEvent


ParkedItem = ClientCommand | ParkedEvent


class PendingHydration:
    """A user whose state was requested: its commands wait here in log order."""

    __slots__ = ("client_commands", "epoch", "parked", "requested_at_ms")

    def __init__(self, epoch: int, requested_at_ms: int) -> None:
        self.epoch = epoch
        self.requested_at_ms = requested_at_ms
        self.parked: list[ParkedItem] = []
        self.client_commands = 0  # the bounded part of `parked`


class ShardState:
    def __init__(self, settings: ShardSettings) -> None:
        self.settings = settings
        self.shard_id = settings.shard_id
        self.symbols: dict[str, SymbolSettings] = {s.symbol: s for s in settings.symbols}
        self.assets: dict[str, None] = dict.fromkeys(settings.assets)
        self.settlement_symbols = {
            name: symbol
            for name, symbol in self.symbols.items()
            if symbol.quote_asset == settings.risk_settlement_asset
        }
        self.actors: OrderedDict[int, UserActor] = OrderedDict()  # cold end first
        self.accounts = ShardAccounts(settings.assets)
        self.dedup = RotatingDedupIndex(
            settings.dedup_filter_bits,
            settings.dedup_hashes,
            settings.dedup_filters,
            settings.dedup_session_ms,
        )
        # The bridge's work queue: every saga in flight, oldest first.
        self.pending_submits: dict[str, int] = {}  # order id -> user id
        self.pending_cancels: dict[str, int] = {}  # order id -> user id
        self.marks: dict[str, int] = {}  # symbol -> mark price in ticks
        self.holders: dict[str, dict[int, None]] = {name: {} for name in self.symbols}
        self.sequences: dict[str, int] = {}  # matcher group -> last applied sequence
        self.hydrations: dict[int, PendingHydration] = {}
        # The mesh's routing document as of this log position (SetRouting), and its
        # canonical bytes; None: no document yet, the shard owns every user it is sent.
        self.routing: RoutingDocument | None = None
        self.routing_raw = b""
        # Resident users the document gives away, in actor order (`ownership.py`):
        # derived from the actors and the document, so neither snapshotted nor hashed.
        self.leaving: dict[int, None] = {}
        self.parked_client_commands = 0
        # The persister's cursor as of this log position (`Persisted`): egress through it
        # is in PostgreSQL, so a replica keeps a snapshot at or before it (snapshot_policy).
        self.persisted_through = 0
        # The state-machine version its decisions are made under (`versions.py`).
        self.machine_version = 1
        self.dedup_waits: dict[int, None] = {}  # users with a DB dedup lookup out
        # Users with a dead man's switch armed -> its consensus time (`cancel_all_at_ms`):
        # derived from the actors, so neither snapshotted nor hashed on its own.
        self.switches: dict[int, int] = {}
        # (user, session) -> when it expires: the actors' open sessions, derived likewise.
        self.sessions: dict[tuple[int, int], int] = {}
        self.deferred_reconciles: list[Reconcile] = []
        self.tombstones: OrderedDict[int, int] = OrderedDict()  # evicted user -> db_version
        self.tombstone_sum = 0
        # From state-machine version 2, with a tombstone: the user's last matcher event
        # sequence per group when it left (sorted by group), so a reconcile report from
        # before then is judged stale, not impossible, and a hydration resumes them.
        self.tombstone_events: dict[int, tuple[tuple[str, int], ...]] = {}
        self.tombstone_event_sum = 0
        self.epoch_counter = 0
        self.recency_counter = 0
        self.digest_sum = 0  # sum of clean actors' digests mod 2^64
        self.dirty: list[UserActor] = []
        self.dehydrating = 0
        self.quarantined = 0
        self.halted = 0
        self.now_ms = 0
        self.counters = ShardCounters()
        self.last_sweep = SweepStatistics()
        self.rate_limits: dict[int, RateLimitSettings] = {WHALE: settings.whale_rate_limit}
        self.normal_rate_limit = settings.normal_rate_limit
        # FAULT INJECTION (tests only): (user id, client order id) -> mode.
        self.faults: dict[tuple[int, str], str] = {
            (fault.user_id, fault.client_order_id): fault.mode for fault in settings.fault_injection
        }

    # --- actors -----------------------------------------------------------------------

    def owns(self, user_id: int) -> bool:
        """Whether the routing document gives `user_id` to this shard (every user, before
        the first document)."""
        routing = self.routing
        return routing is None or routing.owner_of(user_id) == self.shard_id

    def next_epoch(self) -> int:
        self.epoch_counter += 1
        return self.epoch_counter

    def new_actor(self, user_id: int, epoch: int, tier: int, now_ms: int) -> UserActor:
        limit = self.rate_limits.get(tier, self.normal_rate_limit)
        actor = UserActor(user_id, epoch, now_ms, TokenBucket.full(limit, now_ms))
        actor.tier = tier
        return actor

    def admit_actor(self, actor: UserActor) -> None:
        """Make a built actor resident at the hot end."""
        self.actors[actor.user_id] = actor
        self.recency_counter += 1
        actor.recency_seq = self.recency_counter
        for symbol, position in actor.positions.items():
            if position.quantity_lots:
                self.holders[symbol][actor.user_id] = None
        self.forget_tombstone(actor.user_id)
        self.mark_dirty(actor)
        if not self.owns(actor.user_id):  # hydrated only for matcher events parked here
            self.leaving[actor.user_id] = None

    def drop_actor(self, actor: UserActor) -> None:
        """Remove an evicted actor: its digest leaves the set-hash now."""
        del self.actors[actor.user_id]
        self.switches.pop(actor.user_id, None)  # none expected: an armed user is not flat
        for session_id in actor.sessions:  # none expected either
            self.sessions.pop((actor.user_id, session_id), None)
        for symbol in actor.positions:
            self.holders[symbol].pop(actor.user_id, None)
        self.digest_sum = (self.digest_sum - actor.digest) & _MASK64
        actor.digest = 0

    def remember_tombstone(
        self, user_id: int, db_version: int, events: tuple[tuple[str, int], ...] = ()
    ) -> None:
        self.forget_tombstone(user_id)
        self.tombstones[user_id] = db_version
        self.tombstone_sum = (self.tombstone_sum + _mix(user_id, db_version)) & _MASK64
        if events:
            self.tombstone_events[user_id] = events
            term = _events_term(user_id, events)
            self.tombstone_event_sum = (self.tombstone_event_sum + term) & _MASK64
        while len(self.tombstones) > self.settings.max_evicted_tombstones:
            oldest, version = self.tombstones.popitem(last=False)
            self.tombstone_sum = (self.tombstone_sum - _mix(oldest, version)) & _MASK64
            self._forget_tombstone_events(oldest)

    def forget_tombstone(self, user_id: int) -> None:
        version = self.tombstones.pop(user_id, None)
        if version is not None:
            self.tombstone_sum = (self.tombstone_sum - _mix(user_id, version)) & _MASK64
            self._forget_tombstone_events(user_id)

    def _forget_tombstone_events(self, user_id: int) -> None:
        events = self.tombstone_events.pop(user_id, None)
        if events is not None:
            term = _events_term(user_id, events)
            self.tombstone_event_sum = (self.tombstone_event_sum - term) & _MASK64

    def mark_dirty(self, actor: UserActor) -> None:
        if not actor.dirty:
            actor.dirty = True
            self.dirty.append(actor)

    def touch(self, actor: UserActor, now_ms: int) -> None:
        """Activity: hot end of the recency order; a pending eviction is called off."""
        if actor.lifecycle == DEHYDRATING:
            actor.move_to(RESIDENT)
            actor.epoch = self.next_epoch()  # a FlushComplete of the old epoch is now stale
            self.dehydrating -= 1
            self.counters.evictions_cancelled += 1
        actor.last_active_ms = max(actor.last_active_ms, now_ms)
        self.actors.move_to_end(actor.user_id)
        self.recency_counter += 1
        actor.recency_seq = self.recency_counter
        if not actor.dirty:
            actor.dirty = True
            self.dirty.append(actor)

    def requeue(self, actor: UserActor) -> None:
        """Move to the hot end without counting as activity (sweep skips)."""
        self.actors.move_to_end(actor.user_id)
        self.recency_counter += 1
        actor.recency_seq = self.recency_counter
        self.mark_dirty(actor)

    def rate_limit(self, actor: UserActor) -> RateLimitSettings:
        return self.rate_limits.get(actor.tier, self.normal_rate_limit)

    def refuses_client_commands(self, actor: UserActor) -> bool:
        return actor.health in (QUARANTINED, HALTED)

    # --- money ------------------------------------------------------------------------

    def credit(self, actor: UserActor, asset: str, amount: int) -> None:
        balances = actor.balances
        balances[asset] = balances.get(asset, 0) + amount
        self.accounts.resident[asset] += amount

    def debit(self, actor: UserActor, asset: str, amount: int) -> None:
        balances = actor.balances
        left = balances.get(asset, 0) - amount
        if left < 0:
            raise NegativeBalanceError(f"user {actor.user_id}: {asset} would go to {left}")
        balances[asset] = left
        self.accounts.resident[asset] -= amount

    # --- orders -----------------------------------------------------------------------

    def add_order(self, actor: UserActor, order: OpenOrder) -> None:
        actor.orders[order.order_id] = order
        actor.open_by_client[order.request.client_order_id] = order.order_id
        self.pending_submits[order.order_id] = actor.user_id

    def saga_answered(self, order: OpenOrder) -> None:
        """The matcher answered the submit (accepted, or a fill/end proving it)."""
        if order.status == PENDING:
            self.pending_submits.pop(order.order_id, None)

    def remove_order(self, actor: UserActor, order: OpenOrder) -> None:
        order_id = order.order_id
        if actor.orders.pop(order_id, None) is not order:
            raise OrderIndexError(f"order {order_id} is not in user {actor.user_id}'s index")
        del actor.open_by_client[order.request.client_order_id]
        self.pending_submits.pop(order_id, None)
        if order.cancel_in_flight:
            self.pending_cancels.pop(order_id, None)

    def position(self, actor: UserActor, symbol: str) -> Position:
        position = actor.positions.get(symbol)
        if position is None:
            position = actor.positions[symbol] = Position()
        return position

    def note_position(self, actor: UserActor, symbol: str, position: Position) -> None:
        if position.quantity_lots:
            self.holders[symbol][actor.user_id] = None
        else:
            self.holders[symbol].pop(actor.user_id, None)

    @property
    def in_flight_sagas(self) -> int:
        return len(self.pending_submits) + len(self.pending_cancels)


_MASK64 = (1 << 64) - 1


def _events_term(user_id: int, events: tuple[tuple[str, int], ...]) -> int:
    # marshal version 2 writes values only, so equal data gives equal bytes everywhere.
    encoded = marshal.dumps((user_id, events), 2)
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=8).digest(), "little")


def _mix(key: int, value: int) -> int:
    item = ((key * 0x9E3779B97F4A7C15) ^ ((value & _MASK64) * 0xC2B2AE3D27D4EB4F)) & _MASK64
    item ^= item >> 29
    return (item * 0x9E3779B97F4A7C15) & _MASK64
