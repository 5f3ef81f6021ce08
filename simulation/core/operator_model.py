"""An operator at the admin API while users trade: halts, risk limits, restarts.

The operator's commands are the real shard commands (`UserControl`, `SetRiskLimits`,
decided by `services/shard/core/operator_controls.py` inside the real machine), sent
as the admin API sends them (`gateway/user_admin.py`): to the user's owner, with the
request's id and pinned to the user's control version read before the first send
(its actor on the owner's leader, else its stored row). An answer lost or late is
sent again as the same request; a refusal CONTROL_VERSION_STALE (another control came
between) is read again and sent as a new request while it is still wanted. By seed,
every few hundred ms, for one user: a trading halt, lifted a while later; tight risk
limits (one open order, a small notional), cleared a while later; or a restart of its
actor (refused `USER_NOT_FLAT` while it has open orders). While settling every halt
and limit still on is lifted.

Each decision leaves an `OperatorAudit` item that the persister writes as an
`admin_audit` row keyed by its log position. Checked after settling: every accepted
answer the operator got has its row (a row whose answer was lost is there too), no
row beyond the copies of its commands a leader took (none the log did not decide,
none written twice), no request changing a user twice (copies after the first are
answered as `duplicate`), and no user is left halted or limited. Before requests had
ids and versions, a late copy of a halt was decided after the resume that followed
it and left the user halted (seed 852 then; planted again by `--defect operator-unpinned`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.shard.core.commands import Command, SetRiskLimits, UserControl
from services.shard.core.egress import (
    AUDIT_HALT_TRADING,
    AUDIT_RESTART,
    AUDIT_RESUME_TRADING,
    AUDIT_SET_RISK_LIMITS,
    ShardResult,
)
from services.shard.core.risk import NO_LIMITS, RiskLimits
from services.shard.core.vocabulary import RejectReason, UserControlAction
from simulation.core.defects import OPERATOR_UNPINNED
from simulation.core.faults import OPERATOR

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

OPERATE_EVERY_MS = (300, 2_000)
LIFT_AFTER_MS = (200, 1_500)
DEADLINE_MS = 2_000
RETRY_PAUSE_MS = 50
TIGHT = RiskLimits(max_order_notional=50_000_000_000, max_open_orders=1)
NAME = "sim-operator"


@dataclass(slots=True)
class OperatorCommand:
    user_id: int
    action: str  # an AUDIT_* action name
    control: int  # UserControlAction, or 0 for limits
    limits: RiskLimits | None
    request_id: str = ""  # the same on every send of one request
    pinned: int | None = None  # the control version read before its first send
    correlation_id: int = 0


class SimOperator:
    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.outstanding: dict[int, OperatorCommand] = {}  # correlation -> command
        self.on: dict[int, str] = {}  # user -> the halt or limits sent, until lifted
        self.confirmed: set[int] = set()  # users whose halt or limits were accepted
        self.sent: Counter[tuple[int, str]] = Counter()  # (user, action) commands sent
        # Copies a leader took: a link may duplicate a call, and each copy is decided.
        self.delivered: Counter[tuple[int, str]] = Counter()
        self.accepted: Counter[tuple[int, str]] = Counter()  # accepted answers received
        self.refused = 0
        self.stale = 0  # refused CONTROL_VERSION_STALE, then read again and sent anew
        self.requests = 0
        self.retrying = 0  # commands waiting out RETRY_PAUSE_MS before they are sent again
        if world.plan.on(OPERATOR):  # absent otherwise: runs without it stay as they were
            world.scheduler.after(world.rng.randrange(*OPERATE_EVERY_MS), "operator", self._act)

    @property
    def idle(self) -> bool:
        return not self.outstanding and not self.on and not self.retrying

    def _act(self) -> None:
        world = self.world
        world.scheduler.after(world.rng.randrange(*OPERATE_EVERY_MS), "operator", self._act)
        if world.clients.settling or not world.plan.on(OPERATOR):
            return
        users = [user for user in world.clients.users if user not in self.on]
        if not users:
            return
        user = users[world.rng.randrange(len(users))]
        choice = world.rng.randrange(3)
        if choice == 0:
            halt = UserControlAction.HALT_TRADING
            command = OperatorCommand(user, AUDIT_HALT_TRADING, halt, None)
        elif choice == 1:
            command = OperatorCommand(user, AUDIT_SET_RISK_LIMITS, 0, TIGHT)
        else:
            command = OperatorCommand(user, AUDIT_RESTART, UserControlAction.RESTART, None)
        world.faults.note(world.scheduler.now_ms, OPERATOR, f"{command.action} user {user}")
        if choice < 2:
            self.on[user] = command.action  # lifted a while after it is accepted
        self._send(command)

    def _lift(self, user: int) -> None:
        if user not in self.confirmed:
            return
        self.confirmed.discard(user)
        action = self.on.pop(user, None)
        if action == AUDIT_HALT_TRADING:
            control = UserControlAction.RESUME_TRADING
            self._send(OperatorCommand(user, AUDIT_RESUME_TRADING, control, None))
        elif action == AUDIT_SET_RISK_LIMITS:
            self._send(OperatorCommand(user, AUDIT_SET_RISK_LIMITS, 0, NO_LIMITS))

    def settle_round(self) -> None:
        """Lift what is on (once accepted): the settled mesh trades freely."""
        for user in sorted(self.confirmed):
            self._lift(user)

    # --- sending and answers ------------------------------------------------------------

    def _send(self, command: OperatorCommand) -> None:
        world = self.world
        if not command.request_id and world.config.defect != OPERATOR_UNPINNED:
            self.requests += 1
            command.request_id = f"{NAME}-{self.requests}"
            command.pinned = self._control_version(command.user_id)
        correlation = world.new_correlation()
        command.correlation_id = correlation
        key = (command.user_id, command.action)

        def delivered() -> None:
            self.delivered[key] += 1

        if not world.send_to_shard(command.user_id, self._build(command, correlation), delivered):
            self._send_later(command)
            return
        self.sent[key] += 1
        self.outstanding[correlation] = command
        world.scheduler.after(
            DEADLINE_MS, f"deadline {correlation}", lambda: self._deadline(correlation)
        )

    def _control_version(self, user_id: int) -> int:
        """What the admin API reads: the actor on the owner's leader, else the row."""
        actor = self.world.resident_actor(user_id)
        if actor is not None:
            return int(actor.control_version)
        return self.world.store.users[user_id].state.control_version

    @staticmethod
    def _build(command: OperatorCommand, correlation: int) -> Command:
        user, request, pinned = command.user_id, command.request_id, command.pinned
        if command.limits is not None:
            clear = command.limits == NO_LIMITS
            limits = command.limits
            return SetRiskLimits(correlation, user, limits, clear, NAME, "", request, pinned)
        return UserControl(correlation, user, command.control, NAME, "simulated", request, pinned)

    def _send_later(self, command: OperatorCommand) -> None:
        """Sent again after a pause, and busy meanwhile: a mesh is not settled while a lift
        waits to go out (seed 877 of a 1,000-seed run once judged a user left halted
        while its resume, refused stale, waited to be sent anew: the model's defect)."""
        self.retrying += 1

        def again() -> None:
            self.retrying -= 1
            self._send(command)

        self.world.scheduler.after(RETRY_PAUSE_MS, "operator retry", again)

    def _deadline(self, correlation: int) -> None:
        command = self.outstanding.pop(correlation, None)
        if command is not None:
            self._send(command)  # the same request: the lost copy may have been decided

    def on_result(self, result: ShardResult) -> bool:
        """True if the answer was the operator's."""
        command = self.outstanding.get(result.correlation_id)
        if command is None:
            return False
        if result.parked:
            return True  # the final answer follows
        del self.outstanding[result.correlation_id]
        user, world = command.user_id, self.world
        lifting = command.action == AUDIT_RESUME_TRADING or command.limits == NO_LIMITS
        if result.accepted:
            self.accepted[(user, command.action)] += 1
            if not lifting and self.on.get(user) == command.action and user not in self.confirmed:
                self.confirmed.add(user)
                world.scheduler.after(
                    world.rng.randrange(*LIFT_AFTER_MS), "operator lift", lambda: self._lift(user)
                )
        elif result.retryable:
            self._send_later(command)
        elif result.reject_reason == RejectReason.CONTROL_VERSION_STALE and (
            lifting or self.on.get(user) == command.action
        ):
            # Another control came between: read the user again and decide anew.
            self.stale += 1
            command.request_id, command.pinned = "", None
            self._send_later(command)
        else:
            self.refused += 1
            # Only the refused command's own mark: a restart refused while a halt for the
            # same user is on its way must not forget the halt (it may yet be accepted).
            if not lifting and user not in self.confirmed and self.on.get(user) == command.action:
                del self.on[user]
        return True

    # --- the checks after settling --------------------------------------------------------

    def check_lifted(self) -> None:
        """Every halt and limit was lifted while settling: no user, resident or stored,
        is left halted or limited (a lift lost between owners would show here)."""
        world = self.world
        for user in world.clients.users:
            actor = world.resident_actor(user)
            if actor is not None:
                halted, limits = actor.trading_halted, actor.limits
            else:
                stored = world.store.users[user].state
                halted, limits = stored.trading_halted, stored.risk_limits
            if halted or limits != NO_LIMITS:
                world.violation(
                    "operator-lift", f"user {user}: halted {halted}, limits {limits.named()}"
                )

    def check_audit_rows(self) -> None:
        """Every accepted answer has its `admin_audit` row; no row beyond the copies a
        leader took (no row the log did not decide, none written twice)."""
        world = self.world
        rows: Counter[tuple[int, str]] = Counter()
        # Request id -> decisions that changed the user (each adds a control version;
        # a restart of a user no shard holds, or one already on its way out, changes
        # nothing, and a copy of a request decided already is answered as `duplicate`).
        changed: Counter[str] = Counter()
        for audit in world.store.audits.values():
            if audit.accepted and audit.operator == NAME:
                rows[(audit.user_id, audit.action)] += 1
                detail = json.loads(audit.detail)
                if detail.get("duplicate"):
                    world.figures["operator_copies_answered"] += 1
                elif "control_version" in detail and detail.get("request_id"):
                    changed[detail["request_id"]] += 1
        world.figures["operator_audit_rows"] += sum(rows.values())
        for request_id, count in sorted(changed.items()):
            if count > 1:
                detail = f"request {request_id} changed a user {count} times"
                world.violation("operator-twice", detail)
        for key in sorted(set(self.accepted) | set(rows)):
            if not self.accepted[key] <= rows[key] <= self.delivered[key]:
                world.violation(
                    "operator-audit",
                    f"user {key[0]} {key[1]}: {self.accepted[key]} accepted answers, "
                    f"{rows[key]} audit rows, {self.sent[key]} sent, "
                    f"{self.delivered[key]} taken by a leader",
                )
