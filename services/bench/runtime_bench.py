"""`oms bench runtime`: the replicated state machine runtime on this machine's disk.

Three figures, each with a trivial state machine (`CounterMachine`, 16-byte
commands) and real `fdatasync` group commit:

1. sustained durable throughput with an unthrottled, closed-loop producer;
2. append-to-durable latency (submit → future resolved) at several offered rates;
3. the longest stall of the event loop while a snapshot of a 1,000,000-entry
   state is forked and written, next to the same window without a snapshot.

Next to the latencies it measures what bounds them from below on this machine:
the `O_DSYNC` write calls of each phase, the disk alone at the same cadence, and
how often the CPU is taken away from a thread that does nothing.

The producer runs in the same process and event loop (uvloop, as in the
services) as the sequencer, as a gRPC ingress would, so its cost is included in
every figure. Each latency phase first runs `--settle-seconds` at its rate
unmeasured: a fresh log zero-fills its spare segment then, and thread and page
caches warm up; the figures are the steady state after that.

`--log etcd` or `--log both` measures the replicated log backend (`EtcdLogStore`:
one etcd transaction per record, fenced by the leader key's create revision)
beside the file log: the same phases, one table, one column group per backend,
each phase run on both before the next so both see the same machine. The etcd is
an embedded one with fsync on (its WAL on the same disk as the file log), unless
`OMS_ETCD_ENDPOINTS` names one; the benchmark takes the leader key of a group of
its own there and deletes every key it wrote at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog
import uvloop

from services.bench.latency import summarize_ms
from services.coordination.errors import CoordinationUnavailable, LeaseLost
from services.coordination.etcd_session import EtcdSession, Guard, prefix_end
from services.coordination.group_keys import GroupKeys
from services.coordination.leadership import Leadership
from services.infra.embedded_etcd import EmbeddedEtcd
from services.infra.settings import InfraSettings
from services.observability.logs import configure_logging
from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.errors import IngressFullError, LogFencedError
from services.runtime.etcd_log import EtcdLogStore
from services.runtime.file_log import FileLogStore, preallocate
from services.runtime.log_store import LogStore
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings
from services.settings import load_settings

log = structlog.get_logger(__name__)
LOG_CHOICES = ("file", "etcd", "both")
# Long enough that a keep-alive delayed by a loaded 2-core machine never costs the
# term mid-phase; a crashed run's leader key still goes away on its own soon after.
LEASE_TTL_S = 10
CAMPAIGN_TIMEOUT_S = 30.0  # the key is ours alone: only an unreachable etcd takes longer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each phase")
    parser.add_argument(
        "--rates",
        default="5000,20000,50000,100000",
        help="offered rates in entries/s for the latency phase (comma-separated)",
    )
    parser.add_argument("--group", type=int, default=100, help="entries per submission")
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=1.0,
        help="unmeasured load before each latency phase",
    )
    parser.add_argument(
        "--snapshot-entries",
        type=int,
        default=1_000_000,
        help="state size for the snapshot pause (0 skips it); only with the file log",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="folder for the log (default: a temporary one)"
    )
    parser.add_argument(
        "--log",
        choices=LOG_CHOICES,
        default="file",
        help="log backend to measure: segment files, etcd (embedded with fsync unless "
        "OMS_ETCD_ENDPOINTS is set), or both side by side in one table",
    )


@dataclass(frozen=True)
class LoadResult:
    offered_per_second: float | None
    achieved_per_second: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    batches: int
    entries: int
    # The measured span's O_DSYNC writes (file log) or etcd append round trips.
    write_p50_ms: float | None = None
    write_p99_ms: float | None = None
    refused: int = 0  # submissions the full ingress turned away while measuring


def _commands(group: int) -> list[bytes]:
    return [encode_increment(index, 1) for index in range(group)]


async def _open_node(
    directory: Path, log_store: LogStore | None = None
) -> tuple[RuntimeNode[object], asyncio.Task[None]]:
    settings = NodeSettings(
        data_dir=directory,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=100),
    )
    node: RuntimeNode[object] = RuntimeNode(CounterMachine(), settings, log_store=log_store)
    await node.recover()
    return node, asyncio.get_running_loop().create_task(node.run())


async def _close_node(node: RuntimeNode[object], task: asyncio.Task[None]) -> None:
    node.stop()
    await task
    await node.close()


class LogBackend(Protocol):
    """Where a phase's node keeps its log; every phase starts from an empty one."""

    name: str

    async def open_node(self, phase: str) -> tuple[RuntimeNode[object], asyncio.Task[None]]: ...

    async def close_node(self, node: RuntimeNode[object], task: asyncio.Task[None]) -> None: ...


class FileBackend:
    """`FileLogStore` in a fresh folder per phase (what the node builds by default)."""

    name = "file"

    def __init__(self, root: Path) -> None:
        self.root = root

    async def open_node(self, phase: str) -> tuple[RuntimeNode[object], asyncio.Task[None]]:
        return await _open_node(self.root / phase)

    async def close_node(self, node: RuntimeNode[object], task: asyncio.Task[None]) -> None:
        await _close_node(node, task)


class EtcdBackend:
    """`EtcdLogStore` of one term under the benchmark's own group.

    Every phase appends from position 1 again: its records are deleted when it
    ends, so the next node's recovery replays nothing and the phases stay alike.
    """

    name = "etcd"

    def __init__(self, session: EtcdSession, keys: GroupKeys, term: int, root: Path) -> None:
        self.session = session
        self.keys = keys
        self.term = term
        self.root = root  # the nodes' snapshot folders only (no snapshot is taken)
        self.append_retries = 0

    async def open_node(self, phase: str) -> tuple[RuntimeNode[object], asyncio.Task[None]]:
        store = EtcdLogStore(self.session, self.keys, self.term)
        return await _open_node(self.root / f"etcd-{phase}", store)

    async def close_node(self, node: RuntimeNode[object], task: asyncio.Task[None]) -> None:
        store = node.log_store
        await _close_node(node, task)
        if isinstance(store, EtcdLogStore):
            self.append_retries += store.append_retries
        await self.clear_log()

    async def clear_log(self) -> None:
        keys = self.keys
        ranges = ((keys.records, keys.records_end), (keys.chunks, prefix_end(keys.chunks)))
        # Under the term's guard, as any write to the group's log: a lost lease shows here.
        if not await self.session.transaction((Guard(keys.leader, self.term),), deletes=ranges):
            raise LogFencedError(f"term {self.term} of {keys.leader.decode()} is over")


async def closed_loop(
    backend: LogBackend, phase: str, seconds: float, group: int, window: int
) -> LoadResult:
    """As fast as the runtime goes: keep `window` submissions outstanding."""
    node, task = await backend.open_node(phase)
    sequencer = node.sequencer
    commands = _commands(group)
    latencies: list[int] = []
    before = sequencer.statistics()
    deadline = time.perf_counter() + seconds
    completed = 0

    async def producer() -> None:
        nonlocal completed
        while time.perf_counter() < deadline:
            started = time.perf_counter_ns()
            await sequencer.submit_many(commands)
            latencies.append(time.perf_counter_ns() - started)
            completed += group

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(window)))
    elapsed = time.perf_counter() - started
    after = sequencer.statistics()
    await backend.close_node(node, task)
    p50, p99, worst = summarize_ms(latencies)
    return LoadResult(
        None, completed / elapsed, p50, p99, worst, after.batches - before.batches, completed
    )


async def open_loop(
    backend: LogBackend,
    phase: str,
    seconds: float,
    group: int,
    rate: float,
    *,
    settle_s: float = 0.0,
) -> LoadResult:
    """Offer `rate` entries/s in submissions of `group`, whatever the runtime does.

    The first `settle_s` of load is offered the same way but not measured. A
    submission the full ingress refuses is counted and dropped, as a client would
    be told to back off: the schedule goes on, so the offered rate stays what it is.
    """
    node, task = await backend.open_node(phase)
    sequencer = node.sequencer
    commands = _commands(group)
    latencies: list[int] = []
    pending: set[asyncio.Future[object]] = set()
    before = sequencer.statistics()
    interval = group / rate
    writes: list[int] = []
    if isinstance(node.log_store, FileLogStore):
        node.log_store.write_samples_ns = writes
    elif isinstance(node.log_store, EtcdLogStore):
        node.log_store.append_samples_ns = writes
    started = time.perf_counter()
    sent = 0
    measured_sent = 0
    refused = 0
    measuring = settle_s <= 0
    measure_started = started

    def record(started_ns: int, measured: bool) -> Callable[[asyncio.Future[object]], None]:
        def done(future: asyncio.Future[object]) -> None:
            pending.discard(future)
            if measured and not future.cancelled() and future.exception() is None:
                latencies.append(time.perf_counter_ns() - started_ns)

        return done

    while True:
        now = time.perf_counter()
        if not measuring and now - started >= settle_s:
            measuring = True
            measure_started = now
            before = sequencer.statistics()
            writes.clear()
        if now - started >= settle_s + seconds:
            break
        due = int((now - started) / interval) + 1
        while sent < due:
            sent += 1
            try:
                future = sequencer.submit_many(commands)
            except IngressFullError:
                refused += measuring
                continue
            pending.add(future)  # type: ignore[arg-type]
            future.add_done_callback(record(time.perf_counter_ns(), measuring))  # type: ignore[arg-type]
            measured_sent += measuring
        await asyncio.sleep(max(0.0, started + due * interval - time.perf_counter()))
    if pending:
        await asyncio.gather(*pending)
    elapsed = time.perf_counter() - measure_started
    after = sequencer.statistics()
    await backend.close_node(node, task)
    p50, p99, worst = summarize_ms(latencies)
    write_p50, write_p99, _ = summarize_ms(writes) if writes else (None, None, None)
    return LoadResult(
        rate,
        measured_sent * group / elapsed,
        p50,
        p99,
        worst,
        after.batches - before.batches,
        measured_sent * group,
        write_p50,
        write_p99,
        refused,
    )


def disk_floor(directory: Path, interval_s: float, seconds: float) -> tuple[float, float]:
    """p50/p99 (ms) of one 2 KiB O_DSYNC write at `interval_s` cadence, nothing else.

    The runtime cannot be faster than its disk; on virtual disks a write after
    an idle gap is slower than back-to-back writes, so the floor is measured at
    the same cadence as the batches of each open-loop phase.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "floor.bin"
    preallocate(path, 8 * 1024 * 1024)
    descriptor = os.open(path, os.O_WRONLY | os.O_DSYNC)
    record = bytes(2048)
    latencies: list[int] = []
    try:
        offset = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and offset + len(record) <= 8 * 1024 * 1024:
            started = time.perf_counter_ns()
            os.pwrite(descriptor, record, offset)
            latencies.append(time.perf_counter_ns() - started)
            offset += len(record)
            time.sleep(interval_s)
    finally:
        os.close(descriptor)
        path.unlink()
    p50, p99, _ = summarize_ms(latencies)
    return p50, p99


@dataclass(frozen=True)
class CpuStalls:
    seconds: float
    over_1ms: int
    over_2ms: int
    longest_ms: float
    stalled_fraction: float


def cpu_stalls(seconds: float, threshold_ns: int = 200_000) -> CpuStalls:
    """How often this machine takes the CPU away from a thread that only reads the clock.

    Nothing runs but the probe, so every gap between two clock reads longer than
    `threshold_ns` is time the thread was not running (the host's scheduler,
    interrupts, other tenants). A latency percentile cannot be better than the
    share of requests such gaps land on.
    """
    gaps: list[int] = []
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    last = clock()
    while last < deadline:
        now = clock()
        if now - last > threshold_ns:
            gaps.append(now - last)
        last = now
    return CpuStalls(
        seconds,
        sum(1 for gap in gaps if gap > 1_000_000),
        sum(1 for gap in gaps if gap > 2_000_000),
        max(gaps, default=0) / 1e6,
        sum(gaps) / (seconds * 1e9),
    )


async def _loop_lag_probe(stop: asyncio.Event, interval_s: float, lags_ns: list[int]) -> None:
    """Measure how late the loop wakes a 1 ms timer: a stall shows up as lag."""
    while not stop.is_set():
        expected = time.perf_counter_ns() + int(interval_s * 1e9)
        await asyncio.sleep(interval_s)
        lags_ns.append(max(0, time.perf_counter_ns() - expected))


def _counters_snapshot(entries: int) -> bytes:
    big = CounterMachine()
    big.counters = {key: key for key in range(entries)}
    return big.snapshot()


async def snapshot_pause(directory: Path, entries: int, seconds: float) -> dict[str, float]:
    """Longest loop stall with and without a background snapshot of `entries` keys."""
    node, task = await _open_node(directory)
    # Build the large state through the machine's own restore path (fast, deterministic).
    node.replica.machine.restore(_counters_snapshot(entries))
    # The builder's copy is garbage now: collect it, or the fork would also copy the
    # page tables of a second million-entry dict that the state does not hold.
    gc.collect()
    commands = _commands(100)
    sequencer = node.sequencer

    async def window(with_snapshot: bool) -> tuple[float, float, float]:
        stop = asyncio.Event()
        lags: list[int] = []
        probe = asyncio.get_running_loop().create_task(_loop_lag_probe(stop, 0.001, lags))
        load_started = time.perf_counter()
        snapshot_task = None
        fork_pause_ms = 0.0
        while time.perf_counter() - load_started < seconds:
            await sequencer.submit_many(commands)  # ~20k entries/s with the sleep below
            if with_snapshot and snapshot_task is None:
                snapshot_task = asyncio.get_running_loop().create_task(node.snapshot_now())
            await asyncio.sleep(0.005)
        total_ms = 0.0
        if snapshot_task is not None:
            snapshot_started = time.perf_counter()
            await snapshot_task
            total_ms = (time.perf_counter() - snapshot_started) * 1000
            result = node.snapshot_writer.last_result
            if result is not None:
                fork_pause_ms = result.fork_pause_ns / 1e6
                total_ms = result.total_ns / 1e6
        stop.set()
        await probe
        return max(lags) / 1e6 if lags else 0.0, fork_pause_ms, total_ms

    baseline_lag, _, _ = await window(False)
    snapshot_lag, fork_ms, total_ms = await window(True)
    await _close_node(node, task)
    return {
        "entries": float(entries),
        "baseline_max_loop_lag_ms": baseline_lag,
        "snapshot_max_loop_lag_ms": snapshot_lag,
        "fork_pause_ms": fork_ms,
        "snapshot_total_ms": total_ms,
    }


def _print_result(label: str, result: LoadResult, floor: tuple[float, float] | None = None) -> None:
    offered = f"{result.offered_per_second:>10,.0f}" if result.offered_per_second else "       max"
    floor_text = f"   {floor[0]:.3f} / {floor[1]:.3f}" if floor else ""
    writes_text = ""
    if result.write_p50_ms is not None and result.write_p99_ms is not None:
        writes_text = f"   {result.write_p50_ms:.3f} / {result.write_p99_ms:.3f}"
    print(
        f"{label:<12}{offered} {result.achieved_per_second:>12,.0f} "
        f"{result.p50_ms:>9.3f} {result.p99_ms:>9.3f} {result.max_ms:>9.3f} "
        f"{result.entries / max(1, result.batches):>10.1f}{writes_text}{floor_text}"
    )


def load_average() -> str:
    """The 1, 5 and 15 minute load: a figure means little without what else ran."""
    return " / ".join(f"{load:.2f}" for load in os.getloadavg())


def machine_line(load_before: str) -> str:
    """The last line of a benchmark's output: the machine and its load around the run."""
    return (
        f"machine: {os.cpu_count()} cores, load average (1 / 5 / 15 min) {load_before} "
        f"before the run, {load_average()} after"
    )


@dataclass(frozen=True)
class EtcdPlace:
    endpoints: tuple[str, ...]
    description: str


@contextlib.contextmanager
def etcd_for_bench(root: Path) -> Iterator[EtcdPlace]:
    """The etcd of `OMS_ETCD_ENDPOINTS`, else an embedded one under `root`, stopped at the end."""
    external = load_settings(InfraSettings).etcd_endpoints
    if external:
        yield EtcdPlace(external, f"etcd at {','.join(external)} (OMS_ETCD_ENDPOINTS)")
        return
    # fsync on (the default, unlike the tests' etcd): durability is what is measured.
    with EmbeddedEtcd(root / "etcd", unsafe_no_fsync=False) as etcd:
        yield EtcdPlace(
            (etcd.endpoint,), f"embedded etcd at {etcd.endpoint}, fsync on, in {etcd.data_dir}"
        )


@contextlib.asynccontextmanager
async def etcd_backend(endpoints: Sequence[str], root: Path) -> AsyncIterator[EtcdBackend]:
    """Lead a group of the benchmark's own for the whole run; delete its keys at the end.

    The group name carries the process id and a random part, so runs sharing one
    etcd (and the services' own groups) never meet.
    """
    async with EtcdSession(endpoints) as session:
        keys = GroupKeys.of("bench", "runtime", f"{os.getpid()}-{secrets.token_hex(4)}")
        leadership = Leadership(
            session, keys.leader, f"oms bench runtime, pid {os.getpid()}", ttl_s=LEASE_TTL_S
        )
        try:
            async with asyncio.timeout(CAMPAIGN_TIMEOUT_S):
                term = await leadership.campaign()
            # Without keep-alives the lease, and with it the term, would end mid-run.
            holding = asyncio.get_running_loop().create_task(leadership.hold())
            try:
                yield EtcdBackend(session, keys, term, root)
            finally:
                holding.cancel()
                # A lost lease already failed the appends of the phase it ended.
                with contextlib.suppress(asyncio.CancelledError, LeaseLost):
                    await holding
        finally:
            try:
                await session.transaction((), deletes=((keys.prefix, prefix_end(keys.prefix)),))
                await leadership.resign()
            except CoordinationUnavailable as error:
                # Said, not raised: an error of the run itself may be on its way out.
                log.warning("bench.etcd_keys_left", prefix=keys.prefix.decode(), error=str(error))


def _phases(arguments: argparse.Namespace) -> list[float | None]:
    """The offered rate of each phase; None: the closed loop."""
    return [None, *(float(rate) for rate in arguments.rates.split(","))]


async def _measure_phase(
    backend: LogBackend, index: int, rate: float | None, arguments: argparse.Namespace
) -> LoadResult:
    if rate is None:
        return await closed_loop(backend, "closed", arguments.seconds, arguments.group, 64)
    return await open_loop(
        backend,
        f"open-{index}",
        arguments.seconds,
        arguments.group,
        rate,
        settle_s=arguments.settle_seconds,
    )


async def _file_table(arguments: argparse.Namespace, root: Path) -> None:
    print(f"log folder: {root} (one O_DSYNC write per batch, preallocated segments)")
    header = (
        f"{'phase':<12}{'offered/s':>10} {'durable/s':>12} {'p50 ms':>9} {'p99 ms':>9} "
        f"{'max ms':>9} {'per batch':>10}   its writes p50/p99 ms   disk alone p50/p99 ms"
    )
    print(header)
    print("-" * len(header))
    backend = FileBackend(root)
    for index, rate in enumerate(_phases(arguments)):
        result = await _measure_phase(backend, index - 1, rate, arguments)
        if rate is None:
            _print_result("closed-loop", result)
            continue
        floor = disk_floor(root / "floor", arguments.group / rate, min(2.0, arguments.seconds))
        _print_result("open-loop", result, floor)
        _print_refused("file", result)


_CELLS_HEADER = (
    f"{'durable/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'per batch':>9} {'write p50/p99':>15}"
)


def _cells(result: LoadResult) -> str:
    writes = ""
    if result.write_p50_ms is not None and result.write_p99_ms is not None:
        writes = f"{result.write_p50_ms:.3f} / {result.write_p99_ms:.3f}"
    return (
        f"{result.achieved_per_second:>11,.0f} {result.p50_ms:>8.3f} {result.p99_ms:>8.3f} "
        f"{result.entries / max(1, result.batches):>9.1f} {writes:>15}"
    )


def _print_refused(name: str, result: LoadResult) -> None:
    if result.refused:
        print(
            f"  ^ {name}: {result.refused:,} submissions refused (ingress full): "
            "it did not keep up with the offered rate"
        )


async def _side_by_side_table(
    arguments: argparse.Namespace, root: Path, backends: Sequence[LogBackend]
) -> None:
    """Each phase on every backend in turn, one row per phase, one column group per backend."""
    groups = " | ".join(f"{backend.name + ' log':<{len(_CELLS_HEADER)}}" for backend in backends)
    header = f"{'phase':<12}{'offered/s':>10} | " + " | ".join(_CELLS_HEADER for _ in backends)
    header += " | disk alone p50/p99 ms"
    print(f"{'':<22} | {groups} |")
    print(header)
    print("-" * len(header))
    for index, rate in enumerate(_phases(arguments)):
        results = [
            await _measure_phase(backend, index - 1, rate, arguments) for backend in backends
        ]
        offered = "max" if rate is None else f"{rate:,.0f}"
        label = "closed-loop" if rate is None else "open-loop"
        floor_text = ""
        if rate is not None:
            floor = disk_floor(root / "floor", arguments.group / rate, min(2.0, arguments.seconds))
            floor_text = f"{floor[0]:.3f} / {floor[1]:.3f}"
        cells = " | ".join(_cells(result) for result in results)
        print(f"{label:<12}{offered:>10} | {cells} | {floor_text}".rstrip(), flush=True)
        for backend, result in zip(backends, results, strict=True):
            _print_refused(backend.name, result)


async def _main(arguments: argparse.Namespace, root: Path, etcd: EtcdPlace | None) -> None:
    load_before = load_average()
    if etcd is None:
        await _file_table(arguments, root)
    else:
        async with etcd_backend(etcd.endpoints, root) as etcd_log:
            backends: list[LogBackend] = [etcd_log]
            if arguments.log == "both":
                print(f"file log: {root} (one O_DSYNC write per batch, preallocated segments)")
                backends.insert(0, FileBackend(root))
            print(
                f"etcd log: {etcd.description}; one transaction per record, fenced by "
                f"{etcd_log.keys.leader.decode()} (term {etcd_log.term})"
            )
            await _side_by_side_table(arguments, root, backends)
            print(
                "write p50/p99 (open loop): the file log's O_DSYNC write, the etcd log's "
                "append round trip; one etcd append is in flight at a time, so an entry's "
                "latency is its append's round trip plus its wait for the append before it"
            )
            if etcd_log.append_retries:
                print(f"etcd appends retried after no answer: {etcd_log.append_retries}")
    stalls = cpu_stalls(min(5.0, arguments.seconds))
    print()
    print(
        f"this machine's CPU over {stalls.seconds:.0f} s, a thread doing nothing but read "
        f"the clock: held up > 1 ms {stalls.over_1ms} times, > 2 ms {stalls.over_2ms} "
        f"times, longest {stalls.longest_ms:.2f} ms, {stalls.stalled_fraction:.2%} of the "
        "time not running"
    )
    print(machine_line(load_before))
    if arguments.log == "etcd" or arguments.snapshot_entries <= 0:
        return
    pause = await snapshot_pause(
        root / "snapshot", arguments.snapshot_entries, max(1.0, arguments.seconds)
    )
    print()
    print(
        f"snapshot of {pause['entries']:,.0f} entries under ~20,000 entries/s: "
        f"fork pause {pause['fork_pause_ms']:.2f} ms, longest loop stall "
        f"{pause['snapshot_max_loop_lag_ms']:.2f} ms (same window without a snapshot: "
        f"{pause['baseline_max_loop_lag_ms']:.2f} ms), snapshot written in "
        f"{pause['snapshot_total_ms']:.0f} ms"
    )


def measure(arguments: argparse.Namespace) -> None:
    """Run the phases `arguments` ask for and print their figures (stdout)."""
    root = arguments.dir or Path(tempfile.mkdtemp(prefix="oms-bench-runtime-"))
    try:
        with contextlib.ExitStack() as stack:
            etcd = None if arguments.log == "file" else stack.enter_context(etcd_for_bench(root))
            uvloop.run(_main(arguments, root, etcd))
    finally:
        if arguments.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def run(arguments: argparse.Namespace) -> int:
    # Warnings only, and on stderr: info lines (a node's recovery per phase) would
    # break the table's rows apart.
    configure_logging("bench-runtime", level="WARNING", json_lines=False)
    measure(arguments)
    return 0
