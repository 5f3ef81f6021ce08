"""Hydration: commands for a non-resident user park, one request goes out, state lands.

A command for a user who is not resident parks in log order and one
`HydrateRequest{user, epoch}` goes out (single flight: later commands only
park). Client commands beyond `max_parked_per_user` or `max_parked_total` are
refused BACKPRESSURE (retryable), never dropped; matcher events always park
(hydrate-on-miss: a fill is never dropped). `HydrateUser` then creates the
actor at its log position and the parked commands apply in order; `known=false`
refuses them UNKNOWN_USER.

Fencing: a HydrateUser whose epoch is neither the requested one nor 0 (a
hydrate-ahead that nobody requested) is stale; one whose state is older than
the version this shard last flushed for the user (its tombstone) is a stale
read and is requested again; one for a resident user is redundant. All three
are dropped and counted: a live actor is never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable

from services.shard.core.actor import UserActor
from services.shard.core.commands import HydrateUser
from services.shard.core.dedup import as_recent, as_result, remember, within_horizon
from services.shard.core.egress import (
    ALERT_UNKNOWN_USER_EVENT,
    Egress,
    HydrateRequest,
    RiskAlert,
)
from services.shard.core.mailbox import mailbox_full
from services.shard.core.positions import Position
from services.shard.core.risk import NO_LIMITS
from services.shard.core.saga import parked, refused
from services.shard.core.shard_state import ParkedEvent, ParkedItem, PendingHydration, ShardState
from services.shard.core.user_state import (
    TRANSFER_PREFIX,
    PositionState,
    RecentResult,
    UserState,
)
from services.shard.core.vocabulary import INT64_MAX, RejectReason, UserTier

Replay = Callable[[ParkedItem, int, list[Egress]], None]
_TIERS = tuple(int(tier) for tier in UserTier)


class Hydration:
    def __init__(self, state: ShardState, replay: Replay) -> None:
        self.state = state
        self.replay = replay
        settings = state.settings
        self.max_parked_per_user = settings.max_parked_per_user
        self.max_parked_total = settings.max_parked_total
        self.horizon_ms = settings.dedup_horizon_ms

    def park(self, user_id: int, item: ParkedItem, now_ms: int, out: list[Egress]) -> None:
        state = self.state
        counters = state.counters
        pending = state.hydrations.get(user_id)
        if not isinstance(item, ParkedEvent) and mailbox_full(
            item,
            pending.client_commands if pending is not None else 0,
            state.parked_client_commands,
            self.max_parked_per_user,
            self.max_parked_total,
        ):
            counters.refused_backpressure += 1
            counters.refused_mailbox_full += 1
            out.append(refused(item.correlation_id, RejectReason.BACKPRESSURE, True))
            return
        if pending is None:
            pending = PendingHydration(state.next_epoch(), now_ms)
            state.hydrations[user_id] = pending
            counters.hydrations_requested += 1
            out.append(HydrateRequest(user_id, pending.epoch))
        pending.parked.append(item)
        counters.commands_parked += 1
        if isinstance(item, ParkedEvent):
            counters.matcher_events_parked += 1
        else:
            pending.client_commands += 1
            state.parked_client_commands += 1
            out.append(parked(item.correlation_id))

    def redrive(self, now_ms: int, redrive_after_ms: int, out: list[Egress]) -> None:
        """Ask again for hydrations nobody answered (at-least-once; the epoch is unchanged)."""
        for user_id, pending in self.state.hydrations.items():
            if now_ms - pending.requested_at_ms >= redrive_after_ms:
                pending.requested_at_ms = now_ms
                self.state.counters.hydrations_redriven += 1
                out.append(HydrateRequest(user_id, pending.epoch))

    def on_hydrate(self, command: HydrateUser, now_ms: int, out: list[Egress]) -> None:
        state = self.state
        counters = state.counters
        user_id = command.user_id
        if user_id in state.actors:
            counters.hydrations_redundant += 1
            return
        pending = state.hydrations.get(user_id)
        if pending is None and not state.owns(user_id):
            # Another shard owns the user now (or will, once its old owner let go):
            # only a hydration this shard asked for, for parked matcher events, lands.
            counters.hydrations_not_owned += 1
            return
        if pending is not None and command.epoch not in (0, pending.epoch):
            counters.hydrations_stale += 1
            return
        if not command.known:
            counters.hydrations_unknown += 1
            if pending is not None:
                self._refuse_parked(user_id, pending, out)
            return
        user_state = command.state
        if user_state is None or user_state_problem(user_state, user_id):
            counters.hydrations_malformed += 1
            return
        flushed = state.tombstones.get(user_id)
        if flushed is not None and user_state.db_version < flushed:
            counters.hydrations_stale += 1
            if pending is not None:
                pending.epoch = state.next_epoch()
                pending.requested_at_ms = now_ms
                counters.hydrations_requested += 1
                out.append(HydrateRequest(user_id, pending.epoch))
            return
        epoch = pending.epoch if pending is not None else state.next_epoch()
        actor = self.build_actor(user_state, epoch, now_ms)
        if state.machine_version >= 2:
            # Where the user's orders stood when it left here: a reconcile report from
            # before then is stale for the user back, as for one who never left.
            actor.event_sequences.update(state.tombstone_events.get(user_id, ()))
        self.admit(actor)
        counters.hydrations_completed += 1
        if pending is not None:
            del state.hydrations[user_id]
            state.parked_client_commands -= pending.client_commands
            for item in pending.parked:
                self.replay(item, now_ms, out)

    def admit(self, actor: UserActor) -> None:
        """Value arrives with the user: count it in, then make the actor resident."""
        state = self.state
        accounts = state.accounts
        for asset, total in actor.balances.items():
            if asset not in accounts.resident:
                accounts.add_asset(asset)
            accounts.resident[asset] += total
            accounts.hydrated_in[asset] += total
        for symbol in actor.positions:
            state.holders.setdefault(symbol, {})
        state.admit_actor(actor)
        dedup = state.dedup
        for client_order_id in actor.recent:
            dedup.insert(dedup.positions(actor.user_id, client_order_id))

    def build_actor(self, user_state: UserState, epoch: int, now_ms: int) -> UserActor:
        state = self.state
        actor = state.new_actor(user_state.user_id, epoch, user_state.tier, now_ms)
        actor.db_version = user_state.db_version
        actor.user_seq = user_state.user_seq
        for asset, total in user_state.balances:
            actor.balances[asset] = total
        for position in user_state.positions:
            actor.positions[position.symbol] = Position(
                position.quantity_lots, position.cost_basis, position.realized_pnl
            )
        horizon = self.horizon_ms
        settings = state.settings
        for result in sorted(user_state.recent, key=_recent_order):
            value = as_recent(result)
            if not within_horizon(value, now_ms, horizon):
                continue
            key = result.client_order_id
            if key.startswith(TRANSFER_PREFIX):
                transfer_id = key[len(TRANSFER_PREFIX) :]
                remember(
                    actor.transfers,
                    transfer_id,
                    value,
                    now_ms - horizon,
                    settings.max_transfers_per_user,
                )
            else:
                remember(actor.recent, key, value, now_ms - horizon, settings.max_recent_per_user)
        limits = user_state.risk_limits
        actor.limits = NO_LIMITS if limits == NO_LIMITS else limits
        actor.reduce_only = user_state.reduce_only
        actor.peak_equity = user_state.peak_equity
        actor.trading_halted = user_state.trading_halted
        actor.control_version = user_state.control_version
        actor.last_control_id = user_state.last_control_id
        return actor

    def _refuse_parked(self, user_id: int, pending: PendingHydration, out: list[Egress]) -> None:
        state = self.state
        del state.hydrations[user_id]
        state.parked_client_commands -= pending.client_commands
        for item in pending.parked:
            if isinstance(item, ParkedEvent):
                # Money the matcher moved for a user nobody knows: only people can fix that.
                state.counters.reconcile_impossible_states += 1
                state.counters.risk_alerts += 1
                event = item.event
                out.append(
                    RiskAlert(
                        user_id,
                        ALERT_UNKNOWN_USER_EVENT,
                        f"matcher event {event.sequence} for {event.order_id}: unknown user",
                    )
                )
            else:
                out.append(refused(item.correlation_id, RejectReason.UNKNOWN_USER))


def user_state_of(actor: UserActor, now_ms: int, horizon_ms: int) -> UserState:
    """The quiescent subset of a flat actor, for BeginDehydrate."""
    recent = [
        as_result(key, value)
        for key, value in actor.recent.items()
        if within_horizon(value, now_ms, horizon_ms)
    ]
    for transfer_id, value in actor.transfers.items():
        if within_horizon(value, now_ms, horizon_ms):
            recent.append(as_result(TRANSFER_PREFIX + transfer_id, value))
    return UserState(
        actor.user_id,
        actor.db_version,
        actor.tier,
        tuple(actor.balances.items()),
        tuple(
            PositionState(symbol, p.quantity_lots, p.cost_basis, p.realized_pnl)
            for symbol, p in actor.positions.items()
        ),
        actor.user_seq,
        tuple(recent),
        actor.limits,
        actor.reduce_only,
        actor.peak_equity,
        actor.trading_halted,
        actor.control_version,
        actor.last_control_id,
    )


def user_state_problem(user_state: UserState, user_id: int) -> str:
    """Why a hydrated state cannot become an actor, or ''."""
    if user_state.user_id != user_id:
        return f"state of user {user_state.user_id} in a hydration of {user_id}"
    if user_state.db_version < 0 or not 0 <= user_state.user_seq <= INT64_MAX:
        return "negative version or sequence"
    if user_state.tier not in _TIERS:
        return f"unknown tier {user_state.tier}"
    assets: dict[str, None] = {}
    for asset, total in user_state.balances:
        if not asset or asset in assets or not 0 <= total <= INT64_MAX:
            return f"balance {asset!r}: {total}"
        assets[asset] = None
    symbols: dict[str, None] = {}
    for position in user_state.positions:
        if not position.symbol or position.symbol in symbols:
            return f"position {position.symbol!r} listed twice or unnamed"
        symbols[position.symbol] = None
    if user_state.risk_limits.problems():
        return "; ".join(user_state.risk_limits.problems())
    return ""


def _recent_order(result: RecentResult) -> tuple[int, str]:
    # Oldest first, so the exact map's insertion order is its age order.
    return (result.accepted_at_ms, result.client_order_id)
