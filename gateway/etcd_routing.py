"""Routing by the mesh's routing document in etcd, followed by a watch.

The gateway holds one document at a time, replaced as a whole by one assignment, so
every `route` decides with all of epoch N or all of N+1, never half of one (seed
invariant 5). A watch brings each new epoch; when the gateway learns of a newer one
first (a shard's NOT_OWNER carries its epoch), `newer_epoch` waits briefly for the
watch and then reads etcd itself, so a gateway whose watch is stuck is still
corrected by the shards. Until the first document is read, every route is
UNAVAILABLE (retryable): the gateway never guesses an owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from gateway.clusters import ClusterDirectory, ShardCluster
from gateway.core.refusals import unavailable
from gateway.routing import ShardRoute
from gateway.statistics import GatewayCounters
from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.routing.core.routing_document import RoutingDocument, RoutingDocumentError
from services.routing.routing_store import RoutingStore, StoredRouting

log = structlog.get_logger(__name__)
RETRY_S = (0.1, 0.2, 0.5, 1.0)
WATCH_GRACE_S = 0.2  # how long newer_epoch waits for the watch before reading etcd itself
READ_TIMEOUT_S = 1.0


class EtcdRouting:
    def __init__(
        self,
        directory: ClusterDirectory,
        etcd_endpoints: Sequence[str],
        mesh_id: str,
        counters: GatewayCounters,
    ) -> None:
        if not etcd_endpoints:
            raise ValueError("routing by the document in etcd needs OMS_ETCD_ENDPOINTS")
        self.directory = directory
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.mesh_id = mesh_id
        self.counters = counters
        self._stored: StoredRouting | None = None
        self._changed = asyncio.Event()  # set, and replaced, at each new epoch
        self._reader: EtcdSession | None = None  # for newer_epoch's own reads

    @property
    def document(self) -> RoutingDocument | None:
        return self._stored.document if self._stored is not None else None

    @property
    def epoch(self) -> int:
        return self._stored.epoch if self._stored is not None else 0

    def route(self, user_id: int) -> ShardRoute:
        stored = self._stored  # one reference: the whole of one epoch
        if stored is None:
            raise unavailable("the routing document has not been read yet")
        owner = stored.document.owner_of(user_id)
        return ShardRoute(
            None if owner is None else self.directory.get(owner), stored.document.epoch
        )

    def clusters(self) -> tuple[ShardCluster, ...]:
        document = self.document
        if document is None:
            return ()
        return tuple(self.directory.get(cluster.cluster_id) for cluster in document.clusters)

    async def changed(self) -> None:
        """Returns at the next new epoch."""
        await self._changed.wait()

    async def newer_epoch(self, epoch: int) -> bool:
        if self.epoch > epoch:
            return True
        try:
            async with asyncio.timeout(WATCH_GRACE_S):
                while self.epoch <= epoch:
                    await self._changed.wait()
            return True
        except TimeoutError:
            pass
        self.counters.add("routing_reads")
        try:
            if self._reader is None:
                self._reader = EtcdSession(self.etcd_endpoints)
            async with asyncio.timeout(READ_TIMEOUT_S):
                stored = await RoutingStore(self._reader, self.mesh_id).read()
        except (CoordinationUnavailable, RoutingDocumentError, TimeoutError) as error:
            log.info("gateway.routing_read_failed", error=str(error))
            return self.epoch > epoch
        self._install(stored)
        return self.epoch > epoch

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                async with EtcdSession(self.etcd_endpoints) as session:
                    store = RoutingStore(session, self.mesh_id)
                    self._install(await store.read())
                    failures = 0
                    async for stored in store.watch(self._stored):
                        self._install(stored)
            except CoordinationUnavailable as error:
                log.info("gateway.routing_watch_lost", error=str(error))
            except RoutingDocumentError as error:
                # Writers validate before they swap: this is damage, an operator's to fix.
                # The gateway keeps routing with the epoch it has.
                log.error("gateway.routing_document_unreadable", error=str(error))
            self.counters.add("routing_watch_breaks")
            await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
            failures += 1

    def _install(self, stored: StoredRouting | None) -> None:
        if stored is None or (self._stored is not None and stored.epoch <= self._stored.epoch):
            return
        self._stored = stored
        self.counters.add("routing_epochs")
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        log.info("gateway.routing_epoch", epoch=stored.epoch)

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()
            self._reader = None
