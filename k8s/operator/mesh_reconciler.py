"""Getting the routing document to what an OmsCluster asks for, with the wave code.

One `reconcile(spec)` does, in this order, each step a wave of `WaveController`
(the same code `omsctl` runs), so a step interrupted by a crash is settled by the
next run's first step:

1. no document yet: every asked-for cluster's shard answering, write epoch 1;
2. `resume`: settle users a previous run left in transit, finish its cut-over;
3. clusters asked for and not active: ensure their workloads, then `activate` each
   (scale-out; a cluster still draining from a scale-in taken back is active again);
4. pins: pin each asked-for whale where the spec says, unpin the others;
5. clusters no longer asked for, the highest first: `remove` (scale-in), then their
   workloads;
6. `spec.stateMachineVersion`: each replicated group switched to it once its every
   replica implements it (`version_rollout.py`; a group still rolling is retried).

Progress goes to `publish` as the resource's status while it runs (the wave's
operation, phase, waves, moved users), and the final status is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from k8s.operator.mesh_spec import MeshSpec
from k8s.operator.version_rollout import VersionRollout
from k8s.operator.workloads import ClusterWorkloads
from services.routing.core.routing_changes import first_document, with_drain_cancelled
from services.routing.core.routing_document import (
    ClusterState,
    RoutingDocument,
    RoutingDocumentError,
)
from services.routing.routing_store import RoutingConflictError, RoutingStore, StoredRouting
from services.routing.shard_probe import ShardProbe
from services.routing.wave_controller import WaveController, WaveProgress, WaveSettings

log = structlog.get_logger(__name__)
Status = dict[str, Any]
Publish = Callable[[Status], Awaitable[None]]

READY, SCALING = "Ready", "Scaling"


def wave_status(progress: WaveProgress) -> dict[str, Any]:
    return {
        "operation": progress.operation,
        "phase": progress.phase,
        "waves": progress.waves,
        "toMove": progress.to_move,
        "moved": progress.moved,
        "returned": list(progress.returned),
        "held": list(progress.held),
        "seconds": round(progress.seconds, 3),
    }


def mesh_status(document: RoutingDocument, phase: str, wave: WaveProgress | None) -> Status:
    status: Status = {
        "shards": sum(c.state == ClusterState.ACTIVE for c in document.clusters),
        "epoch": document.epoch,
        "phase": phase,
        "clusters": [{"id": c.cluster_id, "state": c.state.value} for c in document.clusters],
        "pins": {str(user): cluster for user, cluster in document.pins.items()},
    }
    if wave is not None:
        status["wave"] = wave_status(wave)
    return status


class _StatusFeed:
    """The newest status while a reconcile runs, published in order by one task: a
    status set while a publish is under way replaces any older one not yet sent."""

    def __init__(self) -> None:
        self.status: Status | None = None
        self.changed = asyncio.Event()
        self.closed = False

    def set(self, status: Status) -> None:
        self.status = status
        self.changed.set()

    def close(self) -> None:
        self.closed = True
        self.changed.set()

    async def publish_each(self, publish: Publish) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            status, self.status = self.status, None
            if status is not None:
                try:
                    await publish(status)
                except Exception as error:  # best effort: the next status goes anyway
                    log.warning("operator.status_not_published", error=str(error))
            if self.closed and self.status is None:
                return


class MeshReconciler:
    def __init__(
        self,
        store: RoutingStore,
        probe: ShardProbe,
        workloads: ClusterWorkloads,
        versions: VersionRollout | None = None,
    ) -> None:
        self.store = store
        self.probe = probe
        self.workloads = workloads
        self.versions = versions

    async def reconcile(self, spec: MeshSpec, publish: Publish) -> Status:
        feed = _StatusFeed()
        async with asyncio.TaskGroup() as group:
            group.create_task(feed.publish_each(publish))
            try:
                final = await self._reconcile(spec, feed)
            finally:
                feed.close()
        return final

    async def _reconcile(self, spec: MeshSpec, latest: _StatusFeed) -> Status:
        progress: WaveProgress | None = None

        def report(wave: WaveProgress) -> None:
            nonlocal progress
            progress = wave
            # A partial status: the resource's status is patched, not replaced.
            latest.set({"phase": SCALING, "epoch": wave.epoch, "wave": wave_status(wave)})

        await self._first_document(spec)
        settings = WaveSettings(wave_size=spec.wave_size, quiesce_s=spec.quiesce_s)
        controller = WaveController(self.store, self.probe, settings, report)
        await controller.resume()
        for cluster_id in spec.clusters:
            cluster = (await self._document()).cluster(cluster_id)
            if cluster is not None and cluster.state == ClusterState.ACTIVE:
                continue
            await self.workloads.ensure(cluster_id)
            if cluster is not None and cluster.state == ClusterState.DRAINING:
                await self.store.change(functools.partial(_drain_cancelled, cluster_id))
            else:
                await controller.activate(cluster_id)
        current = await self._document()
        for user_id, cluster_id in spec.pins.items():
            if current.pins.get(user_id) != cluster_id:
                await controller.move(user_id, cluster_id, pin=True)
        for user_id in sorted(set(current.pins) - set(spec.pins)):
            await controller.move(user_id, None, pin=False)
        present = [c.cluster_id for c in (await self._document()).clusters]
        for cluster_id in sorted(
            (c for c in present if c not in spec.clusters), key=_number, reverse=True
        ):
            await controller.remove(cluster_id)
            await self.workloads.remove(cluster_id)
        final = mesh_status(await self._document(), READY, progress)
        if spec.state_machine_version is not None:
            if self.versions is None:
                raise RoutingDocumentError("this operator cannot switch state-machine versions")
            final["stateMachineVersions"] = await self.versions.ensure(spec.state_machine_version)
        latest.set(final)
        return final

    async def _document(self) -> RoutingDocument:
        return _of(await self.store.read())

    async def _first_document(self, spec: MeshSpec) -> None:
        """Epoch 1 (every asked-for cluster active) if there is no document yet."""
        if await self.store.read() is not None:
            return
        for cluster_id in spec.clusters:
            await self.workloads.ensure(cluster_id)
        with contextlib.suppress(RoutingConflictError):  # another writer made one first
            await self.store.swap(None, first_document(spec.clusters))


def _drain_cancelled(cluster_id: str, stored: StoredRouting | None) -> RoutingDocument:
    return with_drain_cancelled(_of(stored), cluster_id)


def _of(stored: StoredRouting | None) -> RoutingDocument:
    if stored is None:
        raise RoutingDocumentError("the routing document is gone")
    return stored.document


def _number(cluster_id: str) -> int:
    digits = cluster_id.lstrip("s")
    return int(digits) if digits.isdigit() else 0
