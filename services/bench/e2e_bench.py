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
means "as fast as it goes". In the same run and on the same PostgreSQL, the
row-lock baseline admits orders with one `SELECT … FOR UPDATE; UPDATE; INSERT`
transaction each; the ratio is printed.

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
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import uvloop

from gateway.signing import signed_metadata
from protos.oms.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, shard_pb2
from services.bench.latency import summarize_ms
from services.bench.mesh_launch import LaunchedMesh
from services.bench.row_lock_baseline import run_baseline
from services.clients.channels import mesh_channel

SYMBOL = "BTC-USDT"
REFERENCE_PRICE_TICKS = 6_500_000
PLACE_METHOD = "/oms.v1.OrderGateway/PlaceOrder"
TRADE_METHOD = "/oms.v1.OrderGateway/Trade"
FUNDS_USDT = 10**15
FUNDS_BTC = 10**13
REFUSALS: Counter[str] = Counter()  # refused orders by reason, over one mesh's phases


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    parser.add_argument("--unary-rates", default="1000,2000,3000,0")
    parser.add_argument("--stream-rates", default="5000,10000,20000,0")
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
    parser.add_argument("--baseline-clients", type=int, default=16)
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


@dataclass(frozen=True)
class User:
    user_id: int
    api_key: str
    api_secret: str


@dataclass(frozen=True)
class PhaseResult:
    api: str
    offered_per_s: int
    acked: int
    refused: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    cpu_us_per_order: dict[str, float] = field(default_factory=dict)

    @property
    def orders_per_s(self) -> float:
        return self.acked / self.seconds if self.seconds > 0 else 0.0


def run(arguments: argparse.Namespace) -> int:
    if arguments.state_dir is None:
        with tempfile.TemporaryDirectory(prefix="oms-bench-e2e-") as folder:
            return _run_in(Path(folder), arguments)
    return _run_in(arguments.state_dir, arguments)


def _run_in(state_dir: Path, arguments: argparse.Namespace) -> int:
    shapes = [
        (replicas, shards)
        for shards in _counts(arguments.shards)
        for replicas in _counts(arguments.replicas)
    ]
    measured: list[tuple[str, list[PhaseResult], Counter[str]]] = []
    baseline = None
    for replicas, shards in shapes:
        shape = f"{shards} shard cluster(s), {replicas} replica(s) of each shard and matcher group"
        name = f"shards-{shards}-replicas-{replicas}"
        folder = state_dir / name if len(shapes) > 1 else state_dir
        print(f"starting the mesh ({shape}) under {folder} ...", flush=True)
        with LaunchedMesh(folder, replicas=replicas, shards=shards) as mesh:
            assert mesh.record is not None
            REFUSALS.clear()
            results = uvloop.run(_measure(mesh, arguments))
            measured.append((shape, results, Counter(REFUSALS)))
            if baseline is None:
                baseline = uvloop.run(
                    run_baseline(
                        mesh.database_url,
                        clients=arguments.baseline_clients,
                        seconds=arguments.seconds,
                    )
                )
    assert baseline is not None
    for shape, results, refusals in measured:
        if len(shapes) > 1:
            print(f"\n=== {shape} ===")
        _report(
            results,
            refusals,
            baseline_per_s=baseline.orders_per_s,
            baseline_p50_ms=baseline.p50_ms,
            baseline_p99_ms=baseline.p99_ms,
            arguments=arguments,
        )
    return 0


async def _measure(mesh: LaunchedMesh, arguments: argparse.Namespace) -> list[PhaseResult]:
    record = mesh.record
    assert record is not None
    async with mesh_channel(record.gateway) as channel:
        users = await _funded_users(
            channel, record.admin_api_key, record.admin_api_secret, arguments.users
        )
        orders = gateway_pb2_grpc.OrderGatewayStub(channel)
        sequence = itertools.count(1)
        results: list[PhaseResult] = []
        phases = [(_unary_phase, rate) for rate in _rates(arguments.unary_rates)]
        phases += [(_stream_phase, rate) for rate in _rates(arguments.stream_rates)]
        for phase, rate in phases:
            before = mesh.service_cpu_seconds()
            result = await phase(orders, users, rate, sequence, arguments)
            after = mesh.service_cpu_seconds()
            per_order = {
                name: 1e6 * (used - before.get(name, 0.0)) / max(result.acked, 1)
                for name, used in sorted(after.items())
            }
            results.append(replace(result, cpu_us_per_order=per_order))
            print(_line(results[-1]), flush=True)
    return results


def _counts(text: str) -> list[int]:
    return [int(part) for part in str(text).split(",") if part.strip()]


def _rates(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


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
    rate: int,
    sequence: itertools.count[int],
    arguments: argparse.Namespace,
) -> PhaseResult:
    latencies_ns: list[int] = []
    refused = 0
    limit = asyncio.Semaphore(arguments.unary_outstanding)
    tasks: set[asyncio.Task[None]] = set()

    async def place(slot_ns: int, number: int) -> None:
        nonlocal refused
        try:
            index = number % len(users)
            user = users[index]
            request = _order(user, number, buyer=index % 2 == 0)
            metadata = signed_metadata(
                user.api_key, user.api_secret, PLACE_METHOD, request, _now_ms()
            )
            ack = await orders.PlaceOrder(request, metadata=metadata, timeout=30)
            if ack.accepted:
                latencies_ns.append(time.perf_counter_ns() - slot_ns)
            else:
                refused += 1
                REFUSALS[shard_pb2.ShardRejectReason.Name(ack.reject_reason)] += 1
        finally:
            limit.release()

    started = time.perf_counter_ns()
    deadline = started + int(arguments.seconds * 1e9)
    for index in itertools.count():
        slot = started + (int(index * 1e9 / rate) if rate else 0)
        if slot >= deadline or time.perf_counter_ns() >= deadline:
            break
        now = time.perf_counter_ns()
        if slot > now:
            await asyncio.sleep((slot - now) / 1e9)
        await limit.acquire()
        task = asyncio.create_task(place(slot if rate else time.perf_counter_ns(), next(sequence)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    elapsed = (time.perf_counter_ns() - started) / 1e9
    return PhaseResult(
        "unary", rate, len(latencies_ns), refused, elapsed, *summarize_ms(latencies_ns)
    )


async def _stream_phase(
    orders: gateway_pb2_grpc.OrderGatewayStub,
    users: Sequence[User],
    rate: int,
    sequence: itertools.count[int],
    arguments: argparse.Namespace,
) -> PhaseResult:
    latencies_ns: list[int] = []
    refused = 0
    streams = max(1, arguments.streams)
    tick_ns = int(arguments.tick_ms * 1e6)
    started = time.perf_counter_ns()
    deadline = started + int(arguments.seconds * 1e9)

    async def one_stream(index: int) -> None:
        nonlocal refused
        user = users[index % len(users)]
        buyer = index % 2 == 0  # streams pair up: even ones buy, odd ones sell
        sent_at: dict[int, int] = {}
        outstanding = asyncio.Semaphore(arguments.stream_outstanding)
        done_sending = asyncio.Event()
        all_answered = asyncio.Event()

        async def batches() -> AsyncIterator[gateway_pb2.TradeRequestBatch]:
            due_total = 0
            for tick in itertools.count():
                slot = started + tick * tick_ns
                if slot >= deadline:
                    break
                now = time.perf_counter_ns()
                if slot > now:
                    await asyncio.sleep((slot - now) / 1e9)
                if rate:
                    target = math.floor((slot - started + tick_ns) / 1e9 * rate / streams)
                    due = target - due_total
                else:
                    due = arguments.batch
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
        "stream", rate, len(latencies_ns), refused, elapsed, *summarize_ms(latencies_ns)
    )


def _reason(response: gateway_pb2.TradeResponse) -> str:
    if response.WhichOneof("response") == "error":
        return gateway_pb2.GatewayErrorReason.Name(response.error.reason)
    return shard_pb2.ShardRejectReason.Name(response.place.reject_reason)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _line(result: PhaseResult) -> str:
    offered = f"{result.offered_per_s:,}" if result.offered_per_s else "max"
    return (
        f"{result.api:<8}{offered:>9}{result.orders_per_s:>12,.0f}{result.p50_ms:>9.2f}"
        f"{result.p99_ms:>9.2f}{result.max_ms:>9.2f}{result.refused:>9,}"
    )


def _report(
    results: Sequence[PhaseResult],
    refusals: Counter[str],
    *,
    baseline_per_s: float,
    baseline_p50_ms: float,
    baseline_p99_ms: float,
    arguments: argparse.Namespace,
) -> None:
    print()
    print(
        f"{'api':<8}{'offered':>9}{'orders/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'refused':>9}"
    )
    for result in results:
        print(_line(result))
    print("\nCPU per acknowledged order, µs, by service process (the mesh shares the cores):")
    names = sorted({name for result in results for name in result.cpu_us_per_order})
    print(f"{'api':<8}{'offered':>9}" + "".join(f"{name:>12}" for name in names))
    for result in results:
        offered = f"{result.offered_per_s:,}" if result.offered_per_s else "max"
        print(
            f"{result.api:<8}{offered:>9}"
            + "".join(f"{result.cpu_us_per_order.get(name, 0.0):>12,.0f}" for name in names)
        )
    if refusals:
        print("refused by reason: " + ", ".join(f"{k} {v:,}" for k, v in refusals.most_common()))
    print()
    print(
        f"{'baseline':<8}{'max':>9}{baseline_per_s:>12,.0f}{baseline_p50_ms:>9.2f}"
        f"{baseline_p99_ms:>9.2f}   (SELECT … FOR UPDATE; UPDATE; INSERT per order,"
        f" {arguments.baseline_clients} clients)"
    )
    best_stream = max((r.orders_per_s for r in results if r.api == "stream"), default=0.0)
    best_unary = max((r.orders_per_s for r in results if r.api == "unary"), default=0.0)
    if baseline_per_s > 0:
        print(
            f"stream / baseline: {best_stream / baseline_per_s:.2f}x;"
            f" unary / baseline: {best_unary / baseline_per_s:.2f}x"
        )
