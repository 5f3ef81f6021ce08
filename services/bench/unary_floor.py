"""`oms bench unary-floor`: what one unary `PlaceOrder` costs before any shard sees it.

Not a gateway. A server process answers `oms.v1.OrderGateway/PlaceOrder` in one of
these forms, side by side in one run, each loaded by the same client as `oms bench
e2e`'s unary phase (a signed call per order, open loop at `--rate`, or as fast as it
goes with `--outstanding` in flight):

- `bare`: a generic handler that answers a fixed `OrderAck`: grpc.aio's own cost per
  call, the floor under any Python gateway on this transport;
- `interceptor`: the same behind a server interceptor that only passes the call on
  (the machinery every authenticated call goes through);
- `gateway`: the gateway's own `GatewayInterceptor` and `OrderService` (the
  signature checked against a key it already knows, validation, routing, the shard
  command and the ack, the request deadline, the counters and the latency histogram),
  with a null shard that answers every command at once: the gateway's work per call
  less the shard link's.

Server and client CPU per call come from /proc (every thread of each process). The
two processes share the machine's cores, as the mesh and its load generator do in
`oms bench e2e`. The server runs with the mesh's gRPC settings (`GRPC_EXPERIMENTS`)
and, unless `--plaintext`, TLS on the public port as `oms up` serves it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import uvloop

from gateway.credentials import KeyHolder
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.signing import signed_metadata
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from services.bench.latency import summarize_ms
from services.bench.open_loop import open_loop
from services.clients.channels import CHANNEL_OPTIONS, SERVER_OPTIONS
from services.infra.ports import free_port
from services.settings import load_settings
from services.transport.certificates import Identity, issue, new_authority
from services.transport.development import PUBLIC_HOSTS
from services.transport.grpc_runtime import GRPC_EXPERIMENTS, MESH_GRPC_EXPERIMENTS
from services.transport.tls import ClientTransport, PublicListener

FORMS = ("bare", "interceptor", "gateway")
PLACE_METHOD = "/oms.v1.OrderGateway/PlaceOrder"
SERVICE = "oms.v1.OrderGateway"
USER_ID = 7
API_KEY = "floor-key-0000000000000000"
API_SECRET = "floor-secret-000000000000000000"
START_TIMEOUT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--forms", default=",".join(FORMS), help="of: " + ", ".join(FORMS))
    parser.add_argument("--rates", default="250,0", help="offered calls/s; 0: as fast as it goes")
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase")
    parser.add_argument("--outstanding", type=int, default=256, help="calls in flight, at most")
    parser.add_argument("--plaintext", action="store_true", help="no TLS on the server's port")
    # The server process itself (started by the benchmark).
    parser.add_argument("--serve", choices=FORMS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tls-folder", type=Path, default=None, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class FloorResult:
    form: str
    offered_per_s: int
    calls_per_s: float
    server_us_per_call: float
    client_us_per_call: float
    p50_ms: float
    p99_ms: float


def run(arguments: argparse.Namespace) -> int:
    if arguments.serve:
        uvloop.run(_serve(arguments.serve, arguments.port, arguments.tls_folder))
        return 0
    forms = [form.strip() for form in arguments.forms.split(",") if form.strip()]
    if not forms or set(forms) - set(FORMS):
        print(f"oms bench unary-floor: --forms {arguments.forms!r}", file=sys.stderr)
        return 2
    rates = [int(part) for part in arguments.rates.split(",") if part.strip()]
    results: list[FloorResult] = []
    with tempfile.TemporaryDirectory(prefix="oms-bench-unary-floor-") as folder:
        tls_folder = None if arguments.plaintext else Path(folder)
        authority = _write_certificates(tls_folder) if tls_folder is not None else None
        for form in forms:
            results += _measure_form(form, rates, arguments, tls_folder, authority)
    print(
        f"\nunary PlaceOrder before any shard, {'plaintext' if arguments.plaintext else 'TLS'},"
        f" {arguments.outstanding} in flight at most, {arguments.seconds:g} s a phase:"
    )
    print(
        f"{'form':<13}{'offered':>8}{'calls/s':>9}{'server µs':>11}{'client µs':>11}"
        f"{'p50 ms':>9}{'p99 ms':>9}"
    )
    for result in results:
        print(_line(result))
    return 0


def _line(result: FloorResult) -> str:
    offered = f"{result.offered_per_s:,}" if result.offered_per_s else "max"
    return (
        f"{result.form:<13}{offered:>8}{result.calls_per_s:>9,.0f}"
        f"{result.server_us_per_call:>11,.0f}{result.client_us_per_call:>11,.0f}"
        f"{result.p50_ms:>9.2f}{result.p99_ms:>9.2f}"
    )


def _write_certificates(folder: Path) -> bytes:
    authority = new_authority("oms bench unary-floor")
    issue(authority, "gateway-public", hosts=PUBLIC_HOSTS, server_only=True).write(
        folder / "server.pem", folder / "server.key"
    )
    return authority.certificate_pem


def _measure_form(
    form: str,
    rates: Sequence[int],
    arguments: argparse.Namespace,
    tls_folder: Path | None,
    authority: bytes | None,
) -> list[FloorResult]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "services.command_line",
        "bench",
        "unary-floor",
        "--serve",
        form,
        "--port",
        str(port),
    ]
    if tls_folder is not None:
        command += ["--tls-folder", str(tls_folder)]
    environment = {**os.environ, GRPC_EXPERIMENTS: MESH_GRPC_EXPERIMENTS}
    server = subprocess.Popen(command, env=environment)
    try:
        return uvloop.run(
            _load(
                form,
                server_pid=server.pid,
                port=port,
                rates=rates,
                arguments=arguments,
                authority=authority,
            )
        )
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# --- the server ------------------------------------------------------------------------


class _PassOn(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        return await continuation(details)


async def _serve(form: str, port: int, tls_folder: Path | None) -> None:
    interceptors: list[grpc.aio.ServerInterceptor] = []
    server: grpc.aio.Server
    if form == "gateway":
        gateway = _gateway_with_null_shard()
        server = grpc.aio.server(interceptors=(gateway.interceptor,), options=SERVER_OPTIONS)
        gateway.orders.register(server)
    else:
        if form == "interceptor":
            interceptors.append(_PassOn())
        server = grpc.aio.server(interceptors=interceptors, options=SERVER_OPTIONS)
        ack = gateway_pb2.OrderAck(accepted=True, order_id=f"s1:{USER_ID}:1")

        async def place(request: gateway_pb2.PlaceOrderRequest, context: Any) -> Any:
            return ack

        handler = grpc.unary_unary_rpc_method_handler(
            place,
            request_deserializer=gateway_pb2.PlaceOrderRequest.FromString,
            response_serializer=gateway_pb2.OrderAck.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"PlaceOrder": handler}),)
        )
    listener = PublicListener()
    if tls_folder is not None:
        listener = PublicListener(
            Identity.read(tls_folder / "server.pem", tls_folder / "server.key")
        )
    listener.listen(server, f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def _gateway_with_null_shard() -> Gateway:
    """The gateway's services as `oms gateway` builds them, its one user's key known,
    and a shard that answers every command at once."""
    os.environ.setdefault("OMS_MATCHERS", "g1=127.0.0.1:1,g2=127.0.0.1:2")
    gateway = Gateway(load_settings(GatewaySettings, overrides={}))
    gateway.credentials.remember(KeyHolder(api_key=API_KEY, secret=API_SECRET, user_id=USER_ID))
    sequence = itertools.count(1)

    async def execute(user_id: int, command: shard_pb2.ShardCommand) -> shard_pb2.ShardResult:
        return shard_pb2.ShardResult(
            correlation_id=command.correlation_id,
            accepted=True,
            order_id=f"s1:{user_id}:{next(sequence)}",
            status=common_pb2.ORDER_STATUS_PENDING,
        )

    gateway.router.execute = execute  # type: ignore[method-assign]
    return gateway


# --- the load ------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(
    form: str,
    *,
    server_pid: int,
    port: int,
    rates: Sequence[int],
    arguments: argparse.Namespace,
    authority: bytes | None,
) -> list[FloorResult]:
    transport = ClientTransport(tls=False)
    if authority is not None:
        transport = ClientTransport(authority_pem=authority)
    async with transport.channel(f"localhost:{port}", CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(
            PLACE_METHOD,
            request_serializer=gateway_pb2.PlaceOrderRequest.SerializeToString,
            response_deserializer=gateway_pb2.OrderAck.FromString,
        )
        numbers = itertools.count(1)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                await _place(call, next(numbers), timeout_s=1.0)
                break
            except grpc.aio.AioRpcError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.1)
        results = []
        for rate in rates:
            results.append(
                await _phase(
                    form,
                    call,
                    numbers=numbers,
                    server_pid=server_pid,
                    rate=rate,
                    arguments=arguments,
                )
            )
            print(_line(results[-1]), flush=True)
        return results


async def _place(call: Any, number: int, *, timeout_s: float = 30.0) -> None:
    request = gateway_pb2.PlaceOrderRequest(
        user_id=USER_ID,
        client_order_id=f"b{number}",
        symbol="BTC-USDT",
        side=common_pb2.SIDE_BUY,
        order_type=common_pb2.ORDER_TYPE_LIMIT,
        time_in_force=common_pb2.TIME_IN_FORCE_GTC,
        price_ticks=6_500_000,
        quantity_lots=1,
    )
    metadata = signed_metadata(
        API_KEY, API_SECRET, PLACE_METHOD, request, time.time_ns() // 1_000_000
    )
    ack = await call(request, metadata=metadata, timeout=timeout_s)
    if not ack.accepted:
        raise RuntimeError(f"refused: {ack}")


async def _phase(
    form: str,
    call: Any,
    *,
    numbers: itertools.count[int],
    server_pid: int,
    rate: int,
    arguments: argparse.Namespace,
) -> FloorResult:
    latencies_ns: list[int] = []

    async def one(slot_ns: int) -> None:
        await _place(call, next(numbers))
        latencies_ns.append(time.perf_counter_ns() - slot_ns)

    server_before, client_before = _cpu_seconds(server_pid), time.process_time()
    elapsed_s = await open_loop(
        one, rate=rate, seconds=arguments.seconds, outstanding=arguments.outstanding
    )
    server_used = _cpu_seconds(server_pid) - server_before
    client_used = time.process_time() - client_before
    calls = max(len(latencies_ns), 1)
    return FloorResult(
        form,
        rate,
        len(latencies_ns) / elapsed_s,
        1e6 * server_used / calls,
        1e6 * client_used / calls,
        *summarize_ms(latencies_ns)[:2],
    )
