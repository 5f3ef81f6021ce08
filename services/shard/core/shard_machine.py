"""The user shard as a replicated state machine (`services.runtime.core.StateMachine`).

`apply` decodes a `ShardCommandBatch` and applies each command in order;
`apply_commands` does the same for already-decoded commands. Egress is a list
of core records (`egress`); `codec.egress_to_protobuf` turns them into
`oms.v1.ShardEgress`.

Refusals change nothing. A client command refused for bad input (static
checks, before the user is looked up) or for the user's state (halted, rate
limited, backpressure, risk, funds, unknown or finished order, duplicate)
leaves every hashed field as it was: no recency touch, no token taken, no
dedup entry, so `state_hash()` before and after is equal. Only statistics
counters move, and they are outside the hash. The price: a refused command is
not "activity", so it neither keeps a user resident nor cancels an eviction in
progress (the flushed state is still exact, and the DB keeps the dedup map).

Supervision boundary: each client command and each matcher event runs in its
own try block; an exception discards the egress that message had produced and
goes to `Supervisor` (resume, quarantine, halt) for that user only. A broken
shard-level invariant (conservation) is not supervised: it raises out of the
machine, crash-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from services.routing.core.routing_document import RoutingDocument, RoutingDocumentError
from services.runtime.core.state_machine import ApplyContext
from services.shard.core import digest, snapshot, versions
from services.shard.core.actor import (
    DEHYDRATING,
    HALTED,
    HEALTHY,
    QUARANTINED,
    UserActor,
    check_actor,
    check_balances,
)
from services.shard.core.balances import Funding
from services.shard.core.codec import decode_command_batch
from services.shard.core.commands import (
    CancelAllAfter,
    CancelAllOrders,
    CancelOrder,
    ClientCommand,
    Command,
    DedupAnswer,
    Deposit,
    EndSession,
    FlushComplete,
    FlushRefused,
    HydrateUser,
    KeepSession,
    MalformedCommand,
    MarkPrices,
    MatcherEvent,
    MatcherEvents,
    Persisted,
    PlaceOrder,
    Reconcile,
    SetRiskLimits,
    SetRouting,
    UserControl,
    Withdraw,
)
from services.shard.core.egress import CancelToMatcher, Egress, ShardResult, SubmitToMatcher
from services.shard.core.errors import MalformedCommandError, OrderIndexError
from services.shard.core.eviction import EvictionSweep
from services.shard.core.hydration import Hydration, user_state_problem
from services.shard.core.operator_controls import USER_CONTROL_ACTIONS, OperatorControls
from services.shard.core.orders import parse_order_id
from services.shard.core.ownership import Ownership
from services.shard.core.reconcile import ReconcileEngine
from services.shard.core.saga import OrderSaga, refused
from services.shard.core.settings import ShardSettings
from services.shard.core.settlement import Settlement
from services.shard.core.shard_state import ParkedEvent, ParkedItem, ShardState
from services.shard.core.statistics import COUNTER_NAMES, ShardStatistics, SweepStatistics
from services.shard.core.supervision import Supervisor
from services.shard.core.user_state import UserState
from services.shard.core.vocabulary import PENDING, RejectReason, UserControlAction

_MALFORMED = int(RejectReason.MALFORMED)
_NOT_OWNER = int(RejectReason.NOT_OWNER)
_UNKNOWN_SYMBOL = int(RejectReason.UNKNOWN_SYMBOL)
_INVALID_TIMEOUT = int(RejectReason.INVALID_TIMEOUT)
# A dead man's switch's (and a session's) timeout: shorter than a failover (about 2 s)
# fires it by the failover alone; longer than a day is not a dead man's switch.
MIN_SWITCH_TIMEOUT_MS = 1_000
MAX_SWITCH_TIMEOUT_MS = 86_400_000
ClientAction = Callable[[UserActor, Any, int, list[Egress]], None]


class ShardMachine:
    def __init__(self, settings: ShardSettings) -> None:
        self.settings = settings
        self._install(ShardState(settings))

    def _install(self, state: ShardState) -> None:
        self.state = state
        self.saga = OrderSaga(state)
        self.settlement = Settlement(state)
        self.funding = Funding(state)
        self.hydration = Hydration(state, self._replay)
        self.eviction = EvictionSweep(state)
        self.ownership = Ownership(state, self.eviction)
        self.ownership.recompute()
        self.reconciler = ReconcileEngine(state, self.settlement)
        self.supervisor = Supervisor(state)
        self.controls = OperatorControls(state, self.eviction)
        self._next_rotation_ms = (state.dedup.session + 1) * self.settings.dedup_session_ms
        self._since_conservation_check = 0
        self._actions: dict[type, ClientAction] = {
            PlaceOrder: self.saga.place,
            CancelOrder: self.saga.cancel,
            CancelAllOrders: self.saga.cancel_all,
            CancelAllAfter: self.saga.cancel_all_after,
            KeepSession: self.saga.keep_session,
            EndSession: self.saga.end_session,
            Deposit: self.funding.deposit,
            Withdraw: self.funding.withdraw,
            SetRiskLimits: self.controls.set_risk_limits,
            UserControl: self.controls.control,
        }
        self._handlers: dict[type, Callable[[Any, int, list[Egress]], None]] = {
            PlaceOrder: self._on_place,
            CancelOrder: self._on_cancel,
            CancelAllOrders: self._on_cancel_all,
            CancelAllAfter: self._on_cancel_all_after,
            KeepSession: self._on_keep_session,
            EndSession: self._on_end_session,
            Deposit: self._on_transfer,
            Withdraw: self._on_transfer,
            MatcherEvents: self._on_matcher_events,
            HydrateUser: self._on_hydrate,
            FlushComplete: self._on_flush_complete,
            FlushRefused: self._on_flush_refused,
            MarkPrices: self._on_mark_prices,
            Reconcile: self._on_reconcile,
            DedupAnswer: self._on_dedup_answer,
            SetRiskLimits: self._on_set_risk_limits,
            UserControl: self._on_user_control,
            SetRouting: self._on_set_routing,
            Persisted: self._on_persisted,
            MalformedCommand: self._on_malformed,
        }

    # --- StateMachine -----------------------------------------------------------------

    def apply(self, command: bytes, context: ApplyContext) -> list[Egress]:
        try:
            commands = decode_command_batch(command)
        except MalformedCommandError:
            self.state.counters.malformed_commands += 1
            return [refused(0, _MALFORMED)]
        return self.apply_commands(commands, context.consensus_time_ms)

    def apply_commands(self, commands: Sequence[Command], consensus_time_ms: int) -> list[Egress]:
        """Apply decoded commands in order at one consensus time; return their egress."""
        now = self._advance_clock(consensus_time_ms)
        out: list[Egress] = []
        handlers = self._handlers
        for command in commands:
            handler = handlers.get(type(command))
            if handler is None:
                self._on_malformed(MalformedCommand(0, f"not a command: {command!r}"), now, out)
                continue
            handler(command, now, out)
        state = self.state
        state.counters.commands_applied += len(commands)
        interval = self.settings.conservation_check_interval
        if interval:
            self._since_conservation_check += len(commands)
            if self._since_conservation_check >= interval:
                self._since_conservation_check = 0
                state.accounts.check_conservation()
        return out

    def on_timer(self, context: ApplyContext) -> list[Egress]:
        now = self._advance_clock(context.consensus_time_ms)
        out: list[Egress] = []
        redrive_after = self.settings.redrive_after_ms
        self.hydration.redrive(now, redrive_after, out)
        self.saga.redrive_lookups(now, redrive_after, out)
        self.saga.fire_switches(now, out)
        self.saga.expire_sessions(now, out)
        self.eviction.sweep(now, out)
        self.eviction.valve(now, out)
        if self.state.leaving:
            self.ownership.evict_leaving(now, out)
        return out

    # --- versions (services/runtime/core/state_machine.py) ----------------------------

    @property
    def version(self) -> int:
        return self.state.machine_version

    @property
    def implemented_versions(self) -> frozenset[int]:
        return versions.IMPLEMENTED_VERSIONS

    def activate_version(self, version: int) -> None:
        self.state.machine_version = version

    def snapshot(self) -> bytes:
        return snapshot.encode(self.state)

    def restore(self, data: bytes) -> None:
        state = ShardState(self.settings)
        snapshot.decode_into(state, data)
        self._install(state)
        self.check_invariants()  # check what was loaded, as when it was applied

    def state_hash(self) -> bytes:
        return digest.state_hash(self.state)

    # --- reading --------------------------------------------------------------------

    def statistics(self) -> ShardStatistics:
        state = self.state
        counters = state.counters
        return ShardStatistics(
            resident_users=len(state.actors),
            dehydrating_users=state.dehydrating,
            hydrating_users=len(state.hydrations),
            parked_commands=state.parked_client_commands,
            dedup_waiting_users=len(state.dedup_waits),
            in_flight_submits=len(state.pending_submits),
            in_flight_cancels=len(state.pending_cancels),
            deferred_reconciles=len(state.deferred_reconciles),
            quarantined_users=state.quarantined,
            halted_users=state.halted,
            last_sweep=state.last_sweep,
            counters=tuple(zip(COUNTER_NAMES, counters.plain(), strict=True)),
            routing_epoch=state.routing.epoch if state.routing is not None else 0,
            leaving_users=len(state.leaving),
            persisted_through=state.persisted_through,
            armed_switches=len(state.switches),
        )

    @property
    def last_sweep(self) -> SweepStatistics:
        return self.state.last_sweep

    def actor(self, user_id: int) -> UserActor | None:
        """Read access for tests and queries; never mutate what it returns."""
        return self.state.actors.get(user_id)

    def in_flight_egress(self) -> list[SubmitToMatcher | CancelToMatcher]:
        """Every saga in flight, for the bridge to re-drive after a failover."""
        state = self.state
        out: list[SubmitToMatcher | CancelToMatcher] = []
        for order_id, user_id in state.pending_submits.items():
            order = state.actors[user_id].orders[order_id]
            out.append(SubmitToMatcher(order.matcher_group, order_id, order.request))
        for order_id, user_id in state.pending_cancels.items():
            order = state.actors[user_id].orders[order_id]
            out.append(CancelToMatcher(order.matcher_group, order_id, user_id))
        return out

    def check_invariants(self) -> None:
        """Every invariant, walking every actor: for tests and after a restore.

        Raises the specific `ShardInvariantError` subclass that is broken. A
        quarantined or halted actor is only checked for negative balances: it
        failed its own check already and supervision contains it.
        """
        state = self.state
        state.accounts.check_conservation()
        state.accounts.check_resident_totals(actor.balances for actor in state.actors.values())
        dehydrating = quarantined = halted = 0
        live_submits = live_cancels = 0
        for user_id, actor in state.actors.items():
            if actor.user_id != user_id:
                raise OrderIndexError(f"actor {actor.user_id} is filed under {user_id}")
            if actor.health == HEALTHY:
                check_actor(actor, state.pending_submits, state.pending_cancels)
            else:
                # Already failed its own check and is contained; its money still counts.
                check_balances(actor)
            dehydrating += actor.lifecycle == DEHYDRATING
            quarantined += actor.health == QUARANTINED
            halted += actor.health == HALTED
            for order in actor.orders.values():
                live_submits += order.status == PENDING
                live_cancels += order.cancel_in_flight
            if (actor.dedup_wait is not None) != (user_id in state.dedup_waits):
                raise OrderIndexError(f"user {user_id}: dedup wait registry disagrees")
            if state.switches.get(user_id, 0) != actor.cancel_all_at_ms:
                raise OrderIndexError(f"user {user_id}: dead man's switch registry disagrees")
            for session_id, expires_ms in actor.sessions.items():
                if state.sessions.get((user_id, session_id)) != expires_ms:
                    raise OrderIndexError(f"user {user_id}: session registry disagrees")
            if user_id in state.hydrations:
                raise OrderIndexError(f"user {user_id} is resident and waiting for hydration")
            for symbol, position in actor.positions.items():
                holding = user_id in state.holders.get(symbol, {})
                if holding != bool(position.quantity_lots):
                    raise OrderIndexError(f"user {user_id}: holders index of {symbol} disagrees")
        if not state.switches.keys() <= state.actors.keys():
            raise OrderIndexError("a dead man's switch of a user who is not resident")
        if len(state.sessions) != sum(len(actor.sessions) for actor in state.actors.values()):
            raise OrderIndexError("the session registry holds sessions no actor has")
        if live_submits != len(state.pending_submits) or live_cancels != len(state.pending_cancels):
            raise OrderIndexError("saga registries hold orders no actor has")
        if (dehydrating, quarantined, halted) != (
            state.dehydrating,
            state.quarantined,
            state.halted,
        ):
            raise OrderIndexError("lifecycle counts disagree with the actors")
        parked = sum(p.client_commands for p in state.hydrations.values())
        for user_id in state.dedup_waits:
            wait = state.actors[user_id].dedup_wait
            parked += len(wait.parked) if wait is not None else 0
        if parked != state.parked_client_commands:
            raise OrderIndexError("parked command count disagrees with the parked commands")
        last = 0
        for actor in state.actors.values():
            if actor.recency_seq <= last:
                raise OrderIndexError("recency order and recency stamps disagree")
            last = actor.recency_seq

    # --- bulk residency (benchmarks, migrations in tests) ---------------------------

    def bulk_hydrate(self, states: Iterable[UserState], consensus_time_ms: int) -> int:
        """Make users resident without egress, as a run of HydrateUser(known) would.

        For benchmarks and tests that need many resident users quickly; not part
        of the logged protocol. Users already resident or waiting are skipped.
        """
        now = self._advance_clock(consensus_time_ms)
        state = self.state
        admitted = 0
        for user_state in states:
            user_id = user_state.user_id
            if user_id in state.actors or user_id in state.hydrations:
                continue
            if user_state_problem(user_state, user_id):
                raise ValueError(f"user {user_id}: {user_state_problem(user_state, user_id)}")
            actor = self.hydration.build_actor(user_state, state.next_epoch(), now)
            self.hydration.admit(actor)
            state.counters.hydrations_completed += 1
            admitted += 1
        return admitted

    # --- time ------------------------------------------------------------------------

    def _advance_clock(self, consensus_time_ms: int) -> int:
        state = self.state
        now = consensus_time_ms if consensus_time_ms > state.now_ms else state.now_ms
        state.now_ms = now
        if now >= self._next_rotation_ms:
            rotated = state.dedup.rotate_to(now)
            state.counters.dedup_rotations += rotated
            self._next_rotation_ms = (state.dedup.session + 1) * self.settings.dedup_session_ms
        return now

    # --- client commands -------------------------------------------------------------

    def _not_owner(self, command: ClientCommand, out: list[Egress]) -> bool:
        """Refuse (NOT_OWNER, with the shard's epoch) a command for a user the routing
        document gives to another shard; nothing changes. Checked before anything else:
        the user's state here, if any, is not the one that counts."""
        state = self.state
        routing = state.routing
        if routing is None or state.owns(command.user_id):
            return False
        self.state.counters.refused_not_owner += 1
        out.append(
            ShardResult(
                command.correlation_id, False, _NOT_OWNER, 0, True, routing_epoch=routing.epoch
            )
        )
        return True

    def _on_set_routing(self, command: SetRouting, now: int, out: list[Egress]) -> None:
        """A newer epoch decides ownership from here on; an older or equal one, or a
        document that does not decode, changes nothing."""
        state = self.state
        try:
            document = RoutingDocument.decode(command.document)
        except RoutingDocumentError:
            state.counters.routing_documents_refused += 1
            out.append(refused(command.correlation_id, _MALFORMED))
            return
        current = state.routing.epoch if state.routing is not None else 0
        if document.epoch <= current:
            state.counters.routing_documents_stale += 1
        else:
            state.routing, state.routing_raw = document, document.encode()
            state.counters.routing_epochs += 1
            self.ownership.on_new_document(now, out)
        out.append(
            ShardResult(command.correlation_id, True, routing_epoch=max(current, document.epoch))
        )

    def _on_persisted(self, command: Persisted, now: int, out: list[Egress]) -> None:
        """The persister's cursor moved on; an older report (a re-sent one) changes nothing."""
        state = self.state
        state.persisted_through = max(state.persisted_through, command.through_position)

    @property
    def egress_floor(self) -> int | None:
        """The last log position whose egress PostgreSQL holds, as far as this log says:
        the persister resumes after it, so egress after it must stay reproducible. None
        until the persister first reports (a shard run without one holds nothing back)."""
        return self.state.persisted_through or None

    def _on_place(self, command: PlaceOrder, now: int, out: list[Egress]) -> None:
        if command.session_id and self.state.machine_version < 3:
            # A build without sessions ignores the field: so does this one before 3.
            command = command._replace(session_id=0)
        if self._not_owner(command, out):
            return
        reason = self.saga.place_problem(command, now)
        if reason:
            self.state.counters.orders_refused += 1
            out.append(refused(command.correlation_id, reason))
            return
        self._to_actor(command, now, out)

    def _on_cancel(self, command: CancelOrder, now: int, out: list[Egress]) -> None:
        if self._not_owner(command, out):
            return
        reason = self.saga.cancel_problem(command)
        if reason:
            out.append(refused(command.correlation_id, reason))
            return
        self._to_actor(command, now, out)

    def _taken_from_version_3(
        self,
        command: CancelAllOrders | CancelAllAfter | KeepSession | EndSession,
        now: int,
        out: list[Egress],
    ) -> bool:
        """A command version 3 added: before it, refused as a build without it decides
        (its oneof unknown: MALFORMED); then the owner check every client command gets."""
        if self.state.machine_version < 3:
            self._on_malformed(MalformedCommand(command.correlation_id, "no command set"), now, out)
            return False
        return not self._not_owner(command, out)

    def _on_cancel_all(self, command: CancelAllOrders, now: int, out: list[Egress]) -> None:
        if not self._taken_from_version_3(command, now, out):
            return
        if command.symbol and command.symbol not in self.state.symbols:
            out.append(refused(command.correlation_id, _UNKNOWN_SYMBOL))
            return
        self._to_actor(command, now, out)

    def _on_cancel_all_after(self, command: CancelAllAfter, now: int, out: list[Egress]) -> None:
        if not self._taken_from_version_3(command, now, out):
            return
        timeout_ms = command.timeout_ms
        if timeout_ms and not MIN_SWITCH_TIMEOUT_MS <= timeout_ms <= MAX_SWITCH_TIMEOUT_MS:
            out.append(refused(command.correlation_id, _INVALID_TIMEOUT))
            return
        self._to_actor(command, now, out)

    def _on_keep_session(self, command: KeepSession, now: int, out: list[Egress]) -> None:
        if not self._taken_from_version_3(command, now, out):
            return
        if not command.session_id:
            out.append(refused(command.correlation_id, _MALFORMED))
            return
        if not MIN_SWITCH_TIMEOUT_MS <= command.timeout_ms <= MAX_SWITCH_TIMEOUT_MS:
            out.append(refused(command.correlation_id, _INVALID_TIMEOUT))
            return
        self._to_actor(command, now, out)

    def _on_end_session(self, command: EndSession, now: int, out: list[Egress]) -> None:
        if not self._taken_from_version_3(command, now, out):
            return
        if not command.session_id:
            out.append(refused(command.correlation_id, _MALFORMED))
            return
        self._to_actor(command, now, out)

    def _on_transfer(self, command: Deposit | Withdraw, now: int, out: list[Egress]) -> None:
        if self._not_owner(command, out):
            return
        reason = self.funding.transfer_problem(command)
        if reason:
            out.append(refused(command.correlation_id, reason))
            return
        self._to_actor(command, now, out)

    def _on_set_risk_limits(self, command: SetRiskLimits, now: int, out: list[Egress]) -> None:
        if self._not_owner(command, out):
            return
        if command.limits.problems():
            out.append(refused(command.correlation_id, _MALFORMED))
            return
        self._to_actor(command, now, out)

    def _on_user_control(self, command: UserControl, now: int, out: list[Egress]) -> None:
        if self._not_owner(command, out):
            return
        if command.action not in USER_CONTROL_ACTIONS or not command.user_id:
            out.append(refused(command.correlation_id, _MALFORMED))
            return
        if command.action == UserControlAction.RESTART and command.user_id not in self.state.actors:
            self.controls.restart_absent(command, out)
            return
        self._to_actor(command, now, out)

    def _to_actor(self, command: ClientCommand, now: int, out: list[Egress]) -> None:
        """Route a statically valid client command: park it, queue it, or apply it."""
        state = self.state
        actor = state.actors.get(command.user_id)
        if actor is None:
            self.hydration.park(command.user_id, command, now, out)
            return
        if actor.dedup_wait is not None:
            self.saga.park_behind(actor, command, now, out)
            return
        mark = len(out)
        try:
            self._actions[type(command)](actor, command, now, out)
        except Exception as error:  # the supervision boundary: this user only
            del out[mark:]
            self.supervisor.on_failure(actor.user_id, error, now, out, command.correlation_id)

    def _replay(self, item: ParkedItem, now: int, out: list[Egress]) -> None:
        """A parked command's turn: static checks already passed when it was logged."""
        if isinstance(item, ParkedEvent):
            self._route_event(item.matcher_group, item.event, now, out)
            return
        self._to_actor(item, now, out)

    def _on_dedup_answer(self, command: DedupAnswer, now: int, out: list[Egress]) -> None:
        state = self.state
        actor = state.actors.get(command.user_id)
        commands = self.saga.end_dedup_wait(actor, command) if actor is not None else None
        if actor is None or commands is None:
            state.counters.dedup_answers_stale += 1
            return
        first = commands[0]
        mark = len(out)
        try:
            if not isinstance(first, PlaceOrder):
                raise OrderIndexError("a dedup wait must start with its place")
            self.saga.resolve_dedup(actor, first, command, now, out)
        except Exception as error:
            del out[mark:]
            self.supervisor.on_failure(actor.user_id, error, now, out, first.correlation_id)
        for later in commands[1:]:
            self._to_actor(later, now, out)

    # --- matcher events ----------------------------------------------------------------

    def _on_matcher_events(self, command: MatcherEvents, now: int, out: list[Egress]) -> None:
        state = self.state
        counters = state.counters
        group = command.matcher_group
        shard_id = state.shard_id
        sequences = state.sequences
        last = sequences.get(group, 0)
        advanced = False
        for event in command.events:
            if event.oms_shard != shard_id:
                counters.matcher_events_foreign += 1
                continue
            sequence = event.sequence
            if sequence <= last:
                counters.matcher_events_duplicate += 1
                continue
            if sequence != last + 1:
                counters.matcher_sequence_gaps += 1
            last = sequence
            sequences[group] = sequence
            advanced = True
            counters.matcher_events_applied += 1
            self._route_event(group, event, now, out)
        if advanced and state.deferred_reconciles:
            for report in self.reconciler.ready(group):
                self._reconcile(report, now, out)

    def _route_event(self, group: str, event: MatcherEvent, now: int, out: list[Egress]) -> None:
        state = self.state
        actor = state.actors.get(event.user_id)
        if actor is None:
            parsed = parse_order_id(event.order_id)
            if parsed is None or parsed[1] != event.user_id:
                state.counters.matcher_events_foreign += 1
                return
            self.hydration.park(event.user_id, ParkedEvent(group, event), now, out)
            return
        actor.event_sequences[group] = event.sequence
        state.mark_dirty(actor)
        mark = len(out)
        try:
            self.settlement.apply(actor, event, now, out)
        except Exception as error:  # the supervision boundary: this user only
            del out[mark:]
            self.supervisor.on_failure(actor.user_id, error, now, out, None)

    # --- persister, marks, reconciler ---------------------------------------------------

    def _on_hydrate(self, command: HydrateUser, now: int, out: list[Egress]) -> None:
        self.hydration.on_hydrate(command, now, out)
        self.eviction.valve(now, out)

    def _on_flush_complete(self, command: FlushComplete, now: int, out: list[Egress]) -> None:
        self.eviction.on_flush_complete(command, out)

    def _on_flush_refused(self, command: FlushRefused, now: int, out: list[Egress]) -> None:
        self.eviction.on_flush_refused(command, out)

    def _on_reconcile(self, command: Reconcile, now: int, out: list[Egress]) -> None:
        if self.reconciler.defer(command):
            return
        self._reconcile(command, now, out)

    def _reconcile(self, command: Reconcile, now: int, out: list[Egress]) -> None:
        mark = len(out)
        try:
            self.reconciler.apply(command, now, out)
        except Exception as error:  # the supervision boundary: this user only
            del out[mark:]
            self.supervisor.on_failure(command.user_id, error, now, out, None)

    def _on_mark_prices(self, command: MarkPrices, now: int, out: list[Egress]) -> None:
        """New marks; drawdown is re-measured for holders with a drawdown limit.

        A dehydrating actor is left alone: it is idle, and moving its peak would
        make the state being flushed stale for nothing.
        """
        state = self.state
        for symbol, price in command.prices:
            if symbol not in state.symbols or price <= 0:
                continue
            state.marks[symbol] = price
            if symbol not in state.settlement_symbols:
                continue
            for user_id in list(state.holders[symbol]):
                actor = state.actors[user_id]
                if actor.lifecycle == DEHYDRATING or not actor.limits.max_drawdown:
                    continue
                mark = len(out)
                try:
                    self.settlement.check_drawdown(actor, out)
                except Exception as error:
                    del out[mark:]
                    self.supervisor.on_failure(user_id, error, now, out, None)

    def _on_malformed(self, command: MalformedCommand, now: int, out: list[Egress]) -> None:
        self.state.counters.malformed_commands += 1
        out.append(refused(command.correlation_id, _MALFORMED))
