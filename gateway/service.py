"""The gateway process: its parts wired together, as a `ServicePlan` for `ServiceHost`."""

from __future__ import annotations

import time
from collections.abc import Mapping

from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from gateway.account_queries import AccountQueries
from gateway.admin_service import SERVICE_NAME as ADMIN_SERVICE
from gateway.admin_service import AdminService
from gateway.authentication import Authenticator
from gateway.clusters import ClusterDirectory, PersisterPool, parse_cluster_addresses
from gateway.core.validation import RequestValidator
from gateway.credentials import CredentialDirectory, KeyHolder
from gateway.etcd_routing import EtcdRouting
from gateway.history import HistoryQueries
from gateway.hydrate_ahead import HydrateAhead
from gateway.interceptor import GatewayInterceptor
from gateway.matcher_control import MatcherControl
from gateway.order_service import SERVICE_NAME as ORDER_SERVICE
from gateway.order_service import OrderService
from gateway.order_updates import OrderUpdateFanout
from gateway.routing import Routing, ShardRouter, StaticRouting
from gateway.settings import GatewaySettings
from gateway.statistics import GatewayCounters
from services.clients.matcher_directory import MatcherDirectory
from services.markets.catalog import load_catalog
from services.serving.service_host import ServicePlan
from services.serving.status_service import STATUS_SERVICE
from services.settings import SettingsError


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def admin_holder(settings: GatewaySettings) -> KeyHolder | None:
    if not settings.admin_api_key:
        return None
    if not settings.admin_api_secret:
        raise SettingsError("OMS_ADMIN_API_KEY is set but OMS_ADMIN_API_SECRET is empty")
    return KeyHolder(settings.admin_api_key, settings.admin_api_secret, 0, admin=True)


STATIC, BY_ETCD = "static", "etcd"


def cluster_directory(settings: GatewaySettings, counters: GatewayCounters) -> ClusterDirectory:
    if settings.routing == STATIC:
        shards = {settings.shard_id: settings.shard_address}
        persisters = {settings.shard_id: settings.persister_address}
    elif settings.routing == BY_ETCD:
        shards = parse_cluster_addresses(settings.shards, "OMS_SHARDS")
        persisters = parse_cluster_addresses(settings.persisters, "OMS_PERSISTERS")
    else:
        raise SettingsError(
            f"OMS_GATEWAY_ROUTING is {STATIC} or {BY_ETCD}, not {settings.routing!r}"
        )
    return ClusterDirectory(
        shards,
        persisters,
        etcd_endpoints=settings.etcd_endpoints,
        mesh_id=settings.mesh_id,
        shard_timeout_s=settings.request_deadline_ms / 1000,
        shard_unanswered_batches=settings.shard_unanswered_batches or None,
        persister_timeout_s=settings.persister_timeout_ms / 1000,
        counters=counters,
    )


def make_routing(
    settings: GatewaySettings, clusters: ClusterDirectory, counters: GatewayCounters
) -> Routing:
    if settings.routing == STATIC:
        return StaticRouting(clusters.get(settings.shard_id))
    if not settings.etcd_endpoints:
        raise SettingsError("OMS_GATEWAY_ROUTING=etcd needs OMS_ETCD_ENDPOINTS")
    return EtcdRouting(clusters, settings.etcd_endpoints, settings.mesh_id, counters)


class Gateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        catalog = load_catalog(settings.markets_file)
        directory = MatcherDirectory.parse(settings.matchers, catalog)
        self.counters = counters = GatewayCounters()
        self.clusters = cluster_directory(settings, counters)
        self.routing = routing = make_routing(settings, self.clusters, counters)
        self.router = ShardRouter(routing, counters, reroute_s=settings.reroute_ms / 1000)
        self.persisters = PersisterPool(routing.clusters)
        self.credentials = CredentialDirectory(
            self.persisters,
            admin=admin_holder(settings),
            capacity=settings.credential_cache_size,
            ttl_s=settings.credential_ttl_ms / 1000,
            unknown_ttl_s=settings.unknown_key_ttl_ms / 1000,
            stale_limit_s=settings.credential_stale_limit_ms / 1000,
            retry_s=settings.credential_retry_ms / 1000,
        )
        self.hydrate_ahead = HydrateAhead(
            routing, counters, interval_s=settings.prefetch_interval_ms / 1000
        )
        self.order_updates = OrderUpdateFanout(
            routing, counters, capacity=settings.order_update_queue
        )
        self.matchers = MatcherControl(
            directory,
            timeout_s=settings.matcher_timeout_ms / 1000,
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
        )
        validator = RequestValidator(catalog, wall_clock_ms)
        self.orders = OrderService(
            validator=validator,
            router=self.router,
            queries=AccountQueries(self.router, self.hydrate_ahead, catalog.by_symbol()),
            history=HistoryQueries(self.router, validator, catalog.by_symbol()),
            order_updates=self.order_updates,
            counters=counters,
            trade_in_flight=settings.trade_in_flight,
            request_deadline_s=settings.request_deadline_ms / 1000,
        )
        self.admin = AdminService(
            validator=validator,
            router=self.router,
            persister=self.persisters,
            matchers=self.matchers,
        )
        self.interceptor = GatewayInterceptor(
            Authenticator(
                self.credentials,
                timestamp_window_ms=settings.timestamp_window_ms,
                wall_clock_ms=wall_clock_ms,
            ),
            counters,
            self.hydrate_ahead.offer,
            deadline_s=settings.request_deadline_ms / 1000,
        )

    def status(self) -> tuple[Mapping[str, int], Mapping[str, str]]:
        counters = dict(self.counters.snapshot())
        counters["stream_subscribers"] = self.order_updates.subscriber_count
        credentials = self.credentials.statistics()
        counters["credentials_cached"] = credentials.cached
        counters["credential_cache_hits"] = credentials.hits
        counters["credential_cache_misses"] = credentials.misses
        counters["credential_lookups"] = credentials.lookups
        counters["credential_stale_hits"] = credentials.stale_hits
        counters["credential_refresh_failures"] = credentials.refresh_failures
        clusters = self.routing.clusters()
        links = [cluster.shard.link.statistics() for cluster in clusters]
        counters["shard_batches_sent"] = sum(link.sent_batches for link in links)
        counters["shard_commands_sent"] = sum(link.sent_commands for link in links)
        counters["shard_batches_held"] = sum(link.held_batches for link in links)
        counters["shard_stream_breaks"] = sum(link.breaks for link in links)
        counters["shard_link_stalls"] = sum(link.stalls for link in links)
        counters["shard_link_queued"] = sum(link.queued for link in links)
        counters["shard_link_refused_away"] = sum(link.refused_away for link in links)
        counters["shard_link_refused_busy"] = sum(link.refused_busy for link in links)
        counters["shard_link_timeouts"] = sum(link.timeouts for link in links)
        counters["routing_epoch"] = self.routing.epoch
        info = {
            "routing": self.settings.routing,
            "shards": ",".join(f"{c.cluster_id}={c.shard.address}" for c in clusters),
            "persisters": ",".join(f"{c.cluster_id}={c.persister.address}" for c in clusters),
            "matchers": self.matchers.directory.format(),
        }
        return counters, info

    def plan(self) -> ServicePlan:
        def register(server: object) -> None:
            self.orders.register(server)
            self.admin.register(server)
            if self.settings.reflection:
                # Unsigned, like health: the interceptor guards only the two gateway
                # services, and describing them grants nothing.
                reflection.enable_server_reflection(
                    (
                        ORDER_SERVICE,
                        ADMIN_SERVICE,
                        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                        STATUS_SERVICE,
                        reflection.SERVICE_NAME,
                    ),
                    server,
                )

        return ServicePlan(
            name="gateway",
            service_names=(ORDER_SERVICE, ADMIN_SERVICE),
            register=register,
            status=self.status,
            loops=[self.routing.run, self.order_updates.run, self.hydrate_ahead.run],
            interceptors=(self.interceptor,),
        )

    async def close(self) -> None:
        await self.interceptor.deadlines.close()
        await self.routing.close()
        await self.clusters.close()
        await self.matchers.close()
