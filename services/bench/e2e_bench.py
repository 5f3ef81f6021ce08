"""`oms bench e2e`: orders through the whole mesh, against the design the seeds reject.

A throwaway mesh is started exactly as `make run` starts it (`oms up`: every
service its own process, embedded etcd and PostgreSQL). Users are created and
funded through the admin API; then, per offered rate, limit orders go through
the gateway for `--seconds`:

- unary: one signed `PlaceOrder` call per order, open loop (each order is
  scheduled at its slot; latency is measured from the slot, so a stall is not
  hidden by the generator slowing down), at most `--unary-outstanding` in flight;
- stream: `Trade` streams carrying batches (every `--tick-ms`, the orders due),
  latency per order from its batch's slot to its ack.

An ack is the gateway's answer, given once the shard's log entry holding the
order is durable. Half the users (and half the streams) buy one lot at the
reference price and half sell it, so orders trade with each other: the run
carries fills, settlement and write-behind, and the book stays small. Rate 0
means "as fast as it goes".

Workloads (`--workloads`): `uniform` spreads the orders evenly over the users;
`hot` gives `--hot-users` whales `--hot-percent` of the flow (unary: of the
orders; stream: of the rate, the whales' streams being the first ones), the rest
spread over the others.

CPU per acknowledged order is summed over every process of the mesh, PostgreSQL's
and etcd's included, and the mesh's idle CPU is measured before the first phase. The
load generator (this process: signing, its gRPC client) shares the same cores; its own
CPU per order is printed beside the mesh's ("load µs"), so a maximum can be read as
what the mesh and its client reached together on these cores.

Once every mesh is stopped, the design the seeds reject (`row_lock_design.py`:
pgbench against the same PostgreSQL, the same users, each workload, the best of
`--design-clients`) runs the full job (reserve, then settle each fill) and the
reservation alone; the report prints every figure beside the goal it is held to.

`--replicas 1,3` runs the same phases on a mesh of each replica count in turn (the
shard and each matcher group as one replica on a file log, then three over logs in
etcd), one table each, CPU summed over all replicas of a service. `--shards 1,2` does
the same for meshes of one and of two user-shard clusters (the users spread over
them by the routing document's hash; CPU summed over the clusters' processes of a
service), each of every replica count asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import uvloop

from gateway.signing import signed_metadata
from protos.oms.v1 import (
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    shard_pb2,
    status_pb2,
    status_pb2_grpc,
)
from services.bench.latency import summarize_ms
from services.bench.mesh_launch import LaunchedMesh
from services.bench.open_loop import open_loop
from services.bench.row_lock_design import DesignResult, Workload, best_of
from services.bench.transport_counts import (
    PhaseTransport,
    TransportSnapshot,
    phase_transport,
)
from services.bench.transport_counts import snapshot as transport_snapshot
from services.clients.channels import gateway_channel
from services.infra.local_infra import LocalInfra
from services.runtime.collector import settle_long_lived_state
from services.transport.grpc_runtime import MESH_GRPC_EXPERIMENTS
from services.transport.tls import mesh_transport

SYMBOL = "BTC-USDT"
REFERENCE_PRICE_TICKS = 6_500_000
PLACE_METHOD = "/oms.v1.OrderGateway/PlaceOrder"
TRADE_METHOD = "/oms.v1.OrderGateway/Trade"
FUNDS_USDT = 10**15
FUNDS_BTC = 10**13
QUIET_CORES = 0.5  # a phase starts once the mesh uses less than this
QUIET_SAMPLE_S = 0.5
QUIET_TIMEOUT_S = 120.0
REFUSALS: Counter[str] = Counter()
# Loopback scrapes: never through an http_proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# --grpc-event-engine: the GRPC_EXPERIMENTS each mesh's services get.
EVENT_ENGINE_EXPERIMENTS = {
    "off": MESH_GRPC_EXPERIMENTS,
    "on": "",
}  # refused orders by reason, over one mesh's phases


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    parser.add_argument("--unary-rates", default="250", help="offered orders/s; 0: max")
    parser.add_argument("--stream-rates", default="500,1000,2000,0", help="offered orders/s")
    parser.add_argument("--unary-outstanding", type=int, default=256)
    parser.add_argument("--streams", type=int, default=8, help="Trade streams in parallel")
    parser.add_argument(
        "--stream-outstanding",
        type=int,
        default=1_000,
        help="unanswered orders per stream, at most",
    )
    parser.add_argument("--batch", type=int, default=100, help="orders per stream batch cap")
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--users", type=int, default=64, help="funded whale-tier users")
    parser.add_argument(
        "--workloads", default="uniform,hot", help="uniform and/or hot (whales carry the flow)"
    )
    parser.add_argument("--hot-users", type=int, default=4, help="hot workload: the whales")
    parser.add_argument(
        "--hot-percent", type=int, default=80, help="hot workload: the whales' share of orders"
    )
    parser.add_argument(
        "--design-clients",
        default="16,64",
        help="pgbench client counts for the row-lock design; the best is reported",
    )
    parser.add_argument(
        "--design-seconds", type=float, default=None, help="per pgbench run (default: --seconds)"
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=3.0, help="the idle mesh's CPU is sampled this long"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument(
        "--replicas",
        default="1",
        help="replica counts to measure in turn, e.g. 1,3 (each its own mesh)",
    )
    parser.add_argument(
        "--shards",
        default="1",
        help="user-shard cluster counts to measure in turn, e.g. 1,2 (each its own mesh)",
    )
    parser.add_argument(
        "--colocate",
        default="off",
        help="off (each service a process), on (`oms up --colocate`: each shard cluster in"
        " one process), or both in turn: off,on",
    )
    parser.add_argument(
        "--grpc-event-engine",
        default="off",
        help="off (oms's default: GRPC_EXPERIMENTS turns gRPC's EventEngine client and"
        " listener off), on (gRPC's own defaults), or both in turn: off,on",
    )
    parser.add_argument(
        "--transports",
        default="tls",
        help="tls (oms up's default: mutual inside the mesh, the gateway's port checked by"
        " its authority), plaintext (oms up --plaintext), or both in turn: tls,plaintext",
    )


@dataclass(frozen=True)
class User:
    user_id: int
    api_key: str
    api_secret: str


@dataclass(frozen=True)
class UserMix:
    """Which user places order number n, and with what share each stream trades."""

    workload: str
    users: int
    hot_users: int
    hot_percent: int

    def user_index(self, number: int) -> int:
        if self.workload != "hot":
            return number % self.users
        # A fixed stride over 0..99 spreads the whales' share evenly through the run.
        if (number * 37) % 100 < self.hot_percent:
            return number % self.hot_users
        return self.hot_users + number % (self.users - self.hot_users)

    def stream_shares(self, streams: int) -> list[float]:
        if self.workload != "hot":
            return [1.0 / streams] * streams
        whales = min(self.hot_users, streams - 1)
        hot = self.hot_percent / 100
        return [hot / whales] * whales + [(1 - hot) / (streams - whales)] * (streams - whales)


@dataclass(frozen=True)
class PhaseResult:
    api: str
    workload: str
    offered_per_s: int
    acked: int
    refused: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    cpu_us_per_order: dict[str, float] = field(default_factory=dict)
    transport: PhaseTransport | None = None
    database: dict[str, int] = field(default_factory=dict)  # the persisters' round trips
    log_records: dict[str, int] = field(default_factory=dict)  # by the shards, the matchers
    load_cpu_us_per_order: float = 0.0  # the load generator's own (this process)

    @property
    def orders_per_s(self) -> float:
        return self.acked / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_total(self) -> float:
        return sum(self.cpu_us_per_order.values())


@dataclass
class MeshMeasurement:
    shape: str
    idle_cpu_percent: dict[str, float]
    results: list[PhaseResult]
    refusals: Counter[str]


def run(arguments: argparse.Namespace) -> int:
    if arguments.state_dir is None:
        with tempfile.TemporaryDirectory(prefix="oms-bench-e2e-") as folder:
            return _run_in(Path(folder), arguments)
    return _run_in(arguments.state_dir, arguments)


def _run_in(state_dir: Path, arguments: argparse.Namespace) -> int:
    transports = [part.strip() for part in arguments.transports.split(",") if part.strip()]
    if not transports or set(transports) - {"tls", "plaintext"}:
        print(f"oms bench e2e: --transports {arguments.transports!r}", file=sys.stderr)
        return 2
    engines = [part.strip() for part in arguments.grpc_event_engine.split(",") if part.strip()]
    if not engines or set(engines) - set(EVENT_ENGINE_EXPERIMENTS):
        print(
            f"oms bench e2e: --grpc-event-engine {arguments.grpc_event_engine!r}", file=sys.stderr
        )
        return 2
    colocations = [part.strip() for part in arguments.colocate.split(",") if part.strip()]
    if not colocations or set(colocations) - {"off", "on"}:
        print(f"oms bench e2e: --colocate {arguments.colocate!r}", file=sys.stderr)
        return 2
    shapes = [
        (replicas, shards, transport, engine, colocation)
        for shards in _counts(arguments.shards)
        for replicas in _counts(arguments.replicas)
        for transport in transports
        for engine in engines
        for colocation in colocations
    ]
    measured: list[MeshMeasurement] = []
    design_folder: Path | None = None
    for index, (replicas, shards, transport, engine, colocation) in enumerate(shapes, start=1):
        shape = (
            f"{shards} shard cluster(s), {replicas} replica(s) of each shard and matcher group,"
            f" {'TLS' if transport == 'tls' else 'plaintext'}, gRPC EventEngine {engine},"
            f" {'co-located clusters' if colocation == 'on' else 'a process per service'}"
        )
        name = (
            f"{index}-shards-{shards}-replicas-{replicas}-{transport}"
            f"-event-engine-{engine}-colocate-{colocation}"
        )
        folder = state_dir / name if len(shapes) > 1 else state_dir
        design_folder = design_folder or folder
        print(f"starting the mesh ({shape}) under {folder} ...", flush=True)
        plaintext = transport == "plaintext"
        with LaunchedMesh(
            folder,
            replicas=replicas,
            shards=shards,
            plaintext=plaintext,
            grpc_experiments=EVENT_ENGINE_EXPERIMENTS[engine],
            colocated=colocation == "on",
        ) as mesh:
            assert mesh.record is not None
            REFUSALS.clear()
            idle, results = uvloop.run(_measure(mesh, arguments))
            measured.append(MeshMeasurement(shape, idle, results, Counter(REFUSALS)))
    assert design_folder is not None
    design = _measure_design(design_folder, arguments)
    for measurement in measured:
        if len(shapes) > 1:
            print(f"\n=== {measurement.shape} ===")
        _report(measurement, design, arguments)
    return 0


def _measure_design(folder: Path, arguments: argparse.Namespace) -> list[DesignResult]:
    """The row-lock design with the mesh stopped: only PostgreSQL (and an idle etcd) run."""
    print("the mesh is stopped; the row-lock design on the same PostgreSQL ...", flush=True)
    infra = LocalInfra(folder)
    endpoints = infra.up()
    seconds = arguments.design_seconds or arguments.seconds
    results = []
    try:
        for workload in _workloads(arguments):
            mix = Workload(
                workload,
                users=arguments.users,
                hot_users=arguments.hot_users,
                hot_percent=arguments.hot_percent,
            )
            for job in ("full", "reserve"):
                result = best_of(
                    endpoints.database_url,
                    job,
                    mix,
                    client_counts=_counts(arguments.design_clients),
                    seconds=seconds,
                )
                print(_design_line(result), flush=True)
                results.append(result)
    finally:
        infra.down()
    return results


async def _measure(
    mesh: LaunchedMesh, arguments: argparse.Namespace
) -> tuple[dict[str, float], list[PhaseResult]]:
    record = mesh.record
    assert record is not None
    async with gateway_channel(record.gateway) as channel:
        users = await _funded_users(
            channel, record.admin_api_key, record.admin_api_secret, arguments.users
        )
        # The load generator's own collector as the gateway's: less of the shared cores.
        settle_long_lived_state()
        idle = await _idle_cpu_percent(mesh, arguments.idle_seconds)
        print(
            "idle mesh, % of a core: "
            + ", ".join(f"{name} {percent:.1f}" for name, percent in sorted(idle.items()))
            + f"; all {sum(idle.values()):.1f}",
            flush=True,
        )
        orders = gateway_pb2_grpc.OrderGatewayStub(channel)
        sequence = itertools.count(1)
        results: list[PhaseResult] = []
        for workload in _workloads(arguments):
            mix = UserMix(workload, len(users), arguments.hot_users, arguments.hot_percent)
            phases = [(_unary_phase, rate) for rate in _rates(arguments.unary_rates)]
            phases += [(_stream_phase, rate) for rate in _rates(arguments.stream_rates)]
            for phase, rate in phases:
                await _quiet(mesh)
                counted_before = await _transport_snapshot(mesh)
                database_before = await _database_counts(mesh)
                records_before = await asyncio.to_thread(_log_records, mesh)
                before = mesh.service_cpu_seconds()
                load_before = time.process_time()
                result = await phase(
                    orders, users, mix=mix, rate=rate, sequence=sequence, arguments=arguments
                )
                load_used = time.process_time() - load_before
                after = mesh.service_cpu_seconds()
                counted_after = await _transport_snapshot(mesh)
                database_after = await _database_counts(mesh)
                records_after = await asyncio.to_thread(_log_records, mesh)
                per_order = {
                    name: 1e6 * (used - before.get(name, 0.0)) / max(result.acked, 1)
                    for name, used in sorted(after.items())
                }
                transport = phase_transport(
                    counted_before,
                    counted_after,
                    mesh.listening_ports(),
                    etcd_ports=[int(e.rpartition(":")[2]) for e in mesh.etcd_endpoints],
                )
                database = {
                    name: value - database_before.get(name, 0)
                    for name, value in database_after.items()
                }
                records = {
                    name: value - records_before.get(name, 0)
                    for name, value in records_after.items()
                }
                results.append(
                    replace(
                        result,
                        cpu_us_per_order=per_order,
                        transport=transport,
                        database=database,
                        log_records=records,
                        load_cpu_us_per_order=1e6 * load_used / max(result.acked, 1),
                    )
                )
                print(_line(results[-1]), flush=True)
    return idle, results


async def _transport_snapshot(mesh: LaunchedMesh) -> TransportSnapshot:
    return await transport_snapshot(mesh.service_addresses(), mesh.service_processes())


def _log_records(mesh: LaunchedMesh) -> dict[str, int]:
    """Log records each shard and matcher process has written so far (the sequencer's
    `oms_records_total` on its metrics endpoint), by service name; followers write none."""
    record = mesh.record
    if record is None:
        return {}
    counted: Counter[str] = Counter()
    for child, address in record.metrics.items():
        if not child.startswith(("shard-", "matcher-")):
            continue
        name = "shard" if child.startswith("shard-") else "-".join(child.split("-")[:2])
        try:
            with _NO_PROXY.open(f"http://{address}/metrics", timeout=5.0) as response:
                text = response.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith('oms_records_total{service="sequencer"}'):
                counted[name] += int(float(line.rsplit(" ", 1)[1]))
    return dict(counted)


async def _database_counts(mesh: LaunchedMesh) -> dict[str, int]:
    """The persisters' PostgreSQL round trips and transactions so far, summed."""
    totals: Counter[str] = Counter()
    for address in mesh.role_addresses("persister"):
        async with mesh_transport().channel(address, ()) as channel:
            report = await status_pb2_grpc.StatusStub(channel).GetStatus(
                status_pb2.StatusRequest(), timeout=5.0
            )
        for name in ("database_round_trips", "database_transactions"):
            totals[name] += report.counters.get(name, 0)
    return dict(totals)


async def _quiet(mesh: LaunchedMesh) -> None:
    """Until the mesh has worked off the previous phase (a maximum leaves sagas in flight
    and rows to write for a while): its processes together below QUIET_CORES."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while time.monotonic() < deadline:
        if sum((await _idle_cpu_percent(mesh, QUIET_SAMPLE_S)).values()) < 100 * QUIET_CORES:
            return
    print(f"the mesh is still busy after {QUIET_TIMEOUT_S:g} s; measuring anyway", flush=True)


async def _idle_cpu_percent(mesh: LaunchedMesh, seconds: float) -> dict[str, float]:
    before = mesh.service_cpu_seconds()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = mesh.service_cpu_seconds()
    elapsed = time.monotonic() - started
    return {name: 100 * (used - before.get(name, 0.0)) / elapsed for name, used in after.items()}


def _counts(text: str) -> list[int]:
    return [int(part) for part in str(text).split(",") if part.strip()]


def _rates(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _workloads(arguments: argparse.Namespace) -> list[str]:
    names = [part.strip() for part in arguments.workloads.split(",") if part.strip()]
    for name in names:
        if name not in ("uniform", "hot"):
            raise SystemExit(f"oms bench e2e: unknown workload {name!r} (uniform, hot)")
    return names


async def _funded_users(
    channel: grpc.aio.Channel, admin_key: str, admin_secret: str, count: int
) -> list[User]:
    admin = gateway_pb2_grpc.AdminGatewayStub(channel)

    async def call(method: str, stub_call: Any, request: Any) -> Any:
        metadata = signed_metadata(admin_key, admin_secret, method, request, _now_ms())
        return await stub_call(request, metadata=metadata, timeout=30)

    users: list[User] = []
    for _ in range(count):
        created = await call(
            "/oms.v1.AdminGateway/CreateUser",
            admin.CreateUser,
            gateway_pb2.CreateUserRequest(tier=shard_pb2.USER_TIER_WHALE),
        )
        users.append(User(created.user_id, created.api_key, created.api_secret))
    for user in users:
        for asset, amount in (("USDT", FUNDS_USDT), ("BTC", FUNDS_BTC)):
            ack = await call(
                "/oms.v1.AdminGateway/Deposit",
                admin.Deposit,
                gateway_pb2.TransferRequest(
                    user_id=user.user_id,
                    asset=asset,
                    amount=amount,
                    transfer_id=f"bench-{user.user_id}-{asset}",
                ),
            )
            if not ack.accepted:
                raise RuntimeError(f"deposit for user {user.user_id} refused: {ack}")
    return users


def _order(user: User, number: int, buyer: bool) -> gateway_pb2.PlaceOrderRequest:
    """One lot at the reference price: buyers' and sellers' orders trade with each other,
    so the book stays small and the run includes fills, not only resting orders."""
    return gateway_pb2.PlaceOrderRequest(
        user_id=user.user_id,
        client_order_id=f"b{number}",
        symbol=SYMBOL,
        side=common_pb2.SIDE_BUY if buyer else common_pb2.SIDE_SELL,
        order_type=common_pb2.ORDER_TYPE_LIMIT,
        time_in_force=common_pb2.TIME_IN_FORCE_GTC,
        price_ticks=REFERENCE_PRICE_TICKS,
        quantity_lots=1,
    )


async def _unary_phase(
    orders: gateway_pb2_grpc.OrderGatewayStub,
    users: Sequence[User],
    *,
    mix: UserMix,
    rate: int,
    sequence: itertools.count[int],
    arguments: argparse.Namespace,
) -> PhaseResult:
    latencies_ns: list[int] = []
    refused = 0

    async def place(slot_ns: int) -> None:
        nonlocal refused
        number = next(sequence)
        index = mix.user_index(number)
        user = users[index]
        request = _order(user, number, buyer=index % 2 == 0)
        metadata = signed_metadata(user.api_key, user.api_secret, PLACE_METHOD, request, _now_ms())
        try:
            ack = await orders.PlaceOrder(request, metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as error:
            # A mesh still working off an earlier phase's overload answers late.
            refused += 1
            REFUSALS[error.code().name] += 1
            return
        if ack.accepted:
            latencies_ns.append(time.perf_counter_ns() - slot_ns)
        else:
            refused += 1
            REFUSALS[shard_pb2.ShardRejectReason.Name(ack.reject_reason)] += 1

    elapsed = await open_loop(
        place, rate=rate, seconds=arguments.seconds, outstanding=arguments.unary_outstanding
    )
    return PhaseResult(
        "unary",
        mix.workload,
        rate,
        len(latencies_ns),
        refused,
        elapsed,
        *summarize_ms(latencies_ns),
    )


async def _stream_phase(
    orders: gateway_pb2_grpc.OrderGatewayStub,
    users: Sequence[User],
    *,
    mix: UserMix,
    rate: int,
    sequence: itertools.count[int],
    arguments: argparse.Namespace,
) -> PhaseResult:
    latencies_ns: list[int] = []
    refused = 0
    streams = max(2, arguments.streams)
    shares = mix.stream_shares(streams)
    tick_ns = int(arguments.tick_ms * 1e6)
    started = time.perf_counter_ns()
    deadline = started + int(arguments.seconds * 1e9)

    async def one_stream(index: int) -> None:
        nonlocal refused
        user = users[index % len(users)]
        buyer = index % 2 == 0  # streams pair up: even ones buy, odd ones sell
        share = shares[index]
        # As fast as it goes: each stream's batches in proportion to its share.
        batch_at_max = max(1, round(arguments.batch * share * streams))
        sent_at: dict[int, int] = {}
        outstanding = asyncio.Semaphore(arguments.stream_outstanding)
        done_sending = asyncio.Event()
        all_answered = asyncio.Event()

        async def batches() -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
            due_total = 0
            for tick in itertools.count():
                slot = started + tick * tick_ns
                # At the maximum the slots run ahead of the clock (a batch per tick, not
                # waited for): the phase ends at its deadline, not after its ticks' worth
                # of orders (which once kept it going for five minutes).
                if slot >= deadline or (not rate and time.perf_counter_ns() >= deadline):
                    break
                now = time.perf_counter_ns()
                if slot > now:
                    await asyncio.sleep((slot - now) / 1e9)
                if rate:
                    target = math.floor((slot - started + tick_ns) / 1e9 * rate * share)
                    due = target - due_total
                else:
                    due = batch_at_max
                due_total += due
                while due > 0:
                    batch = gateway_pb2.TradeRequestBatch()
                    for _ in range(min(due, arguments.batch)):
                        await outstanding.acquire()
                        number = next(sequence)
                        sent_at[number] = slot if rate else time.perf_counter_ns()
                        batch.requests.add(request_id=number, place=_order(user, number, buyer))
                    due -= len(batch.requests)
                    yield batch
            done_sending.set()
            if sent_at:
                await all_answered.wait()  # half-closing now would end the stream early

        metadata = signed_metadata(user.api_key, user.api_secret, TRADE_METHOD, None, _now_ms())
        call = orders.Trade(batches(), metadata=metadata)
        async for response_batch in call:
            now = time.perf_counter_ns()
            for response in response_batch.responses:
                slot = sent_at.pop(response.request_id, None)
                outstanding.release()
                if slot is None:
                    continue
                if response.WhichOneof("response") == "place" and response.place.accepted:
                    latencies_ns.append(now - slot)
                else:
                    refused += 1
                    REFUSALS[_reason(response)] += 1
            if done_sending.is_set() and not sent_at:
                all_answered.set()
                call.cancel()
                break

    await asyncio.gather(*(one_stream(index) for index in range(streams)))
    elapsed = (time.perf_counter_ns() - started) / 1e9
    return PhaseResult(
        "stream",
        mix.workload,
        rate,
        len(latencies_ns),
        refused,
        elapsed,
        *summarize_ms(latencies_ns),
    )


def _reason(response: gateway_pb2.TradeResponse) -> str:
    if response.WhichOneof("response") == "error":
        return gateway_pb2.GatewayErrorReason.Name(response.error.reason)
    return shard_pb2.ShardRejectReason.Name(response.place.reject_reason)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _offered(rate: int) -> str:
    return f"{rate:,}" if rate else "max"


def _line(result: PhaseResult) -> str:
    return (
        f"{result.api:<8}{result.workload:<9}{_offered(result.offered_per_s):>7}"
        f"{result.orders_per_s:>10,.0f}{result.p50_ms:>9.2f}{result.p99_ms:>9.2f}"
        f"{result.max_ms:>9.2f}{result.refused:>9,}{result.cpu_us_total:>11,.0f}"
        f"{result.load_cpu_us_per_order:>10,.0f}"
    )


def _design_line(result: DesignResult) -> str:
    return (
        f"row-lock design, {result.job} job, {result.workload}: {result.orders_per_s:,.0f}"
        f" orders/s at {result.clients} clients, p50 {result.p50_ms:.2f} ms,"
        f" p99 {result.p99_ms:.2f} ms per execution, {result.failed} failed"
    )


def _report(
    measurement: MeshMeasurement, design: Sequence[DesignResult], arguments: argparse.Namespace
) -> None:
    results = measurement.results
    print()
    print(
        f"{'api':<8}{'workload':<9}{'offered':>7}{'orders/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'max ms':>9}{'refused':>9}{'CPU µs':>11}{'load µs':>10}"
    )
    for result in results:
        print(_line(result))
    print("\nCPU per acknowledged order, µs, by process (the mesh shares the cores):")
    names = sorted({name for result in results for name in result.cpu_us_per_order})
    print(f"{'api':<8}{'workload':<9}{'offered':>7}" + "".join(f"{name:>12}" for name in names))
    for result in results:
        print(
            f"{result.api:<8}{result.workload:<9}{_offered(result.offered_per_s):>7}"
            + "".join(f"{result.cpu_us_per_order.get(name, 0.0):>12,.0f}" for name in names)
        )
    _report_transport(results)
    idle = measurement.idle_cpu_percent
    print(
        "idle mesh, % of a core: "
        + ", ".join(f"{name} {percent:.1f}" for name, percent in sorted(idle.items()))
        + f"; all {sum(idle.values()):.1f}"
    )
    if measurement.refusals:
        print(
            "refused by reason: "
            + ", ".join(f"{k} {v:,}" for k, v in measurement.refusals.most_common())
        )
    print("\nrow-lock design (pgbench, the mesh stopped, same PostgreSQL and users):")
    for design_result in design:
        print("  " + _design_line(design_result))
    print("\ngoals (the figure, then the goal):")
    for line in _goal_lines(results, design):
        print("  " + line)


def _report_transport(results: Sequence[PhaseResult]) -> None:
    """Messages per order on each hop, and per process: messages, wake-ups, and the
    persisters' PostgreSQL round trips and transactions."""
    counted = [r for r in results if r.transport is not None and r.acked]
    if not counted:
        return
    # Hops that carry at least one message per 20 orders in some phase (the rest are
    # timers, status calls and leases).
    links = sorted(
        {
            link
            for r in counted
            for link, value in (r.transport.links if r.transport else {}).items()
            if value >= r.acked / 20
        }
    )
    print("\ngRPC messages per acknowledged order, by hop (sender → receiver; load: the bench):")
    header = f"{'api':<8}{'workload':<9}{'offered':>7}"
    for sender, receiver in links:
        print(f"  {_short(sender)}→{_short(receiver)}: {sender} → {receiver}")
    print(header + "".join(f"{_short(a) + '→' + _short(b):>9}" for a, b in links) + f"{'all':>8}")
    for r in counted:
        assert r.transport is not None
        per = [r.transport.links.get(link, 0) / r.acked for link in links]
        print(
            f"{r.api:<8}{r.workload:<9}{_offered(r.offered_per_s):>7}"
            + "".join(f"{value:>9.2f}" for value in per)
            + f"{sum(per):>8.2f}"
        )
    names = sorted({name for r in counted for name in (r.transport.sent if r.transport else {})})
    print(
        "\nper acknowledged order, by process: gRPC messages sent+received / voluntary"
        " context switches (wake-ups) / log records written (shards, matchers);"
        " PostgreSQL round trips / transactions (persisters)"
    )
    print(header + "".join(f"{name:>16}" for name in names) + f"{'PostgreSQL':>14}")
    for r in counted:
        assert r.transport is not None
        cells = []
        for name in names:
            messages = (r.transport.sent.get(name, 0) + r.transport.received.get(name, 0)) / r.acked
            switches = r.transport.switches.get(name, 0) / r.acked
            cell = f"{messages:.1f}/{switches:.1f}"
            if name in r.log_records:
                cell += f"/{r.log_records[name] / r.acked:.2f}"
            cells.append(cell)
        trips = r.database.get("database_round_trips", 0) / r.acked
        transactions = r.database.get("database_transactions", 0) / r.acked
        cells.append(f"{trips:.2f}/{transactions:.2f}")
        print(
            f"{r.api:<8}{r.workload:<9}{_offered(r.offered_per_s):>7}"
            + "".join(f"{cell:>16}" for cell in cells[:-1])
            + f"{cells[-1]:>14}"
        )


def _short(name: str) -> str:
    """A column name for a process: g for gateway, s for shard, m1 for matcher-g1, ..."""
    if name.startswith("matcher-g"):
        return "m" + name.removeprefix("matcher-g")
    return {"reconciler": "rc", "persister": "p", "load": "L", "etcd": "e"}.get(name, name[:1])


def _messages_per_order(result: PhaseResult, sender: str, receiver: str) -> float:
    if result.transport is None or not result.acked:
        return 0.0
    return result.transport.links.get((sender, receiver), 0) / result.acked


# The goals each phase is held to: (api, offered/s (0: the maximum), what, its value in a
# result, at most).
GOALS: tuple[tuple[str, int, str, Callable[[PhaseResult], float], float], ...] = (
    ("stream", 1_000, "stream at 1,000/s p50 ms", lambda r: r.p50_ms, 3),
    ("stream", 1_000, "stream at 1,000/s p99 ms", lambda r: r.p99_ms, 15),
    ("stream", 1_000, "CPU per order at 1,000/s µs", lambda r: r.cpu_us_total, 650),
    ("stream", 2_000, "stream at 2,000/s p99 ms", lambda r: r.p99_ms, 30),
    ("unary", 250, "unary at 250/s p99 ms", lambda r: r.p99_ms, 15),
    ("stream", 0, "CPU per order at the maximum µs", lambda r: r.cpu_us_total, 200),
    (
        "unary",
        0,
        "gateway CPU per unary order at the maximum µs",
        lambda r: r.cpu_us_per_order.get("gateway", 0.0),
        300,
    ),
    (
        "unary",
        0,
        "gateway→shard messages per unary order at the maximum",
        lambda r: _messages_per_order(r, "gateway", "shard"),
        0.1,
    ),
)
# Each API's maximum against the row-lock design's full job, at least.
MIN_RATIO_TO_DESIGN = {"stream": 3.0, "unary": 1.5}


def _goal_lines(results: Sequence[PhaseResult], design: Sequence[DesignResult]) -> list[str]:
    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    phases = {(r.api, r.workload, r.offered_per_s): r for r in results}
    lines: list[str] = []
    for workload in dict.fromkeys(result.workload for result in results):
        for api, rate, what, value_of, at_most in GOALS:
            result = phases.get((api, workload, rate))
            if result is not None:
                value = value_of(result)
                lines.append(
                    f"{workload}: {what} {value:,.2f} (at most {at_most:g}):"
                    f" {verdict(value <= at_most)}"
                )
        full = [d for d in design if d.job == "full" and d.workload == workload]
        for api, at_least in MIN_RATIO_TO_DESIGN.items():
            at_max = phases.get((api, workload, 0))
            if at_max is None or not full:
                continue
            ratio = at_max.orders_per_s / max(full[0].orders_per_s, 1.0)
            lines.append(
                f"{workload}: {api} maximum {at_max.orders_per_s:,.0f}/s ="
                f" {ratio:.2f}x the row-lock design's full job"
                f" ({full[0].orders_per_s:,.0f}/s at {full[0].clients} clients)"
                f" (at least {at_least:g}x; the load generator spent"
                f" {at_max.load_cpu_us_per_order:,.0f} µs per order on the same cores):"
                f" {verdict(ratio >= at_least)}"
            )
    return lines
