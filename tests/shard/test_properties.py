"""Random interleavings keep money conserved, reservations owned, users resident while not flat.

A small model plays the outside world: a matcher that answers the orders the
shard sends (accepts, rejects, partial and full fills, cancels, expiries, plus
duplicated, reordered and lost events), a persister that stores flushed
states and answers hydrations and dedup lookups, and clients that deposit,
withdraw, place every order type and cancel. Every step is applied to two
replicas; after every step:

- every invariant holds (`check_invariants`: conservation per asset, reservations
  belong to live orders and stay within totals, no negative balance, indexes);
- money is conserved end to end: what non-resident users hold in the model's
  database plus what resident users hold plus clearing and fees equals the
  initial money plus deposits minus withdrawals (so nobody left memory with
  value the database did not get);
- a user who leaves memory was flat (no order, saga or reservation);
- both replicas have the same state hash, and the incremental hash equals one
  computed from scratch (no change escaped the dirty list).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.routing.core.routing_document import (
    Cluster,
    ClusterState,
    RoutingDocument,
    Transit,
)
from services.runtime.core.state_machine import ApplyContext
from services.shard.core.commands import (
    CancelAllAfter,
    CancelAllOrders,
    CancelOrder,
    Command,
    DedupAnswer,
    Deposit,
    EndSession,
    FlushComplete,
    FlushRefused,
    HydrateUser,
    KeepSession,
    MarkPrices,
    MatcherEvent,
    MatcherEvents,
    PlaceOrder,
    Reconcile,
    ReconciledOrder,
    SetRiskLimits,
    SetRouting,
    UserControl,
    Withdraw,
)
from services.shard.core.digest import actor_digest
from services.shard.core.egress import (
    BeginDehydrate,
    CancelToMatcher,
    DedupLookup,
    Egress,
    HydrateRequest,
    ShardResult,
    SubmitToMatcher,
)
from services.shard.core.risk import RiskLimits
from services.shard.core.settings import RateLimitSettings
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.user_state import RecentResult, UserState
from services.shard.core.vocabulary import (
    BUY,
    LIMIT,
    MARKET,
    PPM,
    SELL,
    EventKind,
    UserControlAction,
)
from tests.shard.support import BTC, ETH, SHARD
from tests.shard.support import settings as shard_settings

USERS = (1, 2, 3, 4)
UNKNOWN_USER = 5
ASSETS = ("USDT", "BTC", "ETH")
SYMBOLS = {BTC.symbol: BTC, ETH.symbol: ETH}
INITIAL = {"USDT": 200_000, "BTC": 20_000, "ETH": 2_000}
TTL = 1_000


@dataclasses.dataclass
class MatcherOrder:
    order_id: str
    user_id: int
    symbol: str
    side: int
    order_type: int
    price_ticks: int
    remaining: int
    quote_left: int
    status: str = "pending"  # pending, open, done


class World:
    """The outside of the shard, and two replicas of it fed identical log entries."""

    def __init__(self) -> None:
        self.settings = shard_settings(
            idle_ttl_ms=TTL,
            redrive_after_ms=TTL // 2,
            dedup_filter_bits=64,  # tiny: ids are often "possibly seen" and go to the DB
            dedup_hashes=2,
            max_in_flight_sagas=6,
            max_parked_per_user=3,
            max_parked_total=6,
            normal_rate_limit=RateLimitSettings(burst_orders=50, orders_per_second=100),
            conservation_check_interval=1,
        )
        self.replicas = [ShardMachine(self.settings), ShardMachine(self.settings)]
        self.now = 1_000_000
        self.position = 0
        self.correlation = 0
        self.database: dict[int, UserState] = {
            user: UserState(user, balances=tuple(INITIAL.items())) for user in USERS
        }
        self.deposited = dict.fromkeys(ASSETS, 0)
        self.withdrawn = dict.fromkeys(ASSETS, 0)
        self.orders: dict[str, MatcherOrder] = {}
        self.sequences = {"g1": 0, "g2": 0}
        self.sent_events: list[tuple[str, MatcherEvent]] = []
        self.trade_id = 0
        self.flushes: list[BeginDehydrate] = []
        self.hydrations: dict[int, int] = {}  # user -> requested epoch
        self.lookups: list[tuple[int, str]] = []
        self.client_ids: dict[tuple[int, str], str] = {}  # accepted (user, client id) -> order id
        self.places: dict[int, PlaceOrder] = {}  # correlation id -> place
        self.transfers: dict[int, Deposit | Withdraw] = {}  # correlation id -> transfer
        self.next_client_id = 0
        self.routing_epoch = 0

    @property
    def machine(self) -> ShardMachine:
        return self.replicas[0]

    # --- feeding both replicas ---------------------------------------------------

    def apply(self, commands: list[Command], advance_ms: int) -> None:
        self.now += advance_ms
        self.position += 1
        before = self._holders()
        outputs = [m.apply_commands(commands, self.now) for m in self.replicas]
        assert outputs[0] == outputs[1]
        self._observe(outputs[0])
        self._check(before)

    def tick(self, advance_ms: int) -> None:
        self.now += advance_ms
        self.position += 1
        before = self._holders()
        context = ApplyContext(self.position, self.now)
        outputs = [list(m.on_timer(context)) for m in self.replicas]
        assert outputs[0] == outputs[1]
        self._observe(outputs[0])
        self._check(before)

    def restart_second_replica(self) -> None:
        fresh = ShardMachine(self.settings)
        fresh.restore(self.replicas[1].snapshot())
        assert fresh.state_hash() == self.replicas[1].state_hash()
        self.replicas[1] = fresh

    def _holders(self) -> dict[int, bool]:
        """Per resident user: is it flat?"""
        return {uid: actor.is_flat() for uid, actor in self.machine.state.actors.items()}

    def _observe(self, egress: list[Egress]) -> None:
        for item in egress:
            if isinstance(item, SubmitToMatcher):
                request = item.request
                self.orders[item.order_id] = MatcherOrder(
                    item.order_id,
                    request.user_id,
                    request.symbol,
                    request.side,
                    request.order_type,
                    request.price_ticks,
                    request.quantity_lots,
                    request.quote_amount,
                )
            elif isinstance(item, BeginDehydrate):
                self.flushes.append(item)
            elif isinstance(item, HydrateRequest):
                self.hydrations[item.user_id] = item.epoch
            elif isinstance(item, DedupLookup):
                self.lookups.append((item.user_id, item.client_order_id))
            elif isinstance(item, ShardResult) and item.accepted and not item.duplicate:
                place = self.places.get(item.correlation_id)
                if place is not None:
                    self.client_ids[(place.user_id, place.client_order_id)] = item.order_id
                transfer = self.transfers.get(item.correlation_id)
                if isinstance(transfer, Deposit):
                    self.deposited[transfer.asset] += transfer.amount
                elif isinstance(transfer, Withdraw):
                    self.withdrawn[transfer.asset] += transfer.amount
            elif isinstance(item, CancelToMatcher):
                assert item.order_id in self.orders

    def _check(self, before: dict[int, bool]) -> None:
        for machine in self.replicas:
            machine.check_invariants()
        assert self.replicas[0].state_hash() == self.replicas[1].state_hash()
        # The incremental hash saw every change: it equals a digest of every actor now.
        digests = sum(actor_digest(actor) for actor in self.machine.state.actors.values())
        assert self.machine.state.digest_sum == digests % (1 << 64)
        state = self.machine.state
        for user_id, was_flat in before.items():
            if user_id not in state.actors:
                assert was_flat, f"user {user_id} left memory while not flat"
        for asset in ASSETS:
            outside = sum(
                dict(db.balances).get(asset, 0)
                for user, db in self.database.items()
                if user not in state.actors
            )
            inside = state.accounts.resident[asset]
            shard = state.accounts.clearing[asset] + state.accounts.fees[asset]
            expected = INITIAL[asset] * len(USERS) + self.deposited[asset] - self.withdrawn[asset]
            assert outside + inside + shard == expected, asset

    # --- commands ------------------------------------------------------------------

    def correlation_id(self) -> int:
        self.correlation += 1
        return self.correlation

    def client_id(self, data: st.DataObject) -> str:
        retry = data.draw(st.booleans())
        if retry and self.client_ids:
            # A retry of an id this shard accepted before.
            known: list[tuple[int, str]] = sorted(self.client_ids)
            return data.draw(st.sampled_from(known))[1]
        self.next_client_id += 1
        return f"c{self.next_client_id}"

    def place(self, data: st.DataObject) -> PlaceOrder:
        user = data.draw(st.sampled_from((*USERS, UNKNOWN_USER)))
        symbol = data.draw(st.sampled_from(sorted(SYMBOLS)))
        side = data.draw(st.sampled_from((BUY, SELL)))
        order_type = data.draw(st.sampled_from((LIMIT, MARKET)))
        price = data.draw(st.integers(1, 150)) if order_type == LIMIT else 0
        quote = data.draw(st.integers(1, 20_000)) if (order_type, side) == (MARKET, BUY) else 0
        quantity = 0 if quote else data.draw(st.integers(1, 6))
        place = PlaceOrder(
            self.correlation_id(),
            user,
            self.client_id(data),
            symbol,
            side,
            order_type,
            0,
            price,
            quantity,
            quote,
            0,
            0,
            0,
            # Sometimes on a cancel-on-disconnect session (open, expired or never opened).
            session_id=data.draw(st.sampled_from((0, 0, 0, 1, 2))),
        )
        self.places[place.correlation_id] = place
        return place

    # --- the matcher ------------------------------------------------------------------

    def matcher_event(self, data: st.DataObject) -> MatcherEvents | None:
        live = [o for o in self.orders.values() if o.status != "done"]
        if not live:
            return None
        order = data.draw(st.sampled_from(live))
        symbol = SYMBOLS[order.symbol]
        group = symbol.matcher_group
        if order.status == "pending":
            kind = data.draw(st.sampled_from(("accepted", "accepted", "rejected")))
        else:
            kind = data.draw(st.sampled_from(("fill", "fill", "fill", "cancelled", "expired")))
        fields: dict[str, Any] = {}
        if kind == "accepted":
            order.status = "open"
            event_kind = EventKind.ACCEPTED
        elif kind == "rejected":
            order.status = "done"
            event_kind = EventKind.REJECTED
            fields["reason"] = 7
        elif kind == "fill":
            event_kind = EventKind.FILL
            maker = data.draw(st.booleans())
            rate = symbol.maker_fee_ppm if maker else symbol.taker_fee_ppm
            if order.order_type == LIMIT:
                # A fill is at the limit price or better for the owner.
                better = data.draw(st.integers(0, order.price_ticks - 1))
                price = (
                    order.price_ticks - better if order.side == BUY else order.price_ticks + better
                )
            else:
                price = data.draw(st.integers(1, 150))
            if order.quote_left:
                lot_cost = price * symbol.tick_size
                affordable = order.quote_left * PPM // (lot_cost * (PPM + rate))
                if affordable == 0:
                    kind, event_kind = "cancelled", EventKind.CANCELLED
                quantity = min(affordable, data.draw(st.integers(1, 4)))
            else:
                quantity = data.draw(st.integers(1, order.remaining))
            if kind == "fill":
                notional = price * quantity * symbol.tick_size
                fee = notional * rate // PPM
                if order.quote_left:
                    order.quote_left -= notional + fee
                    done = order.quote_left == 0
                else:
                    order.remaining -= quantity
                    done = order.remaining == 0
                self.trade_id += 1
                fields = {
                    "trade_id": self.trade_id,
                    "symbol": order.symbol,
                    "side": order.side,
                    "price_ticks": price,
                    "quantity_lots": quantity,
                    "notional": notional,
                    "fee": fee,
                    "maker": maker,
                    "remaining_lots": order.remaining,
                    "order_done": done,
                }
                if done:
                    order.status = "done"
        if kind in ("cancelled", "expired"):
            order.status = "done"
            event_kind = EventKind.CANCELLED if kind == "cancelled" else EventKind.EXPIRED
            fields = {"remaining_lots": order.remaining}
        self.sequences[group] += 1
        if data.draw(st.integers(0, 19)) == 0:
            return None  # lost in transit: a sequence gap the shard must count
        event = MatcherEvent(
            self.sequences[group], SHARD, order.order_id, order.user_id, int(event_kind), **fields
        )
        self.sent_events.append((group, event))
        return MatcherEvents(self.correlation_id(), group, (event,))

    def replay(self, data: st.DataObject) -> list[Command]:
        """Old events again, duplicated and reordered."""
        if not self.sent_events:
            return []
        picked = data.draw(st.lists(st.sampled_from(self.sent_events), min_size=1, max_size=4))
        return [MatcherEvents(self.correlation_id(), group, (event,)) for group, event in picked]

    # --- the persister -------------------------------------------------------------------

    def flush_answer(self, data: st.DataObject) -> Command | None:
        if not self.flushes:
            return None
        begin = self.flushes.pop(data.draw(st.integers(0, len(self.flushes) - 1)))
        stored = self.database[begin.user_id]
        # The persister's version-checked write: it fails if the row moved on since
        # this state was taken (an older flush answered late, or a lost race).
        if data.draw(st.integers(0, 4)) == 0 or stored.db_version != begin.state.db_version:
            return FlushRefused(self.correlation_id(), begin.user_id, begin.epoch, "conflict")
        version = begin.state.db_version + 1
        # The write happened, whether or not the shard still wants the eviction.
        self.database[begin.user_id] = dataclasses.replace(begin.state, db_version=version)
        epoch = begin.epoch if data.draw(st.integers(0, 5)) else begin.epoch - 1
        return FlushComplete(self.correlation_id(), begin.user_id, epoch, version)

    def hydrate_answer(self, data: st.DataObject) -> Command | None:
        if not self.hydrations:
            return None
        user = data.draw(st.sampled_from(sorted(self.hydrations)))
        epoch = self.hydrations.pop(user)
        stored = self.database.get(user)
        if stored is None:
            return HydrateUser(self.correlation_id(), user, epoch, False, None)
        return HydrateUser(self.correlation_id(), user, epoch, True, stored)

    def hydrate_ahead(self, user: int) -> HydrateUser:
        return HydrateUser(self.correlation_id(), user, 0, True, self.database[user])

    def dedup_answer(self, data: st.DataObject) -> Command | None:
        if not self.lookups:
            return None
        user, client_id = self.lookups.pop(data.draw(st.integers(0, len(self.lookups) - 1)))
        order_id = self.client_ids.get((user, client_id))
        original = RecentResult(client_id, order_id, 0, self.now) if order_id else None
        return DedupAnswer(self.correlation_id(), user, client_id, order_id is not None, original)


STEPS = (
    "deposit",
    "withdraw",
    "place",
    "place",
    "place",
    "cancel",
    "cancel_all",
    "switch",
    "session",
    "matcher",
    "matcher",
    "matcher",
    "matcher",
    "replay",
    "tick",
    "flush",
    "hydrate",
    "hydrate",
    "dedup",
    "marks",
    "reconcile",
    "routing",
    "restart",
    "operator",
)


def _step(world: World, data: st.DataObject, step: str) -> None:
    correlation = world.correlation_id
    if step in ("deposit", "withdraw"):
        user = data.draw(st.sampled_from(USERS))
        asset = data.draw(st.sampled_from(ASSETS))
        amount = data.draw(st.integers(1, 30_000))
        kind = Deposit if step == "deposit" else Withdraw
        # Few transfer ids: retries and DUPLICATE_TRANSFER come up often.
        transfer = kind(correlation(), user, asset, amount, f"t{data.draw(st.integers(0, 30))}")
        world.transfers[transfer.correlation_id] = transfer
        world.apply([transfer], data.draw(st.integers(0, 5)))
        return
    if step == "place":
        world.apply([world.place(data)], data.draw(st.integers(0, 5)))
        return
    if step == "cancel":
        order_ids = sorted(world.orders)
        if not order_ids:
            return
        order_id = data.draw(st.sampled_from(order_ids))
        user = world.orders[order_id].user_id
        world.apply([CancelOrder(correlation(), user, order_id, "", 0)], 1)
        return
    if step == "cancel_all":
        # Any user, known or not, resident or not; every symbol, one, or an unknown one
        # (from version 3; before, refused MALFORMED and nothing changes).
        user = data.draw(st.sampled_from((*USERS, UNKNOWN_USER)))
        symbol = data.draw(st.sampled_from(("", BTC.symbol, "ETH-USDT", "DOGE-USDT")))
        world.apply([CancelAllOrders(correlation(), user, symbol, 0)], 1)
        return
    if step == "switch":
        # A dead man's switch armed, re-armed, disarmed or refused (a timeout out of
        # range); the ticks fire it (from version 3; before, refused MALFORMED).
        user = data.draw(st.sampled_from((*USERS, UNKNOWN_USER)))
        timeout_ms = data.draw(st.sampled_from((0, 1, 1_000, TTL // 2, TTL * 2)))
        world.apply([CancelAllAfter(correlation(), user, timeout_ms, 0)], 1)
        return
    if step == "session":
        # A session kept alive, or ended cleanly or not (from version 3; before,
        # refused MALFORMED); the ticks expire it.
        user = data.draw(st.sampled_from((*USERS, UNKNOWN_USER)))
        session_id = data.draw(st.sampled_from((0, 1, 2)))
        if data.draw(st.booleans()):
            timeout_ms = data.draw(st.sampled_from((1_000, TTL // 2, TTL * 2)))
            world.apply([KeepSession(correlation(), user, session_id, timeout_ms, 0)], 1)
        else:
            cancel = data.draw(st.booleans())
            world.apply([EndSession(correlation(), user, session_id, cancel, 0)], 1)
        return
    if step == "matcher":
        event = world.matcher_event(data)
        if event is not None:
            world.apply([event], data.draw(st.integers(0, 5)))
        return
    if step == "replay":
        commands = world.replay(data)
        if commands:
            world.apply(commands, 0)
        return
    if step == "tick":
        world.tick(data.draw(st.sampled_from((1, TTL // 2, TTL, TTL + 7))))
        return
    if step == "flush":
        command = world.flush_answer(data)
        if command is not None:
            world.apply([command], 1)
        return
    if step == "hydrate":
        command = world.hydrate_answer(data)
        if command is not None:
            world.apply([command], 1)
        return
    if step == "dedup":
        command = world.dedup_answer(data)
        if command is not None:
            world.apply([command], 1)
        return
    if step == "marks":
        price = data.draw(st.integers(1, 150))
        world.apply([MarkPrices(correlation(), ((BTC.symbol, price),))], 1)
        return
    if step == "reconcile":
        user = data.draw(st.sampled_from(USERS))
        group = data.draw(st.sampled_from(("g1", "g2")))
        listed = tuple(
            ReconciledOrder(o.order_id, o.symbol, o.side, 2, o.remaining)
            for o in world.orders.values()
            if o.user_id == user and o.status == "open" and SYMBOLS[o.symbol].matcher_group == group
        )
        # Sometimes late: as of a few events ago (with today's open orders: whatever a
        # report lists, every invariant must hold; a late one is mostly judged stale).
        as_of = world.sequences[group] - data.draw(st.integers(0, 3))
        report = Reconcile(correlation(), user, group, max(as_of, 0), listed)
        world.apply([report], 1)
        return
    if step == "routing":
        # Another shard appears and takes some users by pin (the rest stay pinned here,
        # whatever the hash says), or an old epoch arrives late and changes nothing.
        stale = world.routing_epoch > 0 and data.draw(st.integers(0, 3)) == 0
        epoch = world.routing_epoch if stale else world.routing_epoch + 1
        # A user given away is pinned elsewhere or in transit (owned by nobody): either
        # way this shard lets it go once flat, and its matcher events still land here.
        elsewhere = data.draw(st.sets(st.sampled_from((*USERS, UNKNOWN_USER)), max_size=2))
        moving = {user for user in elsewhere if data.draw(st.booleans())}
        pins = {
            user: "s9" if user in elsewhere else SHARD
            for user in (*USERS, UNKNOWN_USER)
            if user not in moving
        }
        transit = {user: Transit(SHARD, "s9") for user in moving}
        clusters = [Cluster(SHARD, ClusterState.ACTIVE), Cluster("s9", ClusterState.ACTIVE)]
        document = RoutingDocument.build(max(1, epoch), clusters, pins, transit=transit)
        world.apply([SetRouting(correlation(), document.encode())], 1)
        world.routing_epoch = max(world.routing_epoch, epoch)
        return
    if step == "restart":
        world.restart_second_replica()
        return
    if step == "operator":
        # An operator's control of a random user, known or not, resident or not.
        user = data.draw(st.sampled_from((*USERS, UNKNOWN_USER)))
        action = data.draw(st.sampled_from(tuple(UserControlAction)))
        if data.draw(st.integers(0, 3)) == 0:
            limits = RiskLimits(max_open_orders=data.draw(st.integers(0, 3)))
            clear = data.draw(st.booleans())
            world.apply([SetRiskLimits(correlation(), user, limits, clear, "ops", "")], 1)
        else:
            world.apply([UserControl(correlation(), user, int(action), "ops", "test")], 1)
        return
    raise AssertionError(step)


def run_world(data: st.DataObject, steps: int) -> World:
    world = World()
    # Any state-machine version: version 2 keeps a tombstone's event sequences (in the
    # hash and the snapshot, which the second replica restarts from); version 3 takes
    # cancel-alls.
    version = data.draw(st.sampled_from((1, 2, 3)))
    for replica in world.replicas:
        replica.activate_version(version)
    # Users 1-3 start resident (hydrate-ahead); user 4 and the unknown user 5 are
    # hydrated on demand, and everybody may be evicted and hydrated again.
    world.apply([world.hydrate_ahead(user) for user in USERS[:3]], 0)
    for _ in range(steps):
        _step(world, data, data.draw(st.sampled_from(STEPS)))
    return world


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_interleavings_keep_every_invariant(data: st.DataObject) -> None:
    world = run_world(data, data.draw(st.integers(10, 120)))
    assert world.replicas[0].snapshot() == world.replicas[1].snapshot()
