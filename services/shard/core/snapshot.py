"""Snapshot: the whole shard as plain data, pickled deterministically.

Everything is in it: actors with their sagas, reservations and parked
commands, pending hydrations, deferred reconciles, dedup filters, matcher
sequences, accounts, the recency order, supervision history and counters.

Why pickle is deterministic here: the payload is only tuples, lists, dicts
(insertion-ordered, and every dict is built in log order), str, bytes, int,
bool and None, in a fixed layout, never a set or a float. The pickler runs in
"fast" mode, which turns the memo off: without it, the bytes would depend on
object identity (two equal strings written once or twice depending on whether
they are the same object), which differs between replicas. Restoring uses an
unpickler that refuses every global, so a snapshot can only ever be data.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from services.routing.core.routing_document import RoutingDocument
from services.shard.core.actor import (
    DEHYDRATING,
    HALTED,
    QUARANTINED,
    DedupWait,
    Reservation,
    UserActor,
)
from services.shard.core.commands import (
    CancelAllAfter,
    CancelAllOrders,
    CancelOrder,
    ClientCommand,
    Deposit,
    EndSession,
    KeepSession,
    MatcherEvent,
    PlaceOrder,
    Reconcile,
    ReconciledOrder,
    SetRiskLimits,
    UserControl,
    Withdraw,
)
from services.shard.core.errors import SnapshotFormatError
from services.shard.core.orders import OpenOrder
from services.shard.core.positions import Position
from services.shard.core.rate_limit import TokenBucket
from services.shard.core.risk import NO_LIMITS, RiskLimits
from services.shard.core.shard_state import ParkedEvent, ParkedItem, PendingHydration, ShardState
from services.shard.core.statistics import SweepStatistics

# 2: actors keep their last matcher event sequences; 3: routing; 4: operator controls
# (an actor's trading halt, the operator and note of a parked command); 5: the
# persister's cursor; 6: an actor's control version and last control request id (and
# a parked control's), so a restored replica refuses a stale copy as the live one does;
# 7: the state-machine version in force; 8: the tombstones' last event sequences (kept
# from state-machine version 2 on)
SNAPSHOT_VERSION = 8
# Written at version 1, where tombstones keep no sequences: a replica of the release
# before reads it, so a group at version 1 can be rolled replica by replica. A group at
# version 2 has only replicas that implement 2, which read 8.
_SNAPSHOT_AT_VERSION_1 = 7
# version -> fields (a 2 has no routing document, a 4 no persister cursor, a 6 no
# state-machine version: 1, a 7 no tombstone sequences)
_READABLE_VERSIONS = {2: 20, 3: 21, 4: 21, 5: 22, 6: 22, 7: 23, 8: 24}


# --- commands ---------------------------------------------------------------------------


def item_plain(item: ParkedItem) -> tuple[Any, ...]:
    if type(item) is ParkedEvent:
        return ("event", item.matcher_group, tuple(item.event))
    if type(item) is SetRiskLimits:
        return (
            "limits",
            item.correlation_id,
            item.user_id,
            item.limits.plain(),
            item.clear_reduce_only,
            item.operator,
            item.note,
            item.request_id,
            item.if_control_version,
        )
    if type(item) is PlaceOrder and not item.session_id:
        # Without a session: the plain data it had before sessions existed.
        return ("place", *item[:-1])
    return (_TAGS[type(item)], *item)


def item_from_plain(data: tuple[Any, ...]) -> ParkedItem:
    tag = data[0]
    if tag == "event":
        return ParkedEvent(data[1], MatcherEvent(*data[2]))
    if tag == "limits":
        return SetRiskLimits(data[1], data[2], RiskLimits(*data[3]), data[4], *data[5:])
    kind = _KINDS.get(tag)
    if kind is None:
        raise SnapshotFormatError(f"unknown parked command {tag!r}")
    command: ClientCommand = kind(*data[1:])
    return command


_TAGS: dict[type, str] = {
    PlaceOrder: "place",
    CancelOrder: "cancel",
    CancelAllOrders: "cancel_all",
    CancelAllAfter: "cancel_all_after",
    KeepSession: "keep_session",
    EndSession: "end_session",
    Deposit: "deposit",
    Withdraw: "withdraw",
    UserControl: "control",
}
_KINDS: dict[str, Any] = {tag: kind for kind, tag in _TAGS.items()}


def reconcile_plain(report: Reconcile) -> tuple[Any, ...]:
    return (
        report.correlation_id,
        report.user_id,
        report.matcher_group,
        report.as_of_sequence,
        tuple(tuple(order) for order in report.open_orders),
    )


def reconcile_from_plain(data: tuple[Any, ...]) -> Reconcile:
    correlation_id, user_id, group, as_of, orders = data
    return Reconcile(
        correlation_id, user_id, group, as_of, tuple(ReconciledOrder(*o) for o in orders)
    )


# --- actors -----------------------------------------------------------------------------


def actor_plain(actor: UserActor) -> tuple[Any, ...]:
    """Every field of an actor, derived caches excluded, in a fixed order."""
    wait = actor.dedup_wait
    return (
        actor.user_id,
        actor.epoch,
        actor.db_version,
        actor.user_seq,
        actor.tier,
        actor.lifecycle,
        actor.health,
        tuple(actor.balances.items()),
        tuple((order_id, r.asset, r.amount) for order_id, r in actor.reservations.items()),
        tuple(order.plain() for order in actor.orders.values()),
        tuple(actor.open_by_client.items()),
        tuple((symbol, p.plain()) for symbol, p in actor.positions.items()),
        tuple(actor.recent.items()),
        tuple(actor.transfers.items()),
        actor.limits.plain(),
        actor.reduce_only,
        actor.peak_equity,
        actor.bucket.plain(),
        actor.last_active_ms,
        actor.recency_seq,
        tuple(actor.failures),
        None
        if wait is None
        else (
            wait.client_order_id,
            wait.requested_at_ms,
            tuple(item_plain(command) for command in wait.parked),
        ),
        tuple(actor.event_sequences.items()),
        actor.trading_halted,
        actor.control_version,
        actor.last_control_id,
        # Only while armed or with a session open (never before version 3): an actor
        # without either keeps the plain data, the digest and the snapshot bytes it had
        # before they existed.
        *((actor.cancel_all_at_ms,) if actor.cancel_all_at_ms or actor.sessions else ()),
        *((tuple(sorted(actor.sessions.items())),) if actor.sessions else ()),
    )


def actor_from_plain(data: tuple[Any, ...]) -> UserActor:
    (
        user_id,
        epoch,
        db_version,
        user_seq,
        tier,
        lifecycle,
        health,
        balances,
        reservations,
        orders,
        open_by_client,
        positions,
        recent,
        transfers,
        limits,
        reduce_only,
        peak_equity,
        bucket,
        last_active_ms,
        recency_seq,
        failures,
        wait,
        event_sequences,
    ) = data[:23]
    actor = UserActor(user_id, epoch, last_active_ms, TokenBucket(*bucket))
    actor.db_version = db_version
    actor.user_seq = user_seq
    actor.tier = tier
    actor.lifecycle = lifecycle
    actor.health = health
    actor.balances = dict(balances)
    for order_id, asset, amount in reservations:
        actor.reservations[order_id] = Reservation(asset, amount)
        actor.reserved[asset] = actor.reserved.get(asset, 0) + amount
    for order in orders:
        rebuilt = OpenOrder.from_plain(order)
        actor.orders[rebuilt.order_id] = rebuilt
    actor.open_by_client = dict(open_by_client)
    actor.event_sequences = dict(event_sequences)
    actor.positions = {symbol: Position(*p) for symbol, p in positions}
    actor.recent = dict(recent)
    actor.transfers = dict(transfers)
    restored_limits = RiskLimits(*limits)
    actor.limits = NO_LIMITS if restored_limits == NO_LIMITS else restored_limits
    actor.reduce_only = reduce_only
    actor.peak_equity = peak_equity
    actor.trading_halted = bool(data[23]) if len(data) > 23 else False  # before version 4
    if len(data) > 24:  # before version 6 no control had a version
        actor.control_version, actor.last_control_id = data[24], data[25]
    if len(data) > 26:  # a dead man's switch armed, or sessions open
        actor.cancel_all_at_ms = data[26]
    if len(data) > 27:
        actor.sessions = dict(data[27])
    actor.recency_seq = recency_seq
    actor.failures = list(failures)
    if wait is not None:
        parked: list[ClientCommand] = []
        for item in wait[2]:
            command = item_from_plain(item)
            if isinstance(command, ParkedEvent):
                raise SnapshotFormatError("a matcher event cannot wait for a dedup answer")
            parked.append(command)
        actor.dedup_wait = DedupWait(wait[0], wait[1], parked)
    return actor


# --- the whole shard --------------------------------------------------------------------


def encode(state: ShardState) -> bytes:
    layout = SNAPSHOT_VERSION if state.machine_version >= 2 else _SNAPSHOT_AT_VERSION_1
    data: tuple[Any, ...] = (
        layout,
        state.settings.fingerprint(),
        state.now_ms,
        state.epoch_counter,
        state.recency_counter,
        state.parked_client_commands,
        [actor_plain(actor) for actor in state.actors.values()],  # cold end first
        tuple(
            (
                user_id,
                pending.epoch,
                pending.requested_at_ms,
                pending.client_commands,
                tuple(item_plain(item) for item in pending.parked),
            )
            for user_id, pending in state.hydrations.items()
        ),
        tuple(reconcile_plain(report) for report in state.deferred_reconciles),
        tuple(state.sequences.items()),
        tuple(state.marks.items()),
        state.accounts.plain(),
        state.dedup.plain(),
        tuple(state.tombstones.items()),
        tuple(state.pending_submits.items()),
        tuple(state.pending_cancels.items()),
        tuple((symbol, tuple(users)) for symbol, users in state.holders.items()),
        tuple(state.dedup_waits),
        state.counters.plain(),
        (
            state.last_sweep.at_ms,
            state.last_sweep.visited,
            state.last_sweep.expired,
            state.last_sweep.evicted,
            state.last_sweep.requeued,
        ),
        state.routing_raw,
        state.persisted_through,
        state.machine_version,
    )
    if layout >= 8:
        data = (*data, tuple(state.tombstone_events.items()))
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True  # no memo: bytes depend on values only (see the module docstring)
    pickler.dump(data)
    return buffer.getvalue()


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotFormatError(f"a shard snapshot holds only plain data, not {module}.{name}")


def decode_into(state: ShardState, data: bytes) -> None:
    """Fill a fresh `state` (built from the same settings) from snapshot bytes."""
    try:
        payload = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except SnapshotFormatError:
        raise
    except Exception as error:
        raise SnapshotFormatError(f"not a shard snapshot: {error}") from error
    if (
        not isinstance(payload, tuple)
        or not payload
        or _READABLE_VERSIONS.get(payload[0]) != len(payload)
    ):
        raise SnapshotFormatError("not a shard snapshot of a version this code reads")
    routing_raw = payload[20] if len(payload) > 20 else b""
    persisted_through = payload[21] if len(payload) > 21 else 0
    machine_version = payload[22] if len(payload) > 22 else 1
    tombstone_events = dict(payload[23]) if len(payload) > 23 else {}
    (
        _,
        fingerprint,
        now_ms,
        epoch_counter,
        recency_counter,
        parked_client_commands,
        actors,
        hydrations,
        deferred,
        sequences,
        marks,
        accounts,
        dedup,
        tombstones,
        pending_submits,
        pending_cancels,
        holders,
        dedup_waits,
        counters,
        last_sweep,
    ) = payload[:20]
    if fingerprint != state.settings.fingerprint():
        raise SnapshotFormatError("snapshot was taken with different shard settings")
    try:
        state.now_ms = now_ms
        state.epoch_counter = epoch_counter
        state.recency_counter = recency_counter
        state.parked_client_commands = parked_client_commands
        state.persisted_through = persisted_through
        state.machine_version = machine_version
        for plain in actors:
            actor = actor_from_plain(plain)
            state.actors[actor.user_id] = actor
            state.mark_dirty(actor)
            if actor.cancel_all_at_ms:
                state.switches[actor.user_id] = actor.cancel_all_at_ms
            for session_id, expires_ms in actor.sessions.items():
                state.sessions[(actor.user_id, session_id)] = expires_ms
            if actor.lifecycle == DEHYDRATING:
                state.dehydrating += 1
            if actor.health == QUARANTINED:
                state.quarantined += 1
            elif actor.health == HALTED:
                state.halted += 1
        for user_id, epoch, requested_at_ms, client_commands, items in hydrations:
            pending = PendingHydration(epoch, requested_at_ms)
            pending.client_commands = client_commands
            pending.parked = [item_from_plain(item) for item in items]
            state.hydrations[user_id] = pending
        state.deferred_reconciles = [reconcile_from_plain(report) for report in deferred]
        state.sequences = dict(sequences)
        state.marks = dict(marks)
        state.accounts.restore_plain(accounts)
        state.dedup.restore_plain(dedup)
        for user_id, version in tombstones:
            state.remember_tombstone(user_id, version, tombstone_events.get(user_id, ()))
        state.pending_submits = dict(pending_submits)
        state.pending_cancels = dict(pending_cancels)
        state.holders = {symbol: dict.fromkeys(users) for symbol, users in holders}
        state.dedup_waits = dict.fromkeys(dedup_waits)
        state.counters.restore_plain(counters)
        state.last_sweep = SweepStatistics(*last_sweep)
        if routing_raw:
            state.routing = RoutingDocument.decode(routing_raw)
            state.routing_raw = routing_raw
    except (TypeError, ValueError, KeyError) as error:
        raise SnapshotFormatError(f"malformed shard snapshot: {error}") from error
