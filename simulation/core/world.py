"""The simulated mesh for one seed: its processes, its faults, and its checks.

`run(config)` builds the world, runs `config.steps` scheduler steps with faults, then
settles it (faults off, every process back, every open order cancelled, the
write-behind caught up) and audits it. The same config gives the same trace, the
same final hash and the same figures; a run stops at its first violation.

Checked after every step: each applying shard replica's own invariants (conservation
per asset, reservations owned and within totals, no negative balance), each applying
matcher replica's market-data feed (`feed_check.py`: sequences without a gap or a
repeat, a book kept from the updates equal to the engine's and never crossed, trades
one for one with taker fills), equal state
hashes at equal positions on every replica of a group, the log's writers in term
order, money conserved across the shards and the database (what resident users,
clearing and fees hold in the shards plus what the database holds for users no shard
holds equals the deposits less the withdrawals), order rows that never leave a final
status nor unfill, every malformed request refused by the gateway with its own reason;
as each shard's egress is written (`cancel_all_check.py`), every cancel-all answered
for exactly the user's live orders of its symbol at its log position, and every order
whose cancel was sent ending CANCELLED or FILLED.
Checked after settling: every replica applying what the log held a round before, the
independent money audit (`auditor/core/money_audit.py`) over the database's rows and
the shards' answers, every acknowledged order and transfer there once, everything flat,
every order the egress opened ended by an order update, and every order whose cancel a
client had accepted CANCELLED or FILLED in the database.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from auditor.core.money_audit import MoneyAudit
from auditor.core.rows import MarketUnits, OrderRow, UserAnswer
from protos.oms.v1 import shard_pb2
from services.markets.catalog import Market
from services.matcher.core.settings import EngineSettings
from services.matcher.core.settings import SymbolSettings as MatcherSymbol
from services.routing.core.routing_document import Cluster, ClusterState, RoutingDocument
from services.shard.core.codec import command_to_protobuf
from services.shard.core.commands import Command, SetRouting
from services.shard.core.egress import ShardResult
from services.shard.core.settings import ShardSettings
from services.shard.core.settings import SymbolSettings as ShardSymbol
from services.shard.core.user_state import UserState
from simulation.core.bridge_model import SimBridge
from simulation.core.cancel_all_check import CANCEL_OUTCOME, CancelAllCheck, EgressEntries
from simulation.core.clients import SimClients
from simulation.core.etcd_model import EtcdUnavailable, SimEtcd, WatchCompacted
from simulation.core.faults import (
    CLOCK_STEP,
    CRASH,
    ETCD_COMPACT,
    ETCD_DOWN,
    NO_FAULTS,
    PAUSE,
    PROCESS_FAULTS,
    SNAPSHOT_CORRUPT,
    STORE_DOWN,
    FaultLog,
    FaultPlan,
)
from simulation.core.gateway_model import SimGateway
from simulation.core.links import Network
from simulation.core.operator_model import SimOperator
from simulation.core.persister_model import SimPersister
from simulation.core.process import SimProcess
from simulation.core.reconciler_model import SimReconciler
from simulation.core.replica_node import GroupReplica, MatcherReplica, ShardReplica
from simulation.core.routing_model import SimWaves
from simulation.core.scheduler import Scheduler
from simulation.core.store_model import SimPostgres, StoredUser

CHAOS_TICK_MS = 50
ROUTING_TICK_MS = 200
CRASH_DOWN_MS = (20, 1_500)
PAUSE_MS = (300, 3_000)  # past the lease TTL: a zombie leader
CLOCK_STEP_MS = 5_000
STORE_DOWN_MS = (50, 2_000)
# Shorter and longer than a leader's append deadline (`APPEND_TIMEOUT_MS`, 2.5 s).
ETCD_DOWN_MS = (100, 4_000)
MID_APPEND_CRASH_PPM = 2_000
SETTLE_DEADLINE_MS = 20_000
# What a shard's reconcile may change (`services/shard/core/reconcile.py`), by counter.
RECONCILE_HEALS = (
    "reconcile_phantoms_closed",
    "reconcile_reservations_released",
    "reconcile_acceptances_healed",
    "reconcile_impossible_states",
)
SETTLE_ROUND_MS = 250
HASHES_KEPT = 4_096


@dataclass(frozen=True, slots=True)
class SimConfig:
    seed: int
    steps: int
    markets: tuple[Market, ...]
    plan: FaultPlan = field(default_factory=FaultPlan)
    users: int = 48
    shards: int = 2  # shard groups in the first routing document
    spare_shards: int = 1  # groups running outside it: a scale-out adds one
    replicas: int = 3
    check_every_step: bool = True
    defect: str = ""  # one of `defects.DEFECTS`, planted on purpose
    # Entries between a replica's snapshots. Against the longest database outage
    # (STORE_DOWN_MS, a few hundred entries here) this is what production's 200,000
    # entries are against an outage of a minute or so; 64 makes the open egress-gap
    # defect (README, "The whole mesh, simulated") common.
    snapshot_entries: int = 256


@dataclass(frozen=True, slots=True)
class Violation:
    step: int
    time_ms: int
    kind: str
    detail: str


@dataclass(slots=True)
class SimResult:
    seed: int
    steps: int
    simulated_ms: int
    trace_hash: str
    final_hash: str
    violations: list[Violation]
    faults: dict[str, int]
    figures: dict[str, int]
    clients: dict[str, int]
    leaderless_ms: dict[str, list[int]]
    audit_checks: int
    audit_findings: dict[str, int]
    trace: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations


class SimWorld:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.scheduler = Scheduler()
        self.faults = FaultLog()
        self.plan = config.plan
        self.network = Network(self.scheduler, self.rng, self.plan, self.faults)
        self.etcd = SimEtcd(self.scheduler, self.rng)
        self.store = SimPostgres(self.scheduler, self.rng, self.plan, self.faults)
        self.figures: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.correlation = 0
        self.markets = config.markets
        self.assets = sorted(
            {m.base_asset for m in self.markets} | {m.quote_asset for m in self.markets}
        )
        groups = config.shards + config.spare_shards
        self.shard_ids = tuple(f"s{index + 1}" for index in range(groups))
        self.matcher_groups = tuple(sorted({m.matcher_group for m in self.markets}))
        self.shard_settings = {
            shard: shard_settings(shard, self.markets) for shard in self.shard_ids
        }
        self.engine_settings = {
            group: engine_settings(group, self.markets) for group in self.matcher_groups
        }
        self.routing = RoutingDocument.build(
            1, [Cluster(shard, ClusterState.ACTIVE) for shard in self.shard_ids[: config.shards]]
        )
        self.hashes: dict[str, dict[int, tuple[bytes, str]]] = {}
        self.last_fence: dict[str, int] = {}
        self.leaderless_since: dict[str, tuple[int, str]] = {}  # group -> (since ms, cause)
        self.last_fault: dict[str, str] = {}  # group -> the last process fault on a replica
        self.served: set[str] = set()
        # "shard after crash" -> each time a group went unserved after that fault (ms)
        self.leaderless_ms: dict[str, list[int]] = {}
        self.routing_epochs: dict[str, int] = {}
        self._trace = hashlib.sha256()
        self.lifecycle_seen = 0
        self._log_ends_a_round_ago: dict[str, int] = {}  # while settling
        users = tuple(range(1, config.users + 1))
        for user in users:
            self.store.users[user] = StoredUser(UserState(user))
        self.replicas: dict[str, list[GroupReplica]] = {}
        for shard in self.shard_ids:
            self.replicas[shard] = [ShardReplica(self, shard, i) for i in range(config.replicas)]
        for group in self.matcher_groups:
            self.replicas[group] = [MatcherReplica(self, group, i) for i in range(config.replicas)]
        self.cancel_all_check = CancelAllCheck()
        self.gateway = SimGateway(self)
        self.bridge = SimBridge(self)
        self.persisters = {shard: SimPersister(self, shard) for shard in self.shard_ids}
        self.reconcilers = {shard: SimReconciler(self, shard) for shard in self.shard_ids}
        self.clients = SimClients(self, users)
        self.waves = SimWaves(self)
        self.operator = SimOperator(self)
        self.scheduler.after(CHAOS_TICK_MS, "chaos", self._chaos)
        self.scheduler.after(1, "routing", self._publish_routing)

    # --- lookups -----------------------------------------------------------------------

    def replicas_of(self, group: str) -> list[GroupReplica]:
        return self.replicas[group]

    def leading_replica(self, group: str) -> Any:
        key = self.etcd.holder(group)
        if key is None:
            return None
        for node in self.replicas[group]:
            if node.name == key.holder:
                return node if node.leading else None
        return None

    def reference_replica(self, group: str) -> Any:
        """The replica that applied the most of the log (ties: the first)."""
        best = None
        for node in self.replicas[group]:
            if node.stopped is None and (
                best is None or node.replica.applied_position > best.replica.applied_position
            ):
                best = node
        return best

    def resident_actor(self, user_id: int) -> Any:
        """The user's actor on its owner's leader (what the admin API answers), or None."""
        shard = self.routing.owner_of(user_id)
        leader = self.leading_replica(shard) if shard else None
        return leader.machine.actor(user_id) if leader is not None else None

    def new_correlation(self) -> int:
        self.correlation += 1
        return self.correlation

    # --- messages ----------------------------------------------------------------------

    def send_to_shard(
        self, user_id: int, command: Command, delivered: Callable[[], None] | None = None
    ) -> bool:
        """The admin API's path (the operator's commands), routed by the document in
        etcd: False while the user is in transit (UNAVAILABLE at once). `delivered` is
        told of every copy the leader took (a duplicated one twice). Clients' requests
        go through the gateway (`gateway_model.py`)."""
        shard = self.routing.owner_of(user_id)
        if shard is None:
            return False
        self.send_command(shard, command_to_protobuf(command), delivered)
        return True

    def send_command(
        self,
        shard: str,
        message: shard_pb2.ShardCommand,
        delivered: Callable[[], None] | None = None,
    ) -> None:
        """To the shard group's leader, as its clients find it (etcd's leader key)."""
        key = self.etcd.holder(shard)
        target = next((n for n in self.replicas[shard] if key and n.name == key.holder), None)

        def arrive() -> None:
            if target is not None and target.leading:
                target.pending.append(message)
                if delivered is not None:
                    delivered()

        self.network.unary(f"client→{shard}", arrive)

    def shard_result(self, shard: str, result: ShardResult) -> None:
        self.network.unary(f"{shard}→client", lambda: self._answer(result))

    def _answer(self, result: ShardResult) -> None:
        if not self.operator.on_result(result):
            self.gateway.on_result(result)

    def _publish_routing(self) -> None:
        """The routing document, to every shard that has not applied it (its watcher)."""
        self.scheduler.after(ROUTING_TICK_MS, "routing", self._publish_routing)
        for shard in self.shard_ids:
            leader = self.leading_replica(shard)
            if leader is None:
                continue
            routing = leader.machine.state.routing
            if routing is None or routing.epoch < self.routing.epoch:
                message = command_to_protobuf(
                    SetRouting(self.new_correlation(), self.routing.encode())
                )

                def arrive(target: Any = leader, message: Any = message) -> None:
                    if target.leading:
                        target.pending.append(message)

                self.network.unary(f"routing→{shard}", arrive)

    # --- what replicas report ----------------------------------------------------------

    def leader_elected(self, node: GroupReplica) -> None:
        self.figures["leader_elections"] += 1

    def record_appended(self, group: str, first_position: int, fence: int) -> None:
        if fence < self.last_fence.get(group, 0):
            self.violation(
                "writer-order",
                f"{group} position {first_position} by fence {fence} after "
                f"{self.last_fence[group]}",
            )
        self.last_fence[group] = fence

    def hash_recorded(self, node: GroupReplica, position: int, digest: bytes) -> None:
        self.figures["state_hashes_compared"] += 1
        seen = self.hashes.setdefault(node.group, {})
        earlier = seen.get(position)
        if earlier is None:
            seen[position] = (digest, node.name)
            if len(seen) > HASHES_KEPT:
                del seen[next(iter(seen))]
        elif earlier[0] != digest:
            self.violation(
                "hash-divergence",
                f"{node.group} at {position}: {node.name} {digest.hex()[:16]}, "
                f"{earlier[1]} {earlier[0].hex()[:16]}",
            )

    def truncate_log(self, group: str) -> int:
        """The leader deletes records every live replica is past (their oldest
        snapshot); how many went."""
        live = [n for n in self.replicas[group] if n.alive and n.stopped is None]
        floor = min((n.disk.log_needed_after(n.egress_floor()) for n in live), default=0)
        if floor <= 0:
            return 0
        try:
            deleted = self.etcd.truncate_before(group, floor + 1)
        except EtcdUnavailable:
            return 0  # the next snapshot truncates
        self.figures["log_records_truncated"] += deleted
        return deleted

    def crash_between_append_and_apply(self, node: GroupReplica) -> bool:
        if not self.plan.on(CRASH) or self.rng.randrange(1_000_000) >= MID_APPEND_CRASH_PPM:
            return False
        self.faults.note(self.scheduler.now_ms, CRASH, f"{node.name} after its append")
        self.last_fault[node.group] = CRASH
        self._crash(node)
        return True

    def egress_written(self, shard: str, entries: EgressEntries) -> None:
        """A persister wrote the shard's egress at these positions: what a trader reads
        of it (order updates and answers, in log order) is checked."""
        for kind, detail in self.cancel_all_check.follow(shard, entries):
            self.violation(kind, detail)

    def violation(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(self.scheduler.steps, self.scheduler.now_ms, kind, detail))

    # --- faults ------------------------------------------------------------------------

    def _chaos(self) -> None:
        self.scheduler.after(CHAOS_TICK_MS, "chaos", self._chaos)
        plan = self.plan
        kinds = [kind for kind in PROCESS_FAULTS if plan.on(kind)]
        if not kinds or self.rng.randrange(1_000_000) >= plan.process_fault_ppm:
            return
        kind = kinds[self.rng.randrange(len(kinds))]
        rng = self.rng
        now = self.scheduler.now_ms
        nodes = [node for group in sorted(self.replicas) for node in self.replicas[group]]
        if kind == CRASH:
            targets: list[Any] = [
                *nodes,
                self.bridge,
                *(self.persisters[s] for s in self.shard_ids),
                self.waves,
            ]
            target = targets[rng.randrange(len(targets))]
            if not target.alive:
                return
            self.faults.note(
                now, CRASH, target.name if isinstance(target, GroupReplica) else target.label
            )
            if isinstance(target, GroupReplica):
                self.last_fault[target.group] = CRASH
            self._crash(target)
        elif kind == PAUSE:
            leaders = [n for n in nodes if n.leading]
            pool = leaders if leaders and rng.randrange(4) else nodes
            node = pool[rng.randrange(len(pool))]
            if not node.alive:
                return
            node.paused_until_ms = max(node.paused_until_ms, now + rng.randrange(*PAUSE_MS))
            self.faults.note(now, PAUSE, f"{node.name} until {node.paused_until_ms}")
            self.last_fault[node.group] = PAUSE
        elif kind == CLOCK_STEP:
            node = nodes[rng.randrange(len(nodes))]
            node.clock_offset_ms += rng.randrange(-CLOCK_STEP_MS, CLOCK_STEP_MS + 1)
            self.faults.note(now, CLOCK_STEP, f"{node.name} offset {node.clock_offset_ms}")
        elif kind == SNAPSHOT_CORRUPT:
            # Bit rot is found when the file is read: at the restart that follows.
            node = nodes[rng.randrange(len(nodes))]
            what = node.disk.corrupt(rng)
            if what is not None and node.alive:
                self.faults.note(now, SNAPSHOT_CORRUPT, f"{node.name}: {what}, then a crash")
                self.last_fault[node.group] = SNAPSHOT_CORRUPT
                self._crash(node)
        elif kind == ETCD_DOWN:
            self.etcd.go_down(now + rng.randrange(*ETCD_DOWN_MS))
            self.faults.note(now, ETCD_DOWN, f"until {self.etcd.down_until_ms}")
            for group in self.replicas:
                self.last_fault[group] = ETCD_DOWN
        elif kind == ETCD_COMPACT:
            with contextlib.suppress(EtcdUnavailable, WatchCompacted):
                self.etcd.compact(self.etcd.revision)
                self.faults.note(now, ETCD_COMPACT, f"at revision {self.etcd.revision}")
        elif kind == STORE_DOWN:
            self.store.down_until_ms = now + rng.randrange(*STORE_DOWN_MS)
            self.faults.note(now, STORE_DOWN, f"until {self.store.down_until_ms}")

    def _crash(self, target: Any) -> None:
        target.crash()
        self.scheduler.after(
            self.rng.randrange(*CRASH_DOWN_MS), "restart", lambda: target.alive or target.restart()
        )

    # --- checks after every step ---------------------------------------------------------

    def check_step(self) -> None:
        now = self.scheduler.now_ms
        for group, nodes in self.replicas.items():
            # Served: a leader that is up, leads, and is not paused. Measured from the
            # first election on, so the start of a run does not count.
            node = self.leading_replica(group)
            serving = node is not None and node.paused_until_ms <= now and self.etcd.available
            unserved = self.leaderless_since.get(group)
            if serving:
                if unserved is not None:
                    since, cause = unserved
                    key = f"{nodes[0].kind} after {cause}"
                    self.leaderless_ms.setdefault(key, []).append(now - since)
                    del self.leaderless_since[group]
                self.served.add(group)
            elif unserved is None and group in self.served:
                self.leaderless_since[group] = (now, self.last_fault.get(group, "other"))
        store = self.store
        if len(store.lifecycle_breaks) > self.lifecycle_seen:
            for detail in store.lifecycle_breaks[self.lifecycle_seen :]:
                self.violation("order-lifecycle", detail)
            self.lifecycle_seen = len(store.lifecycle_breaks)
        self._check_conservation()

    def _check_conservation(self) -> None:
        """Across the shards and the database, as of each shard log's end. A replica that
        applied the whole log stands for its shard; when none has (they all restarted
        behind it), the step is skipped: states of different ages do not add up."""
        references = []
        for shard in self.shard_ids:
            node = self.reference_replica(shard)
            if node is None or node.replica.applied_position != self.etcd.log_end(shard):
                self.figures["conservation_checks_skipped"] += 1
                return
            references.append((shard, node))
        resident_users: set[int] = set()
        held = dict.fromkeys(self.assets, 0)
        moved_in = dict.fromkeys(self.assets, 0)
        for shard, node in references:
            state = node.machine.state
            accounts = state.accounts
            twice = resident_users.intersection(state.actors)
            if twice:
                self.violation("two-owners", f"users {sorted(twice)} resident on two shards")
            resident_users.update(state.actors)
            for asset in self.assets:
                held[asset] += (
                    accounts.resident.get(asset, 0)
                    + accounts.clearing.get(asset, 0)
                    + accounts.fees.get(asset, 0)
                )
                moved_in[asset] += accounts.deposits.get(asset, 0) - accounts.withdrawals.get(
                    asset, 0
                )
            epoch = state.routing.epoch if state.routing is not None else 0
            if epoch < self.routing_epochs.get(shard, 0):
                self.violation("routing-epoch", f"{shard} went back to epoch {epoch}")
            self.routing_epochs[shard] = max(epoch, self.routing_epochs.get(shard, 0))
        for user_id, stored in self.store.users.items():
            if user_id in resident_users:
                continue
            for asset, total in stored.state.balances:
                held[asset] = held.get(asset, 0) + total
        self.figures["conservation_checks"] += 1
        for asset in self.assets:
            if held[asset] != moved_in[asset]:
                self.violation(
                    "money-conservation",
                    f"{asset}: shards and database hold {held[asset]}, deposits less "
                    f"withdrawals {moved_in[asset]}",
                )

    # --- running -----------------------------------------------------------------------

    def _step(self) -> None:
        label = self.scheduler.step()
        self._trace.update(f"{self.scheduler.now_ms} {label}\n".encode())
        if self.config.check_every_step:
            self.check_step()

    def run(self) -> SimResult:
        for _ in range(self.config.steps):
            self._step()
            if self.violations:
                return self.result(None)
        if not self.violations:
            self._settle()
        if not self.violations:
            self._check_reconcile_heals()
        if not self.violations:
            self.operator.check_audit_rows()
            self.operator.check_lifted()
        report = None if self.violations else self._audit()
        if not self.violations:
            self._check_cancels()  # after the audit: a row lost is the audit's finding
        return self.result(report)

    def _check_reconcile_heals(self) -> None:
        """No event is ever lost here, so a shard judging the reconciler's reports must
        find nothing to heal: a heal would mean its state and a matcher's had parted.
        (The drifts the reconciler confirms from outside are events still in flight
        behind the bridge; the shard judges each once it has applied that sequence.)"""
        for shard in self.shard_ids:
            leader = self.leading_replica(shard)
            if leader is None:
                continue
            counters = dict(leader.machine.statistics().counters)
            self.figures["reconciles_judged"] += counters["reconciles_applied"]
            heals = {name: counters[name] for name in RECONCILE_HEALS if counters[name]}
            self.figures["reconcile_heals"] += sum(heals.values())
            if heals:
                self.violation("reconcile-healed", f"{shard}: {heals}")

    def _check_cancels(self) -> None:
        """Settled: every order the egress opened has ended in an order update, and
        every order whose cancel a client had accepted is CANCELLED or FILLED."""
        for detail in self.cancel_all_check.left_live()[:1]:
            self.violation(CANCEL_OUTCOME, detail)
        if not self.violations:
            self.clients.check_cancelled()

    def _settle(self) -> None:
        """Faults off, every process back, every open order cancelled, writes caught up."""
        self.plan = NO_FAULTS
        self.network.plan = NO_FAULTS
        self.store.plan = NO_FAULTS
        self.store.down_until_ms = 0
        self.etcd.come_back()
        self.clients.settling = True
        now = self.scheduler.now_ms
        for group in sorted(self.replicas):
            for node in self.replicas[group]:
                node.paused_until_ms = min(node.paused_until_ms, now)
                if not node.alive:
                    node.restart()
        processes: list[SimProcess | SimWaves] = [
            self.bridge,
            *self.persisters.values(),
            *self.reconcilers.values(),
            self.waves,
        ]
        for process in processes:
            if not process.alive:
                process.restart()
        deadline = now + SETTLE_DEADLINE_MS
        next_round = now
        self._log_ends_a_round_ago = {group: self.etcd.log_end(group) for group in self.replicas}
        while self.scheduler.now_ms < deadline and not self.violations:
            if self.scheduler.now_ms >= next_round:
                next_round = self.scheduler.now_ms + SETTLE_ROUND_MS
                if self._settled():
                    return
                self._log_ends_a_round_ago = {g: self.etcd.log_end(g) for g in self.replicas}
                self.waves.settle_round()
                self.operator.settle_round()
                self._cancel_open_orders()
            self._step()
        if not self.violations:
            self.violation("not-settled", self._unsettled())

    def _cancel_open_orders(self) -> None:
        clients = self.clients
        for user in clients.users:
            if user in clients.outstanding:
                continue
            actor = self.resident_actor(user)
            if actor is not None and actor.orders:
                clients.submit(clients.cancel(user, sorted(actor.orders)[0]))

    def _settled(self) -> bool:
        return not self._unsettled()

    def _unsettled(self) -> str:
        clients = self.clients
        if not self.operator.idle:
            return f"operator: {len(self.operator.outstanding)} commands unanswered"
        if not self.waves.idle:
            return f"routing: {self.waves.running or 'transit or cut-over'} under way"
        if clients.outstanding:
            return f"{len(clients.outstanding)} client requests unanswered"
        for shard in self.shard_ids:
            leader = self.leading_replica(shard)
            if leader is None:
                return f"{shard} has no leader"
            for user_id, actor in leader.machine.state.actors.items():
                if not actor.is_flat():
                    return f"user {user_id} on {shard} is not flat"
            persister = self.persisters[shard]
            if persister.stopped is not None:
                return f"persister {shard} stopped: {persister.stopped}"
            if persister.cursor is None or leader.window_from(persister.cursor + 1):
                return f"persister {shard} behind {leader.name}"
            if leader.pending:
                return f"{leader.name} has commands to log"
        for group in self.matcher_groups:
            leader = self.leading_replica(group)
            if leader is None:
                return f"{group} has no leader"
        # Every replica keeps up: it has applied what the log held a round ago (its
        # watch delivers what the leader appends; the leader appends timers meanwhile).
        for group in sorted(self.replicas):
            end = self._log_ends_a_round_ago.get(group, 0)
            for node in self.replicas[group]:
                if node.alive and node.stopped is None and node.replica.applied_position < end:
                    return (
                        f"{node.name} at {node.replica.applied_position}, behind the log's"
                        f" end a round before ({end})"
                    )
        return ""

    # --- the audit -----------------------------------------------------------------------

    def _audit(self) -> Any:
        store = self.store
        audit = MoneyAudit(
            [MarketUnits.of(m) for m in self.markets],
            acknowledged_transfers=self.clients.acknowledged_transfers(),
        )
        audit.persister_cursors(store.cursors)
        for key in sorted(store.ledger):
            audit.ledger_item(store.ledger[key])
        fills_lots: Counter[str] = Counter()
        for row in store.fill_rows():
            audit.fill(row)
            fills_lots[row.order_id] += row.quantity_lots
        for order_id in sorted(store.orders):
            o = store.orders[order_id]
            audit.order(
                OrderRow(
                    o.order_id,
                    o.user_id,
                    o.client_order_id,
                    o.symbol,
                    o.side,
                    o.order_type,
                    o.quantity_lots,
                    o.status,
                    o.filled_lots,
                    o.remaining_lots,
                    fills_lots[order_id],
                    o.shard_id,
                    o.updated_position,
                ),
                flat=True,
            )
        stored_ids = {o.order_id: (o.user_id, o.client_order_id) for o in store.orders.values()}
        audit.acknowledged_orders(self.clients.acknowledged_orders(), stored_ids)
        audit.finish()
        answers: list[UserAnswer] = []
        stored_balances: dict[int, dict[str, int]] = {}
        for user in self.clients.users:
            actor = self.resident_actor(user)
            if actor is not None:
                balances = {a: (t, actor.reserved.get(a, 0)) for a, t in actor.balances.items()}
                answers.append(UserAnswer(user, True, balances, len(actor.orders)))
            else:
                totals = dict(store.users[user].state.balances)
                stored_balances[user] = totals
                answers.append(UserAnswer(user, False, {a: (t, 0) for a, t in totals.items()}, 0))
        audit.compare_stored(stored_balances)
        audit.compare_answers(answers, flat=True)
        report = audit.report()
        for check, count in sorted(report.counts.items()):
            examples = [f"{f.subject}: {f.detail}" for f in report.examples if f.check == check]
            self.violation("audit", f"{check}: {count}, e.g. {examples[:2]}")
        return report

    def result(self, report: Any) -> SimResult:
        final = hashlib.sha256()
        for group in sorted(self.replicas):
            node = self.reference_replica(group)
            if node is not None:
                final.update(f"{group} {node.replica.applied_position} ".encode())
                final.update(node.machine.state_hash())
        for shard in sorted(self.store.cursors):
            final.update(f"{shard} {self.store.cursors[shard]}".encode())
        client_figures = self.clients.figures
        waits = sorted(client_figures.waits_ms)
        return SimResult(
            seed=self.config.seed,
            steps=self.scheduler.steps,
            simulated_ms=self.scheduler.now_ms,
            trace_hash=self._trace.hexdigest()[:16],
            final_hash=final.hexdigest()[:16],
            violations=list(self.violations),
            faults=dict(sorted(self.faults.counts.items())),
            figures=dict(sorted(self.figures.items()))
            | {
                "etcd_appends": self.etcd.appends,
                "etcd_fenced_appends": self.etcd.fenced_appends,
                "etcd_refusals": self.etcd.refusals,
                "etcd_unanswered_commits": self.etcd.unanswered_commits,
                "etcd_own_appends_found": self.etcd.own_appends_found,
                "etcd_compactions": self.etcd.compactions,
                "etcd_watches_created": self.etcd.watches_created,
                "etcd_watches_compacted": self.etcd.watches_compacted,
                "etcd_watches_fell_behind": self.etcd.watches_fell_behind,
                "messages": self.network.messages,
                "store_committed": self.store.outcomes["committed"],
                "store_aborted": self.store.outcomes["aborted"],
                "store_unknown": self.store.outcomes["unknown"],
                "store_unknown_committed": self.store.unknown_committed,
                "store_down_refusals": self.store.outcomes["down"],
                "rows_replayed_absorbed": self.store.duplicate_rows,
                "orders_stored": len(self.store.orders),
                "users_moved": self.waves.landed,
                "user_moves_returned": self.waves.returned,
                **self.waves.figures,
                **self.gateway.figures,
                "operator_commands": sum(self.operator.sent.values()),
                "operator_accepted": sum(self.operator.accepted.values()),
                "operator_refused": self.operator.refused,
                "operator_stale": self.operator.stale,
                "routing_epoch": self.routing.epoch,
                "fills_stored": len(self.store.fills),
                **self._feed_figures(),
                "cancel_alls_checked": self.cancel_all_check.judged,
                "cancel_alls_refused_by_shard": self.cancel_all_check.refused,
                "cancel_all_orders_listed": self.cancel_all_check.listed,
                "cancel_all_already_cancelling": self.cancel_all_check.already_cancelling,
                "cancelled_order_ends_checked": self.cancel_all_check.cancel_ends,
                "cancelled_orders_rejected_first": self.cancel_all_check.rejected_first,
            },
            clients={
                "ok": client_figures.ok,
                "refused": client_figures.refused,
                "unknown_then_resolved": client_figures.timed_out_then_answered,
                "answered_as_duplicate": client_figures.answered_as_duplicate,
                "attempts": client_figures.attempts,
                "malformed_refused": client_figures.malformed_refused,
                "cancel_alls_accepted": client_figures.cancel_alls,
                "cancel_alls_listing_orders": client_figures.cancel_alls_listing,
                "acknowledged_orders": len(self.clients.orders),
                "acknowledged_transfers": len(self.clients.transfers),
                "longest_wait_ms": waits[-1] if waits else 0,
            },
            leaderless_ms={k: sorted(v) for k, v in self.leaderless_ms.items()},
            audit_checks=report.evaluated if report is not None else 0,
            audit_findings=dict(report.counts) if report is not None else {},
            trace=list(self.faults.trace),
        )

    def _feed_figures(self) -> dict[str, int]:
        checks = [
            node.feed_check
            for group in self.matcher_groups
            for node in self.replicas[group]
            if isinstance(node, MatcherReplica)
        ]
        return {
            "market_book_updates_checked": sum(check.book_updates for check in checks),
            "market_trades_checked": sum(check.trades for check in checks),
            "market_books_compared": sum(check.books_compared for check in checks),
        }


def run(config: SimConfig) -> SimResult:
    return SimWorld(config).run()


def shard_settings(shard_id: str, markets: tuple[Market, ...]) -> ShardSettings:
    return ShardSettings(
        shard_id=shard_id,
        symbols=tuple(
            ShardSymbol(
                m.symbol,
                m.base_asset,
                m.quote_asset,
                m.lot_size,
                m.tick_size,
                m.maker_fee_ppm,
                m.taker_fee_ppm,
                m.matcher_group,
            )
            for m in markets
        ),
        # Short enough that users are evicted and hydrated again within a run.
        idle_ttl_ms=3_000,
        redrive_after_ms=1_000,
        # Small filters and a short exact map: "possibly seen" client ids go to the database.
        dedup_filter_bits=1 << 12,
        dedup_hashes=2,
        max_recent_per_user=8,
    )


def engine_settings(group: str, markets: tuple[Market, ...]) -> EngineSettings:
    return EngineSettings(
        symbols=tuple(
            MatcherSymbol(
                m.symbol,
                m.base_asset,
                m.quote_asset,
                m.lot_size,
                m.tick_size,
                m.min_notional,
                m.price_band_bps,
                m.reference_price_ticks,
                m.maker_fee_ppm,
                m.taker_fee_ppm,
            )
            for m in markets
            if m.matcher_group == group
        ),
        dedup_horizon_ms=600_000,
    )
