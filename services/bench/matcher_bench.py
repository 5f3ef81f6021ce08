"""`oms bench matcher`: orders/s through the pure matching core on one core.

A seeded, realistic mix, in batches of `--batch` commands (one log entry each):
70 % passive limit orders within a few ticks of the mid, 15 % crossing orders
(half IOC, half GTC limits a few ticks through the mid), 15 % cancels of
random earlier orders (resting or already finished). A timer tick follows every
10 batches. The book grows as passive orders outnumber what crosses and cancels
remove, so the later batches run against tens of thousands of resting orders.

Phases, each from the same pre-loaded state:
1. engine only: pre-decoded command records into `MatcherEngine.execute`;
2. decode + apply: `MatcherMachine.apply(batch bytes)`, egress left as records
   (what a follower does: it applies and drops egress);
3. from batch bytes: decode + apply + build and serialize the egress
   (`MatcherResultBatch` and one `MatcherEventBatch` per OMS shard), as the leader does.
Then the cost of `state_hash`, `snapshot` and `restore` at the final book size.

Each phase runs `--repeat` times from scratch and the best run is shown, as rates
per wall-clock second and per CPU second of this process (the machine may be
shared). `--gc tuned` freezes the pre-loaded heap and raises the collector's
thresholds (what a service would do after restore); `default` leaves CPython's.

The "service" phase (`--phases core,service`, both by default) runs the same mix
through a real `oms matcher` subprocess on a free loopback port, with its O_DSYNC
log in a temporary folder and a catalog holding the benchmark's symbol: the
passive pre-load first (untimed), then `--seconds` of batches of `--batch`
commands on one Execute stream with `--inflight` batches in flight. It reports
commands/s, the latency of each batch from submit to its result (p50, p99, max),
and the matcher process's CPU time. The subprocess is stopped (SIGTERM, then
SIGKILL) and reaped whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.oms.v1 import common_pb2, matcher_pb2
from services.bench.latency import summarize_ms
from services.infra.ports import LOOPBACK, free_port
from services.matcher.core.codec import decode_command_batch
from services.matcher.core.engine import MatcherEngine
from services.matcher.core.machine import MatcherMachine
from services.matcher.core.settings import EngineSettings, SymbolSettings
from services.runtime.core.state_machine import ApplyContext

SYMBOL = "BTC-USDT"
MID_TICKS = 10_000
SHARDS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--orders", type=int, default=200_000, help="commands per phase")
    parser.add_argument("--batch", type=int, default=100, help="commands per log entry")
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument(
        "--preload", type=int, default=20_000, help="passive orders resting before timing"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="runs per phase; the best is shown")
    parser.add_argument("--gc", choices=("default", "tuned"), default="default")
    parser.add_argument(
        "--phases",
        type=_phases,
        default=PHASE_GROUPS,
        help="comma-separated: core (in-process phases), service (through `oms matcher`)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="service phase: timed seconds")
    parser.add_argument(
        "--inflight", type=int, default=8, help="service phase: batches in flight on the stream"
    )


PHASE_GROUPS = ("core", "service")


def _phases(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in chosen if name not in PHASE_GROUPS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"phases are {', '.join(PHASE_GROUPS)}; got {text!r}")
    return chosen


def bench_settings() -> EngineSettings:
    symbol = SymbolSettings(
        symbol=SYMBOL,
        base_asset="BTC",
        quote_asset="USDT",
        lot_size=100_000,
        tick_size=100,
        min_notional=1_000,
        price_band_bps=1_000,
        reference_price_ticks=MID_TICKS,
        maker_fee_ppm=1_000,
        taker_fee_ppm=2_000,
    )
    return EngineSettings(symbols=(symbol,), dedup_horizon_ms=60_000)


class Workload:
    """Seeded command generator (the benchmark is not a state machine: RNG is fine here)."""

    def __init__(self, seed: int, users: int) -> None:
        self.random = random.Random(seed)
        self.users = users
        self.next_seq: dict[int, int] = {}
        self.recent_ids: list[tuple[str, int]] = []
        self.correlation_id = 0

    def _order_id(self, user_id: int) -> str:
        user_seq = self.next_seq.get(user_id, 0) + 1
        self.next_seq[user_id] = user_seq
        return f"s{user_id % SHARDS}:{user_id}:{user_seq}"

    def _limit(self, side: int, price: int, tif: int) -> matcher_pb2.MatcherCommand:
        user_id = self.random.randint(1, self.users)
        order_id = self._order_id(user_id)
        self.recent_ids.append((order_id, user_id))
        if len(self.recent_ids) > 50_000:
            del self.recent_ids[:10_000]
        self.correlation_id += 1
        order = matcher_pb2.Order(
            order_id=order_id,
            user_id=user_id,
            symbol=SYMBOL,
            side=side,  # type: ignore[arg-type]
            order_type=common_pb2.ORDER_TYPE_LIMIT,
            time_in_force=tif,  # type: ignore[arg-type]
            price_ticks=price,
            quantity_lots=self.random.randint(1, 10),
        )
        return matcher_pb2.MatcherCommand(
            correlation_id=self.correlation_id, submit=matcher_pb2.SubmitOrder(order=order)
        )

    def passive(self) -> matcher_pb2.MatcherCommand:
        side = self.random.choice((common_pb2.SIDE_BUY, common_pb2.SIDE_SELL))
        distance = self.random.randint(1, 5)
        price = MID_TICKS - distance if side == common_pb2.SIDE_BUY else MID_TICKS + distance
        return self._limit(side, price, common_pb2.TIME_IN_FORCE_GTC)

    def command(self) -> matcher_pb2.MatcherCommand:
        draw = self.random.random()
        if draw < 0.70:
            return self.passive()
        if draw < 0.85:
            side = self.random.choice((common_pb2.SIDE_BUY, common_pb2.SIDE_SELL))
            through = self.random.randint(1, 4)
            price = MID_TICKS + through if side == common_pb2.SIDE_BUY else MID_TICKS - through
            tif = self.random.choice((common_pb2.TIME_IN_FORCE_IOC, common_pb2.TIME_IN_FORCE_GTC))
            return self._limit(side, price, tif)
        self.correlation_id += 1
        if not self.recent_ids:
            return self.passive()
        order_id, user_id = self.random.choice(self.recent_ids)
        return matcher_pb2.MatcherCommand(
            correlation_id=self.correlation_id,
            cancel=matcher_pb2.CancelOrder(order_id=order_id, user_id=user_id),
        )

    def batches(self, orders: int, size: int, passive_only: bool = False) -> list[bytes]:
        make = self.passive if passive_only else self.command
        out = []
        for start in range(0, orders, size):
            commands = [make() for _ in range(min(size, orders - start))]
            out.append(matcher_pb2.MatcherCommandBatch(commands=commands).SerializeToString())
        return out


@dataclass(frozen=True)
class PhaseResult:
    name: str
    commands: int
    events: int
    seconds: float
    cpu_seconds: float


_DEFAULT_GC_THRESHOLDS = gc.get_threshold()


def _preloaded(arguments: argparse.Namespace) -> tuple[MatcherMachine, list[bytes], int]:
    workload = Workload(arguments.seed, arguments.users)
    preload = workload.batches(arguments.preload, arguments.batch, passive_only=True)
    timed = workload.batches(arguments.orders, arguments.batch)
    machine = MatcherMachine(bench_settings())
    context = ApplyContext(0, 1)
    for data in preload:
        context.position += 1
        machine.apply(data, context)
    return machine, timed, context.consensus_time_ms


def _run_phase(
    name: str,
    arguments: argparse.Namespace,
    step: Callable[[MatcherMachine, object, ApplyContext], int],
    prepare: Callable[[bytes, MatcherEngine], object],
) -> tuple[PhaseResult, MatcherMachine]:
    machine, timed, start_ms = _preloaded(arguments)
    inputs = [prepare(data, machine.engine) for data in timed]
    context = ApplyContext(0, start_ms)
    events = 0
    gc.collect()
    if arguments.gc == "tuned":
        gc.freeze()
        gc.set_threshold(100_000, 50, 1_000)
    started = time.perf_counter()
    cpu_started = time.process_time()
    try:
        for index, item in enumerate(inputs):
            context.position += 1
            context.consensus_time_ms += 1
            events += step(machine, item, context)
            if index % 10 == 9:
                context.position += 1
                for egress in machine.on_timer(context):
                    events += len(egress.events)
        elapsed = time.perf_counter() - started
        cpu_elapsed = time.process_time() - cpu_started
    finally:
        gc.set_threshold(*_DEFAULT_GC_THRESHOLDS)
        gc.unfreeze()
    return PhaseResult(name, arguments.orders, events, elapsed, cpu_elapsed), machine


def _engine_only(machine: MatcherMachine, item: object, context: ApplyContext) -> int:
    _, events = machine.engine.execute(item, context.consensus_time_ms)  # type: ignore[arg-type]
    return len(events)


def _apply_only(machine: MatcherMachine, item: object, context: ApplyContext) -> int:
    (egress,) = machine.apply(item, context)  # type: ignore[arg-type]
    return len(egress.events)


def _apply_and_publish(machine: MatcherMachine, item: object, context: ApplyContext) -> int:
    (egress,) = machine.apply(item, context)  # type: ignore[arg-type]
    egress.result_batch().SerializeToString()
    for batch in egress.event_batches().values():
        batch.SerializeToString()
    return len(egress.events)


def _decoded(data: bytes, engine: MatcherEngine) -> object:
    return decode_command_batch(data, engine.settings.max_commands_per_batch)


def _raw(data: bytes, engine: MatcherEngine) -> object:
    return data


PHASES = (
    ("engine only (pre-decoded commands)", _engine_only, _decoded),
    ("decode + apply (egress kept as records)", _apply_only, _raw),
    ("from batch bytes (decode, apply, egress bytes)", _apply_and_publish, _raw),
)


def _time(action: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


def run(arguments: argparse.Namespace) -> int:
    status = 0
    if "core" in arguments.phases:
        status |= _run_core(arguments)
    if "service" in arguments.phases:
        if "core" in arguments.phases:
            print()
        status |= _run_service(arguments)
    return status


def _run_core(arguments: argparse.Namespace) -> int:
    print(
        f"matcher core, one process, {arguments.orders:,} commands per phase in batches of "
        f"{arguments.batch}, {arguments.preload:,} orders resting before timing, "
        f"seed {arguments.seed}, gc {arguments.gc}, best of {arguments.repeat}"
    )
    print("mix: 70% passive limits within 5 ticks of mid, 15% crossing limits (IOC/GTC),")
    print("     15% cancels of random earlier orders; a timer tick every 10 batches")
    header = (
        f"{'phase':<48}{'cmd/s wall':>11}{'cmd/s CPU':>11}{'us/cmd':>8}{'events/s':>10}"
        f"{'seconds':>9}"
    )
    print(header)
    print("-" * len(header))
    machine: MatcherMachine | None = None
    for name, step, prepare in PHASES:
        runs = []
        for _ in range(max(1, arguments.repeat)):
            result, machine = _run_phase(name, arguments, step, prepare)
            runs.append(result)
        best = min(runs, key=lambda run: run.seconds)
        print(
            f"{best.name:<48}{best.commands / best.seconds:>11,.0f}"
            f"{best.commands / best.cpu_seconds:>11,.0f}"
            f"{best.seconds / best.commands * 1e6:>8.2f}"
            f"{best.events / best.seconds:>10,.0f}{best.seconds:>9.2f}"
        )
    if machine is None:
        return 1
    statistics = machine.statistics()
    hash_seconds, _ = _time(machine.state_hash)
    snapshot_seconds, snapshot = _time(machine.snapshot)
    data = snapshot if isinstance(snapshot, bytes) else b""
    fresh = MatcherMachine(machine.settings)
    restore_seconds, _ = _time(lambda: fresh.restore(data))
    same = fresh.state_hash() == machine.state_hash()
    print()
    print(
        f"final state: {statistics.resting_orders:,} resting orders, "
        f"{statistics.known_order_ids:,} known ids, {statistics.retained_events:,} retained events"
    )
    print(
        f"state_hash {hash_seconds * 1e6:,.0f} us; snapshot {snapshot_seconds * 1e3:,.0f} ms "
        f"({len(data) / 1e6:,.1f} MB); restore {restore_seconds * 1e3:,.0f} ms "
        f"(hash {'identical' if same else 'DIFFERENT'})"
    )
    return 0 if same else 1


# --- the service phase: the same mix through a real `oms matcher` process ---------------

SERVICE_GROUP = "bench"
SERVICE_NAME = "oms.v1.Matcher"
REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)


@dataclass(frozen=True)
class ServiceRun:
    commands: int
    batches: int
    rejected: int
    seconds: float
    latencies_ns: list[int]
    server_cpu_seconds: float


def _markets_toml(settings: EngineSettings, group: str) -> str:
    """A market catalog holding the benchmark's symbols, all in `group`."""
    blocks = []
    for symbol in settings.symbols:
        blocks.append(
            "\n".join(
                (
                    "[[market]]",
                    f'symbol = "{symbol.symbol}"',
                    f'base_asset = "{symbol.base_asset}"',
                    f'quote_asset = "{symbol.quote_asset}"',
                    f"lot_size = {symbol.lot_size}",
                    f"tick_size = {symbol.tick_size}",
                    f"min_notional = {symbol.min_notional}",
                    f"price_band_bps = {symbol.price_band_bps}",
                    f"reference_price_ticks = {symbol.reference_price_ticks}",
                    f"maker_fee_ppm = {symbol.maker_fee_ppm}",
                    f"taker_fee_ppm = {symbol.taker_fee_ppm}",
                    f'matcher_group = "{group}"',
                )
            )
        )
    return "\n\n".join(blocks) + "\n"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process, from /proc (0.0 where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # Fields after "(comm)" start at 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_service(folder: Path, settings: EngineSettings) -> tuple[subprocess.Popen[bytes], str]:
    markets = folder / "markets.toml"
    markets.write_text(_markets_toml(settings, SERVICE_GROUP))
    address = f"{LOOPBACK}:{free_port()}"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            part for part in (str(REPOSITORY_ROOT), os.environ.get("PYTHONPATH", "")) if part
        ),
        "OMS_MATCHER_DEDUP_HORIZON_MS": str(settings.dedup_horizon_ms),
        "OMS_LOG_LEVEL": "WARNING",
        "OMS_TLS": "off",  # the engine is measured here, not TLS (`oms bench e2e`)
    }
    with (folder / "matcher.log").open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.command_line",
                "matcher",
                "--group",
                SERVICE_GROUP,
                "--listen",
                address,
                "--data-dir",
                str(folder / "data"),
                "--markets-file",
                str(markets),
            ],
            cwd=REPOSITORY_ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, address


def _wait_serving(process: subprocess.Popen[bytes], address: str, log: Path) -> None:
    """Poll grpc.health.v1 until the matcher is SERVING; fail if it exits or times out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"oms matcher exited with {process.returncode}:\n{log.read_text()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"oms matcher not SERVING within {START_TIMEOUT_S:g} s")
            with contextlib.suppress(grpc.RpcError):
                answer = health.Check(
                    health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1
                )
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.05)


def _stop_service(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL if it lingers; always reaped. The exit code (negative: signal)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


async def _stream(
    channel: grpc.aio.Channel, batches: Sequence[bytes], inflight: int, seconds: float | None
) -> tuple[int, int, int, list[int]]:
    """Send `batches` on one Execute stream, `inflight` unanswered at most, for `seconds`.

    Returns (batches answered, commands answered, commands rejected, latency of each batch
    from submit to result in ns). Batches are sent as the bytes they are, like an OMS shard.
    """
    execute = channel.stream_stream(
        "/oms.v1.Matcher/Execute", request_serializer=None, response_deserializer=None
    )
    call = execute()
    slots = asyncio.Semaphore(inflight)
    sent_at: deque[int] = deque()
    stop_at = None if seconds is None else time.perf_counter() + seconds

    async def write() -> None:
        for data in batches:
            if stop_at is not None and time.perf_counter() >= stop_at:
                break
            await slots.acquire()
            sent_at.append(time.perf_counter_ns())
            await call.write(data)
        await call.done_writing()

    writer = asyncio.create_task(write())
    latencies: list[int] = []
    commands = rejected = 0
    try:
        while True:
            answer = await call.read()
            if answer is grpc.aio.EOF:
                break
            latencies.append(time.perf_counter_ns() - sent_at.popleft())
            slots.release()
            results = matcher_pb2.MatcherResultBatch.FromString(answer).results
            commands += len(results)
            rejected += sum(1 for result in results if result.reject_reason)
        await writer
    finally:
        writer.cancel()
    return len(latencies), commands, rejected, latencies


async def _drive_service(
    address: str, pid: int, preload: list[bytes], timed: list[bytes], arguments: argparse.Namespace
) -> ServiceRun:
    async with grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS) as channel:
        await _stream(channel, preload, arguments.inflight, None)
        cpu_started = _cpu_seconds(pid)
        started = time.perf_counter()
        batches, commands, rejected, latencies = await _stream(
            channel, timed, arguments.inflight, arguments.seconds
        )
        elapsed = time.perf_counter() - started
        cpu = _cpu_seconds(pid) - cpu_started
    return ServiceRun(commands, batches, rejected, elapsed, latencies, cpu)


def _run_service(arguments: argparse.Namespace) -> int:
    settings = bench_settings()
    workload = Workload(arguments.seed, arguments.users)
    preload = workload.batches(arguments.preload, arguments.batch, passive_only=True)
    timed = workload.batches(arguments.orders, arguments.batch)
    print(
        f"matcher service: a real `oms matcher` subprocess on loopback, O_DSYNC log in a temporary "
        f"folder; {arguments.preload:,} passive orders pre-loaded through it, then up to "
        f"{arguments.seconds:g} s (at most {arguments.orders:,} commands) of the same mix in "
        f"batches of {arguments.batch}, {arguments.inflight} batches in flight on one Execute "
        f"stream, seed {arguments.seed}"
    )
    with tempfile.TemporaryDirectory(prefix="oms-matcher-bench-") as name:
        folder = Path(name)
        process, address = _start_service(folder, settings)
        try:
            _wait_serving(process, address, folder / "matcher.log")
            result = asyncio.run(_drive_service(address, process.pid, preload, timed, arguments))
        finally:
            exit_code = _stop_service(process)
    p50, p99, longest = summarize_ms(result.latencies_ns)
    header = (
        f"{'phase':<28}{'cmd/s wall':>11}{'batches':>9}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
        f"{'server CPU s':>13}{'cmd/CPU s':>11}"
    )
    print(header)
    print("-" * len(header))
    per_cpu = result.commands / result.server_cpu_seconds if result.server_cpu_seconds else 0.0
    print(
        f"{'service (Execute stream)':<28}{result.commands / result.seconds:>11,.0f}"
        f"{result.batches:>9,}{p50:>8.2f}{p99:>8.2f}{longest:>8.2f}"
        f"{result.server_cpu_seconds:>13.2f}{per_cpu:>11,.0f}"
    )
    print(
        f"{result.commands:,} commands in {result.seconds:.2f} s, {result.rejected:,} rejected; "
        f"matcher exited with {exit_code} on SIGTERM"
    )
    return 0 if exit_code == 0 else 1
