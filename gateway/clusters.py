"""The user-shard clusters as the gateway reaches them: each one's shard and persister.

A cluster is named by the routing document (`services/routing/`); its addresses come
from the gateway's settings (`OMS_SHARDS`, `OMS_PERSISTERS`: `id=host:port` or
`id=etcd`), and a cluster the settings do not list is found through its leaders'
keys in etcd, so a cluster that joins later needs no gateway restart. A cluster's
clients are made on first use and kept: one `ShardLink` per shard for the whole
process, whatever the number of clients.

Reads that are not about one user's shard (API keys, new accounts) may go to any
persister, since every persister reads the one database: `PersisterPool` asks them
in turn, starting from a different one each call, until one answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import count

from google.protobuf.message import Message

from gateway.core.refusals import GatewayError, unavailable
from gateway.persister_client import AnswerT, PersisterClient
from gateway.shard_endpoint import ShardEndpoint
from gateway.statistics import GatewayCounters
from protos.oms.v1 import gateway_pb2, persister_pb2
from services.coordination.addresses import FROM_ETCD, address_source

UNAVAILABLE = gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE


class ClusterAddressError(ValueError):
    """An `id=address,...` setting that does not parse."""


def parse_cluster_addresses(text: str, setting: str) -> dict[str, str]:
    """`s1=host:port,s2=etcd` as {cluster id: address}."""
    addresses: dict[str, str] = {}
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        cluster_id, separator, address = part.partition("=")
        if not separator or not cluster_id.strip() or not address.strip():
            raise ClusterAddressError(f"{setting}: expected id=host:port or id=etcd, got {part!r}")
        addresses[cluster_id.strip()] = address.strip()
    return addresses


@dataclass(frozen=True, slots=True)
class ShardCluster:
    cluster_id: str
    shard: ShardEndpoint
    persister: PersisterClient


class ClusterDirectory:
    def __init__(
        self,
        shards: Mapping[str, str],
        persisters: Mapping[str, str],
        *,
        etcd_endpoints: Sequence[str],
        mesh_id: str,
        shard_timeout_s: float,
        persister_timeout_s: float,
        counters: GatewayCounters,
        shard_unanswered_batches: int | None = None,
    ) -> None:
        self.shard_addresses = dict(shards)
        self.persister_addresses = dict(persisters)
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.mesh_id = mesh_id
        self.shard_timeout_s = shard_timeout_s
        self.shard_unanswered_batches = shard_unanswered_batches
        self.persister_timeout_s = persister_timeout_s
        self.counters = counters
        self._clusters: dict[str, ShardCluster] = {}

    def get(self, cluster_id: str) -> ShardCluster:
        """The cluster's clients (made on first use); UNAVAILABLE if it cannot be reached."""
        cluster = self._clusters.get(cluster_id)
        if cluster is None:
            cluster = self._clusters[cluster_id] = self._make(cluster_id)
        return cluster

    def known(self) -> list[ShardCluster]:
        """Every cluster made so far, by id."""
        return [self._clusters[cluster_id] for cluster_id in sorted(self._clusters)]

    def _make(self, cluster_id: str) -> ShardCluster:
        shard = self.shard_addresses.get(cluster_id, FROM_ETCD)
        persister = self.persister_addresses.get(cluster_id, FROM_ETCD)
        if FROM_ETCD in (shard, persister) and not self.etcd_endpoints:
            self.counters.add("shard_unavailable")
            raise unavailable(f"no address for cluster {cluster_id}, and no etcd to find it")
        etcd, mesh = self.etcd_endpoints, self.mesh_id
        return ShardCluster(
            cluster_id,
            ShardEndpoint(
                address_source(
                    shard, kind="shard", name=cluster_id, etcd_endpoints=etcd, mesh_id=mesh
                ),
                timeout_s=self.shard_timeout_s,
                counters=self.counters,
                unanswered_batches=self.shard_unanswered_batches,
            ),
            PersisterClient(
                address_source(
                    persister, kind="persister", name=cluster_id, etcd_endpoints=etcd, mesh_id=mesh
                ),
                timeout_s=self.persister_timeout_s,
            ),
        )

    async def close(self) -> None:
        for cluster in self._clusters.values():
            await cluster.shard.close()
            await cluster.persister.close()
        self._clusters.clear()


class PersisterPool:
    """Any persister, for reads of the shared database that belong to no shard."""

    def __init__(self, clusters: Callable[[], Sequence[ShardCluster]]) -> None:
        self.clusters = clusters  # the routing's clusters now
        self._turn = count()

    async def credential(self, api_key: str) -> persister_pb2.Credential | None:
        last: GatewayError | None = None
        for persister in self._in_turn():
            try:
                return await persister.credential(api_key)
            except GatewayError as error:
                if error.reason != UNAVAILABLE:
                    raise
                last = error
        assert last is not None  # _in_turn is never empty
        raise last

    async def create_user(self, new_user: persister_pb2.NewUser) -> persister_pb2.CreatedUser:
        # Not retried on another persister: a call that timed out may have created the
        # user, and the client's retry with the same id answers USER_EXISTS either way.
        return await next(iter(self._in_turn())).create_user(new_user)

    async def admin_call(
        self, call: str, request: Message, response_type: type[AnswerT]
    ) -> AnswerT:
        """An admin call on one persister (keys, users and the audit: the shared database)."""
        return await next(iter(self._in_turn())).admin_call(call, request, response_type)

    def _in_turn(self) -> list[PersisterClient]:
        clusters = list(self.clusters())
        if not clusters:
            raise unavailable("no shard cluster is known yet")
        start = next(self._turn) % len(clusters)
        return [cluster.persister for cluster in clusters[start:] + clusters[:start]]
