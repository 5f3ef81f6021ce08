"""Prometheus metrics: every service's status numbers, its process, and latency histograms.

Each service already counts what it does for `oms.v1.Status/GetStatus` (tests and
`omsctl` read those); the scrape endpoint exports the same numbers, read at scrape
time, so the two never disagree and no hot path pays for a second set of counters.
A status name becomes a metric name under `oms_`; a name with a dot (`requests.
PlaceOrder`) becomes one metric with the part after the dot as its `key` label.
Which names are gauges (they go down as well as up) is declared once, here; every
other status number only ever grows and is a counter (`_total`).

Latency is what a status number cannot carry: `ACK_LATENCY` is a histogram the
gateway observes on every order it answers, `QUEUE_DWELL` one every sequencer observes
for every submission it takes into a record.

`OMS_METRICS_LISTEN` (host:port) turns the endpoint on (`GET /metrics`, served by
prometheus-client's own HTTP server in a thread of its own, off the event loop).
`OMS_METRICS_TLS=on` serves it over HTTPS with the service's mesh certificate
(`OMS_TLS_CERT`, `OMS_TLS_KEY`) and asks the scraper for a certificate from the mesh's
authority (`OMS_TLS_CA`): Prometheus scrapes with a `tls_config` naming the
authority, its own certificate and `server_name: oms-mesh`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from services.settings import SettingsError, load_settings, setting
from services.transport.tls import TransportSettings

log = structlog.get_logger(__name__)
PREFIX = "oms"
HANDSHAKE_TIMEOUT_S = 5.0  # a scraper that connects and says nothing holds one thread
CONNECTION_TIMEOUT_S = 30.0  # then each read or write of its request and answer
SCRAPE_TIMEOUT_S = 5.0  # a loop this busy is itself the news: that service's numbers wait
StatusNumbers = Callable[[], Mapping[str, int]]

# Status numbers that go down as well as up. Everything else is monotonic.
GAUGES = frozenset(
    {
        # every replicated group (services/runtime/replicated_host.py); `leading` and
        # `term` also of the leader-only roles (services/serving/leader_only.py)
        "leading",
        "term",
        "leader_term",
        "lease_uncertain",
        "applied_position",
        "durable_position",
        "truncated_through",
        "installed_snapshot",
        "machine_version",
        # a state machine's sequencer (services/runtime/sequencer.py)
        "pending_entries",
        "last_batch_entries",
        "max_queue_dwell_ms",
        # the shard (services/shard/service.py)
        "resident_users",
        "dehydrating_users",
        "hydrating_users",
        "parked_commands",
        "in_flight_sagas",
        "in_flight_submits",
        "in_flight_cancels",
        "quarantined_users",
        "halted_users",
        "routing_epoch",
        "leaving_users",
        "armed_switches",
        "dedup_waiting_users",
        "deferred_reconciles",
        "consensus_time_ms",
        "egress_retained_records",
        "egress_retained_items",
        "egress_oldest_position",
        "persisted_through",
        # a matcher group (services/matcher/core/machine.py)
        "resting_orders",
        "known_order_ids",
        "pending_expiries",
        "oms_shards",
        "retained_events",
        "last_trade_id",
        # the gateway (gateway/service.py)
        "stream_subscribers",
        "credentials_cached",
        "shard_link_queued",
        # the persister (persister/service.py)
        "committed_position",
        "complete_position",
        "buffered_rows",
        "pending_hydrations",
        "pending_dedup_lookups",
        "unknown_users_cached",
        # the market-data service (services/market_data/service.py)
        "streams",
        "connections_with_streams",
        "symbols",
        "symbols_known",
        "queued_messages",
        "matcher_connected",
    }
)
_NOT_A_METRIC_CHARACTER = re.compile(r"[^a-zA-Z0-9_]")
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

# One registry per process: the process's own collector, its services' numbers, and
# the histograms below.
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(namespace=PREFIX, registry=REGISTRY)
QUEUE_DWELL = Histogram(
    f"{PREFIX}_sequencer_queue_dwell_seconds",
    "From a submission's arrival at a log's sequencer to the record holding it being formed",
    buckets=LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
ACK_LATENCY = Histogram(
    f"{PREFIX}_gateway_ack_latency_seconds",
    "From a place request read by the gateway to its answer sent (PlaceOrder and Trade)",
    ("api", "outcome"),
    buckets=LATENCY_BUCKETS_S,
    registry=REGISTRY,
)


@dataclass(frozen=True)
class MetricsSettings:
    listen: str = setting(
        env="OMS_METRICS_LISTEN",
        default="",
        help="host:port of the Prometheus scrape endpoint (GET /metrics); empty: none",
    )
    tls: bool = setting(
        env="OMS_METRICS_TLS",
        default=False,
        help="HTTPS with the mesh certificate, the scraper's certificate required",
    )


class StatusCollector(Collector):
    """Every service's status numbers in this process, as metrics read at each scrape.

    One collector for all of them: the same name (`applied_position`, say) from two
    services is one metric with two `service` labels. A service registered again
    under its name (a host restarted in one process) replaces the earlier one.
    """

    def __init__(self) -> None:
        # service -> (its numbers, the event loop that owns the state they read)
        self.sources: dict[str, tuple[StatusNumbers, asyncio.AbstractEventLoop]] = {}

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for service, (numbers, loop) in sorted(self.sources.items()):
            try:
                read = _on_loop(numbers, loop)
            except Exception as error:  # one service's numbers missing, not the scrape
                log.warning("metrics.source_failed", service=service, error=repr(error))
                continue
            for name, value in sorted(read.items()):
                base, _, key = name.partition(".")
                metric = f"{PREFIX}_{_NOT_A_METRIC_CHARACTER.sub('_', base)}"
                family = families.get(metric)
                if family is None:
                    # One label set per family: a keyed name always carries `key`.
                    labels = ["service", "key"] if key else ["service"]
                    kind = GaugeMetricFamily if base in GAUGES else CounterMetricFamily
                    family = kind(metric, f"status number {base}", labels=labels)
                    families[metric] = family
                family.add_metric([service, key] if key else [service], float(value))
        yield from families.values()


def _on_loop(numbers: StatusNumbers, loop: asyncio.AbstractEventLoop) -> Mapping[str, int]:
    """`numbers()` run on `loop`'s thread: the scrape runs in the HTTP server's thread,
    and the state it reads is only ever changed, and so only read, on the loop."""
    if loop.is_closed():
        raise RuntimeError("its event loop is closed")
    answer: concurrent.futures.Future[Mapping[str, int]] = concurrent.futures.Future()

    def read() -> None:
        try:
            answer.set_result(numbers())
        except Exception as error:
            answer.set_exception(error)

    loop.call_soon_threadsafe(read)
    return answer.result(timeout=SCRAPE_TIMEOUT_S)


STATUS = StatusCollector()
REGISTRY.register(STATUS)


class _Endpoint:
    """Whether this process serves its scrape endpoint yet (the first host to ask starts
    it; the server's thread lives as long as the process)."""

    started = False


def serve_metrics(services: Sequence[tuple[str, StatusNumbers]] = ()) -> None:
    """Export `services`' numbers and, if `OMS_METRICS_LISTEN` is set, start the endpoint
    (once per process)."""
    loop = asyncio.get_running_loop()
    for service, numbers in services:
        STATUS.sources[service] = (numbers, loop)
    settings = load_settings(MetricsSettings)
    if not settings.listen or _Endpoint.started:
        return
    host, _, port = settings.listen.rpartition(":")
    if settings.tls:
        bound = _serve_tls(host or "0.0.0.0", int(port))
    else:
        server, _ = start_http_server(int(port), addr=host or "0.0.0.0", registry=REGISTRY)
        bound = server.server_port
    _Endpoint.started = True
    log.info("metrics.serving", address=f"{host}:{bound}", tls=settings.tls)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class _TlsMetricsServer(ThreadingMixIn, WSGIServer):
    """The scrape endpoint over TLS, each handshake in its connection's own thread.

    prometheus-client's TLS wraps the listening socket, so `accept` does the handshake
    in the one serving thread, unbounded: a client that connects and sends nothing
    stalls every scrape. Here the listening socket is plain, and each connection's
    thread does its handshake within `HANDSHAKE_TIMEOUT_S`.
    """

    daemon_threads = True
    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        tls = self.context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()  # no certificate from the mesh's authority: refused here
            tls.settimeout(CONNECTION_TIMEOUT_S)
            super().finish_request(tls, client_address)
        except OSError:
            pass  # this connection only: refused, reset or silent past the timeout
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics.connection_failed", client=str(client_address))


def _serve_tls(host: str, port: int) -> int:
    """HTTPS with the service's mesh certificate; the scraper's from the mesh's authority."""
    files = load_settings(TransportSettings)
    named = (files.certificate_file, files.key_file, files.authority_file)
    if None in named:
        raise SettingsError("OMS_METRICS_TLS=on needs OMS_TLS_CERT, OMS_TLS_KEY and OMS_TLS_CA")
    certificate, key, authority = (str(path) for path in named)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=authority)
    context.load_cert_chain(certificate, key)
    context.verify_mode = ssl.CERT_REQUIRED

    class Server(_TlsMetricsServer):
        address_family = socket.getaddrinfo(host, port)[0][0]

    Server.context = context
    server = make_server(host, port, make_wsgi_app(REGISTRY), Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-tls", daemon=True).start()
    return int(server.server_port)


def numbers_of(status: Callable[[], tuple[Mapping[str, int], Mapping[str, str]]]) -> StatusNumbers:
    """The numbers of a `GetStatus` source (its text fields are for people, not metrics)."""
    return lambda: status()[0]
