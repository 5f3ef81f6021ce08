"""The shard's leader logs every newer routing document it sees in etcd (`SetRouting`).

Ownership is decided by the state machine at the log position of that command, so
every replica, and every replay, decides alike; this loop only carries the document
from etcd into the log. It runs on the leader only (a host's loops do), reads the
document, logs it if its epoch is newer than the machine's, and watches for the next.
A lost etcd connection is retried: meanwhile the shard keeps deciding with the epoch
it has, and a gateway with a newer one gets NOT_OWNER with this epoch and retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from protos.oms.v1 import shard_pb2
from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.routing.core.routing_document import RoutingDocumentError
from services.routing.routing_store import RoutingStore, StoredRouting
from services.runtime.ingress import CommandIngress

log = structlog.get_logger(__name__)
RETRY_S = 1.0


class RoutingFeed:
    def __init__(
        self,
        etcd_endpoints: Sequence[str],
        mesh_id: str,
        ingress: Callable[[], CommandIngress[Any]],
        applied_epoch: Callable[[], int],
    ) -> None:
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.mesh_id = mesh_id
        self.ingress = ingress  # asked when used: a replica has one only once it leads
        self.applied_epoch = applied_epoch  # the machine's epoch, as applied
        self.logged = 0

    async def run(self) -> None:
        while True:
            try:
                async with EtcdSession(self.etcd_endpoints) as session:
                    store = RoutingStore(session, self.mesh_id)
                    current = await store.read()
                    await self._offer(current)
                    async for stored in store.watch(current):
                        await self._offer(stored)
            except CoordinationUnavailable as error:
                log.info("shard.routing_feed_lost", error=str(error))
            except RoutingDocumentError as error:
                # Writers validate before their swap: this is damage, and an operator's
                # to fix. The shard keeps deciding with the epoch it has.
                log.error("shard.routing_document_unreadable", error=str(error))
            await asyncio.sleep(RETRY_S)

    async def _offer(self, stored: StoredRouting | None) -> None:
        if stored is None or stored.epoch <= self.applied_epoch():
            return
        command = shard_pb2.ShardCommand()
        command.set_routing.document = stored.document.encode()
        batch = shard_pb2.ShardCommandBatch(commands=[command])
        await self.ingress().submit(batch.SerializeToString())
        self.logged += 1
        log.info("shard.routing_epoch", epoch=stored.epoch)
