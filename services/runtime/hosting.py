"""Hosting a runtime node behind a gRPC server, with structured lifecycle.

`RuntimeHost.run()` owns one TaskGroup: recovery, then the sequencer, the gRPC
server and whatever background loops the service adds. Stopping is graceful:
health goes NOT_SERVING, the server stops accepting and drains for a grace
period, the sequencer finishes what is queued, the log is closed. A crash stop
loses nothing acknowledged: the log has it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from services.clients.channels import SERVER_OPTIONS
from services.clients.in_process import (
    InProcessServer,
    serve_in_process,
    stop_serving_in_process,
)
from services.observability.metrics import StatusNumbers, serve_metrics
from services.runtime.collector import settle_long_lived_state
from services.runtime.egress_feed import DurableEgressFeed
from services.runtime.ingress import CommandIngress
from services.runtime.node import RecoveryReport, RuntimeNode
from services.runtime.upgrades import OneReplicaUpgrades
from services.serving.channelz import register_channelz
from services.serving.health_probe import serve_health_probe
from services.serving.status_service import register_status
from services.serving.stop_signals import on_stop_signal
from services.transport.tls import mesh_transport

log = structlog.get_logger(__name__)
EgressT = TypeVar("EgressT")

ServicerRegistration = Callable[[grpc.aio.Server], None]
BackgroundLoop = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class HostPlan:
    """What a service adds to the host: its gRPC servicers and its own loops."""

    service_names: Sequence[str]
    register: ServicerRegistration
    loops: list[BackgroundLoop] = field(default_factory=list)
    # The service's numbers for the metrics endpoint, read at each scrape.
    metrics: Sequence[tuple[str, StatusNumbers]] = ()


class RuntimeHost(Generic[EgressT]):
    def __init__(
        self,
        node: RuntimeNode[EgressT],
        feed: DurableEgressFeed[EgressT],
        *,
        listen_address: str,
        grace_s: float = 5.0,
    ) -> None:
        self.node = node
        self.feed = feed
        node.on_durable = feed.publish
        self.listen_address = listen_address
        self.grace_s = grace_s
        self.health = HealthServicer()
        self._stop = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self.bound_port = 0
        self.recovery: RecoveryReport | None = None
        self._ingress: CommandIngress[EgressT] | None = None
        self.ready = asyncio.Event()
        # Addresses at which services of this process reach this host without gRPC
        # (a co-located shard cluster); none by default.
        self.in_process_addresses: tuple[str, ...] = ()
        self._plan_numbers: Sequence[tuple[str, StatusNumbers]] = ()  # the plan's metrics

    @property
    def ingress(self) -> CommandIngress[EgressT]:
        if self._ingress is None:
            raise RuntimeError("the host has not recovered yet")
        return self._ingress

    def stop(self) -> None:
        self._stop.set()

    async def wait_leading(self) -> None:
        """Until this host leads its group: at once for one replica on a file log."""

    async def settled(self) -> None:
        """Return once every applied entry is durable; new commands wait meanwhile.

        A query answered then shows exactly the durable state, never an entry that a
        crash could still take back. Under steady load the sequencer applies the next
        batch before the last one is durable, so without holding ingress back the two
        positions might never meet.
        """
        node = self.node
        if node.replica.applied_position == node.sequencer.durable_position:
            return
        ingress = self.ingress
        ingress.hold()
        try:
            while node.replica.applied_position != node.sequencer.durable_position:
                await self.feed.wait_published()
        finally:
            ingress.release()

    def install_signal_handlers(self) -> None:
        on_stop_signal(self.stop)

    def serve_in_process(
        self, plan: HostPlan, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
    ) -> InProcessServer | None:
        """With `in_process_addresses`, the plan's services answer callers of this
        process at those addresses without gRPC (services/clients/in_process.py)."""
        if not self.in_process_addresses:
            return None
        local = InProcessServer(interceptors)
        plan.register(local)  # type: ignore[arg-type,unused-ignore]  # what `register` calls
        serve_in_process(self.in_process_addresses, local)
        return local

    async def run(self, plan_for: Callable[[RuntimeHost[EgressT]], HostPlan]) -> None:
        self.recovery = await self.node.recover(
            on_replayed=self.feed.publish, on_rewound=self.feed.clear
        )
        settle_long_lived_state()
        self.feed.start_at(self.node.replica.applied_position)
        self._ingress = CommandIngress(self.node.sequencer)
        plan = plan_for(self)
        self._plan_numbers = plan.metrics
        serve_metrics(
            [
                ("sequencer", self.sequencer_numbers),
                ("snapshot", self.snapshot_numbers),
                *plan.metrics,
            ]
        )
        server = grpc.aio.server(options=SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        register_status(server, "replica", self.status)
        register_channelz(server)
        OneReplicaUpgrades(self).register(server)  # its versions, for `oms upgrade status`
        plan.register(server)
        local = self.serve_in_process(plan)
        self.bound_port = mesh_transport().listen(server, self.listen_address)
        if self.bound_port == 0:
            raise OSError(f"cannot listen on {self.listen_address}")
        self._server = server
        await server.start()
        probe = await serve_health_probe(self.health)
        for name in ("", *plan.service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("service.serving", address=self.listen_address, port=self.bound_port)
        self.ready.set()
        try:
            async with asyncio.TaskGroup() as group:
                sequencer = group.create_task(self.node.run())
                loops = [group.create_task(loop()) for loop in plan.loops]
                await self._stop_requested_or(sequencer)
                for name in ("", *plan.service_names):
                    await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
                await server.stop(self.grace_s)
                for task in loops:
                    task.cancel()
                self.node.stop()
        finally:
            if local is not None:
                stop_serving_in_process(local)
            if probe is not None:
                await probe.stop(0)
            self.feed.close()
            await self.node.close()
            log.info("service.stopped")

    def status(self) -> tuple[dict[str, int], dict[str, str]]:
        """What `oms.v1.Status/GetStatus` answers on every replica, leader or not: where
        it is in the log, its state's hash there (so replicas can be compared), its
        sequencer's numbers when it leads (`sequencer.records`, ...) and its service's own,
        the metrics' (`shard.resident_users`, ...)."""
        replica = self.node.replica
        counters = self.replica_numbers()
        counters["consensus_time_ms"] = replica.consensus_time_ms
        for key, value in self.sequencer_numbers().items():
            counters[f"sequencer.{key}"] = value
        counters.update(self.snapshot_numbers())
        for name, numbers in self._plan_numbers:
            for key, value in numbers().items():
                counters[f"{name}.{key}"] = value
        info = {
            **self.replica_info(),
            # At applied_position; equal positions on two replicas must mean equal hashes.
            "state_hash": replica.machine.state_hash().hex(),
            # Every checkpoint hash this replica computed lately, "position:hash" each:
            # replicas that share a position must share its hash (followers check the
            # leader's logged ones themselves; this lets an operator compare any two).
            "checkpoints": ",".join(
                f"{position}:{digest.hex()}" for position, digest in replica.recorded_hashes()
            ),
        }
        return counters, info

    def replica_numbers(self) -> dict[str, int]:
        """The replica's own numbers in `status` (a single replica: the one writer)."""
        applied = self.node.replica.applied_position
        return {
            "leading": 1,
            "term": 0,
            "leader_term": 0,
            "applied_position": applied,
            "durable_position": (self.node.sequencer.durable_position if self.node.writing else 0)
            or applied,
        }

    def replica_info(self) -> dict[str, str]:
        return {"role": "leader"}

    def snapshot_numbers(self) -> dict[str, int]:
        """A failing snapshot leaves the log untruncated: the disk fills behind it."""
        return {
            "snapshot_failures": self.node.snapshot_failures,
            "snapshot_children_killed": self.node.snapshot_writer.children_killed,
        }

    def sequencer_numbers(self) -> dict[str, int]:
        if not self.node.writing:
            return {}  # a follower has no sequencer until it leads
        statistics = self.node.sequencer.statistics()
        return {
            "records": statistics.batches,
            "entries": statistics.entries,
            "pending_entries": statistics.pending_entries,
            "last_batch_entries": statistics.last_batch_entries,
            "max_queue_dwell_ms": int(statistics.max_queue_dwell_ms),
            "applied_position": statistics.applied_position,
            "consensus_time_ms": statistics.consensus_time_ms,
            "clock_steps_back": statistics.clock_steps_back,
        }

    async def _stop_requested_or(self, sequencer: asyncio.Task[None]) -> None:
        waiter = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({waiter, sequencer}, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            sequencer.result()  # the sequencer failed: let the error stop the service
