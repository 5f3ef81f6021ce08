"""A runtime node as one replica of a group whose log is in etcd: follower, then leader.

Every replica recovers from its newest local snapshot plus the etcd log, serves
gRPC at once (health, and its service's calls refused while it does not lead:
`LeaderGate`), follows the log as the leader appends it (`LogFollower`: every
record applied, the leader's state hashes verified, egress kept in the feed), and
campaigns for the group's leader key (`Leadership`). A replica that wins reads the
log to its end (nobody else can append any more: every append is fenced by the
leader key's create revision), becomes the writer of the new term, and only then
serves: health SERVING, the service's loops started, commands accepted. There is
no is-leader branch inside the state machine: the host decides where egress goes
by serving (or refusing) the calls that carry it.

A leader that loses its lease, or whose append is fenced, stops at once: the
process ends with the error and its supervisor starts it again as a follower
(crash-only; what it acknowledged is in etcd). A graceful stop resigns the lease
so a follower takes over without waiting for it to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.clients.channels import SERVER_OPTIONS
from services.clients.in_process import stop_serving_in_process
from services.coordination.errors import CoordinationError, RevisionCompacted
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys
from services.coordination.leadership import Leadership, current_leader
from services.coordination.replica_registry import ReplicaRegistry
from services.observability.metrics import serve_metrics
from services.runtime.collector import settle_long_lived_state
from services.runtime.egress_feed import DurableEgressFeed
from services.runtime.errors import LogFencedError
from services.runtime.etcd_log import EtcdLogReader, EtcdLogStore, log_bounds
from services.runtime.hosting import HostPlan, RuntimeHost
from services.runtime.ingress import CommandIngress
from services.runtime.leader_gate import LeaderGate
from services.runtime.log_follower import LogFollower
from services.runtime.node import RuntimeNode
from services.runtime.snapshot_transfer import SnapshotServer, install_from_peers
from services.runtime.upgrades import ReplicaUpgrades
from services.serving.channelz import register_channelz
from services.serving.health_probe import serve_health_probe
from services.serving.status_service import register_status
from services.transport.tls import mesh_transport

log = structlog.get_logger(__name__)
EgressT = TypeVar("EgressT")
REGISTRY_TTL_S = 10  # a replica gone longer loses its hold on the log's truncation
# A leader whose renewals go unanswered for a TTL stops serving (`serving_as_leader`)
# but keeps its term this many TTLs: long enough for etcd to elect a leader of its own
# (1 to 2 s) and for the renewals to find it on a loaded machine, so losing etcd's
# leader is no failover. Its appends are fenced by the term meanwhile, and fail after
# their own deadline (EtcdLogStore), which ends a leader cut off while it has work.
LEASE_GIVE_UP_TTLS = 5


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    etcd_endpoints: tuple[str, ...]
    keys: GroupKeys
    advertise: str  # the address other services reach this replica at
    lease_ttl_s: int = 2
    # etcd's history before the log's truncation is compacted at most this often.
    compact_interval_s: float = 30.0


class ReplicatedHost(RuntimeHost[EgressT]):
    def __init__(
        self,
        node: RuntimeNode[EgressT],
        feed: DurableEgressFeed[EgressT],
        *,
        listen_address: str,
        replication: ReplicationSettings,
        grace_s: float = 5.0,
    ) -> None:
        super().__init__(node, feed, listen_address=listen_address, grace_s=grace_s)
        self.replication = replication
        self._leading = False
        self._leading_now = asyncio.Event()
        self.term = 0  # its own, once it leads
        self._leader_term = 0  # the leader's it follows, as its watch last saw it
        self._leader_address = ""
        self.session: EtcdSession | None = None
        self.follower: LogFollower[EgressT] | None = None
        self.gate: LeaderGate | None = None
        self.leadership: Leadership | None = None
        self.registry: ReplicaRegistry | None = None
        self.snapshot_server = SnapshotServer(node.snapshots, node.egress_floor)
        self.installed_snapshot = 0
        self.truncated_through = 0
        self.compactions = 0
        self._compacted_at = float("-inf")

    @property
    def leading(self) -> bool:
        return self._leading

    @leading.setter
    def leading(self, leading: bool) -> None:
        self._leading = leading
        if leading:
            self._leading_now.set()
        else:
            self._leading_now.clear()

    async def wait_leading(self) -> None:
        """Until this replica leads (a replica that stops leading ends its process, so
        co-located roles that waited for this never need to step down)."""
        await self._leading_now.wait()

    @property
    def serving_as_leader(self) -> bool:
        """Leading, and sure that etcd has not expired the lease: only then are the
        leader-only calls (reads from this replica's state among them) served."""
        leadership = self.leadership
        return self.leading and leadership is not None and leadership.certain()

    @property
    def leader_address(self) -> str:
        if self.leading:
            # Unsure of its lease, it names nobody: callers look the leader up again.
            return self.replication.advertise if self.serving_as_leader else ""
        return self._leader_address

    async def run(self, plan_for: Callable[[RuntimeHost[EgressT]], HostPlan]) -> None:
        replication = self.replication
        async with EtcdSession(replication.etcd_endpoints) as session:
            self.session = session
            node = self.node
            node.log_store = EtcdLogReader(session, replication.keys)
            self.registry = registry = ReplicaRegistry(
                session,
                replication.keys,
                replication.advertise,
                ttl_s=max(REGISTRY_TTL_S, 3 * replication.lease_ttl_s),
                implemented_versions=node.replica.machine.implemented_versions,
            )
            await self._install_snapshot_if_behind(session, registry)
            self.recovery = await node.recover(
                on_replayed=self.feed.publish, on_rewound=self.feed.clear, writer=False
            )
            settle_long_lived_state()
            await registry.join(node.log_needed_after())
            node.after_snapshot = self._snapshot_published
            self.feed.start_at(node.replica.applied_position)
            plan = plan_for(self)
            self._plan_numbers = plan.metrics
            serve_metrics(
                [
                    ("replica", self.replica_numbers),
                    ("sequencer", self.sequencer_numbers),
                    ("snapshot", self.snapshot_numbers),
                    *plan.metrics,
                ]
            )
            self.gate = gate = LeaderGate(
                plan.service_names,
                leading=lambda: self.serving_as_leader,
                leader_address=lambda: self.leader_address,
            )
            server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=(gate,))
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            register_status(server, "replica", self.status)
            register_channelz(server)
            self.snapshot_server.register(server)
            ReplicaUpgrades(self).register(server)
            plan.register(server)
            local = self.serve_in_process(plan, (gate,))  # refused here too unless leading
            self.bound_port = mesh_transport().listen(server, self.listen_address)
            if self.bound_port == 0:
                raise OSError(f"cannot listen on {self.listen_address}")
            self._server = server
            await server.start()
            probe = await serve_health_probe(self.health)
            await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
            for name in plan.service_names:
                await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            log.info("replica.following", address=self.listen_address, **self._where())
            self.ready.set()
            self.leadership = leadership = Leadership(
                session,
                replication.keys.leader,
                replication.advertise,
                ttl_s=replication.lease_ttl_s,
            )
            keeping = asyncio.create_task(registry.keep())
            try:
                await self._follow_then_lead(session, leadership, plan, server)
            finally:
                if local is not None:
                    stop_serving_in_process(local)
                keeping.cancel()
                self.leading = False
                self.feed.close()
                with contextlib.suppress(Exception):
                    await server.stop(0)
                if probe is not None:
                    with contextlib.suppress(Exception):
                        await probe.stop(0)
                await leadership.resign()
                await node.close()
                await registry.leave()
                log.info("service.stopped")

    async def _install_snapshot_if_behind(
        self, session: EtcdSession, registry: ReplicaRegistry
    ) -> None:
        """An empty disk, or a snapshot older than the log's first record: take a peer's."""
        first, last = await log_bounds(session, self.replication.keys)
        if last is None or first <= 1:
            return  # the whole log is there: a replay from nothing works
        snapshots = self.node.snapshots
        local = max(snapshots.positions(), default=0)
        if local + 1 >= first:
            return
        peers = [m for m in await registry.members() if m.address != registry.address]
        log.warning(
            "replica.installing_snapshot",
            local_snapshot=local,
            log_starts_at=first,
            peers=len(peers),
        )
        self.installed_snapshot = await install_from_peers(peers, snapshots, first - 1)

    async def _snapshot_published(self, oldest_kept: int) -> None:
        """Tell the group what this replica could recover from; the leader then deletes
        the records every live replica is past, and compacts etcd's history now and then."""
        registry, store = self.registry, self.node.log_store
        if registry is None:
            return
        try:
            await registry.publish(oldest_kept)
            if not self.leading or not isinstance(store, EtcdLogStore):
                return
            floor = await registry.truncation_floor()
            if floor <= self.truncated_through:
                return
            await store.truncate_before(floor + 1)
            self.truncated_through = floor
            now = time.monotonic()
            if now - self._compacted_at >= self.replication.compact_interval_s:
                self._compacted_at = now
                # The history before the truncation's revision holds only deleted records.
                with contextlib.suppress(RevisionCompacted):
                    await store.session.compact(store.session.revision)
                self.compactions += 1
        except (CoordinationError, LogFencedError) as error:
            # The next snapshot tries again; a fenced leader learns it on its next append.
            log.warning("replica.truncation_skipped", error=repr(error))

    def replica_info(self) -> dict[str, str]:
        return {
            "role": "leader" if self.leading else "follower",
            "leader": self.leader_address,
            "prefix": self.replication.keys.prefix.decode(),
        }

    def replica_numbers(self) -> dict[str, int]:
        """The numbers of `status` (also the replica's metrics, read at each scrape)."""
        replica = self.node.replica
        follower, gate, leadership = self.follower, self.gate, self.leadership
        durable = self.node.sequencer.durable_position if self.node.writing else 0
        return {
            "leading": int(self.serving_as_leader),
            "lease_uncertain": int(self.leading and not self.serving_as_leader),
            "lease_uncertain_spells": leadership.uncertain_spells if leadership else 0,
            "term": self.term,
            # The group's term as this replica knows it: its own while it leads, else
            # the leader's it follows (`oms status` compares them across replicas).
            "leader_term": self.term if self.leading else self._leader_term,
            "applied_position": replica.applied_position,
            "durable_position": durable or replica.applied_position,
            "checkpoints_verified": replica.checkpoints_verified,
            "records_followed": follower.applied_records if follower else 0,
            "range_reads": follower.range_reads if follower else 0,
            "watch_restarts": follower.watch_restarts if follower else 0,
            "refused_not_leader": gate.refused if gate else 0,
            "campaigns": leadership.campaigns if leadership else 0,
            "installed_snapshot": self.installed_snapshot,
            "snapshots_sent": self.snapshot_server.sent,
            "truncated_through": self.truncated_through,
            "compactions": self.compactions,
            "machine_version": replica.machine.version,
            "versions_repeated": replica.versions_repeated,
        }

    def _where(self) -> dict[str, Any]:
        return {
            "prefix": self.replication.keys.prefix.decode(),
            "applied_position": self.node.replica.applied_position,
        }

    async def _follow_then_lead(
        self,
        session: EtcdSession,
        leadership: Leadership,
        plan: HostPlan,
        server: grpc.aio.Server,
    ) -> None:
        node = self.node
        follower = LogFollower(
            session,
            self.replication.keys,
            node.replica,
            on_applied=self.feed.publish,
            between_records=node.snapshot_between_records,
        )
        self.follower = follower
        async with asyncio.TaskGroup() as group:
            following = group.create_task(follower.run())
            watching = group.create_task(self._watch_leader(session))
            campaigning = group.create_task(leadership.campaign())
            stop = group.create_task(self._stop.wait())
            await asyncio.wait({campaigning, stop, following}, return_when=asyncio.FIRST_COMPLETED)
            following.cancel()
            watching.cancel()
            if following.done() and not following.cancelled():
                following.result()  # the replica diverged: stop with its error
            if not campaigning.done():
                campaigning.cancel()
                return  # stopped while following
            self.term = campaigning.result()
            # Nobody else can append now: read the log to its end, then write it.
            await follower.catch_up()
            await node.become_writer(EtcdLogStore(session, self.replication.keys, self.term))
            self._ingress = CommandIngress(node.sequencer)
            self.leading = True
            sequencer = group.create_task(node.run())
            holding = group.create_task(
                leadership.hold(give_up_after_s=LEASE_GIVE_UP_TTLS * leadership.ttl_s)
            )
            loops = [group.create_task(loop()) for loop in plan.loops]
            for name in plan.service_names:
                await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
            log.info("replica.leading", term=self.term, **self._where())
            await asyncio.wait({stop, sequencer, holding}, return_when=asyncio.FIRST_COMPLETED)
            if not stop.done():
                # The lease is lost or an append was fenced: another replica may lead now.
                self.leading = False
                stop.cancel()
                for task in loops:
                    task.cancel()
                node.stop()
                if holding.done():
                    holding.result()  # LeaseLost: the process ends with it
                sequencer.result()  # LogFencedError or the store's failure
                raise RuntimeError("the sequencer stopped on its own")
            holding.cancel()
            for name in ("", *plan.service_names):
                await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            await server.stop(self.grace_s)
            for task in loops:
                task.cancel()
            node.stop()
            await sequencer

    async def _watch_leader(self, session: EtcdSession) -> None:
        """Keep `leader_address` current while following, for the gate's refusals."""
        key = self.replication.keys.leader
        while True:
            with contextlib.suppress(Exception):
                record = await current_leader(session, key)
                self._leader_address = record.holder if record is not None else ""
                self._leader_term = record.term if record is not None else 0
            await asyncio.sleep(0.5)


LOG_BACKENDS = ("file", "etcd")


def host_for(
    node: RuntimeNode[EgressT],
    feed: DurableEgressFeed[EgressT],
    *,
    listen_address: str,
    log_backend: str,
    kind: str,
    name: str,
    etcd_endpoints: tuple[str, ...],
    mesh_id: str,
    advertise: str,
    lease_ttl_s: int,
    compact_interval_s: float = 30.0,
) -> RuntimeHost[EgressT]:
    """The host a service's settings ask for: one replica on a local file log, or a
    replica of group `kind/name` whose log is in etcd. Configuration only: the
    state machine and the service are the same either way."""
    if log_backend == "file":
        return RuntimeHost(node, feed, listen_address=listen_address)
    if log_backend != "etcd":
        raise ValueError(f"the log backend is one of {LOG_BACKENDS}, not {log_backend!r}")
    if not etcd_endpoints:
        raise ValueError(f"{kind} {name}: the etcd log needs OMS_ETCD_ENDPOINTS")
    return ReplicatedHost(
        node,
        feed,
        listen_address=listen_address,
        replication=ReplicationSettings(
            etcd_endpoints=etcd_endpoints,
            keys=GroupKeys.of(mesh_id, kind, name),
            advertise=advertise or listen_address,
            lease_ttl_s=lease_ttl_s,
            compact_interval_s=compact_interval_s,
        ),
    )
