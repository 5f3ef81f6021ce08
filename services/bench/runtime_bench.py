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
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop

from services.bench.latency import summarize_ms
from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.file_log import FileLogStore, preallocate
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings


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
    parser.add_argument("--snapshot-entries", type=int, default=1_000_000)
    parser.add_argument(
        "--dir", type=Path, default=None, help="folder for the log (default: a temporary one)"
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
    write_p50_ms: float | None = None  # the O_DSYNC write calls of the measured span
    write_p99_ms: float | None = None


def _commands(group: int) -> list[bytes]:
    return [encode_increment(index, 1) for index in range(group)]


async def _open_node(directory: Path) -> tuple[RuntimeNode[object], asyncio.Task[None]]:
    settings = NodeSettings(
        data_dir=directory,
        snapshot_interval_entries=0,
        sequencer=SequencerSettings(timer_interval_ms=100),
    )
    node: RuntimeNode[object] = RuntimeNode(CounterMachine(), settings)
    await node.recover()
    return node, asyncio.get_running_loop().create_task(node.run())


async def _close_node(node: RuntimeNode[object], task: asyncio.Task[None]) -> None:
    node.stop()
    await task
    await node.close()


async def closed_loop(directory: Path, seconds: float, group: int, window: int) -> LoadResult:
    """As fast as the runtime goes: keep `window` submissions outstanding."""
    node, task = await _open_node(directory)
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
    await _close_node(node, task)
    p50, p99, worst = summarize_ms(latencies)
    return LoadResult(
        None, completed / elapsed, p50, p99, worst, after.batches - before.batches, completed
    )


async def open_loop(
    directory: Path, seconds: float, group: int, rate: float, settle_s: float = 0.0
) -> LoadResult:
    """Offer `rate` entries/s in submissions of `group`, whatever the runtime does.

    The first `settle_s` of load is offered the same way but not measured.
    """
    node, task = await _open_node(directory)
    sequencer = node.sequencer
    commands = _commands(group)
    latencies: list[int] = []
    pending: set[asyncio.Future[object]] = set()
    before = sequencer.statistics()
    interval = group / rate
    writes: list[int] = []
    if isinstance(node.log_store, FileLogStore):
        node.log_store.write_samples_ns = writes
    started = time.perf_counter()
    sent = 0
    measured_sent = 0
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
            future = sequencer.submit_many(commands)
            pending.add(future)  # type: ignore[arg-type]
            future.add_done_callback(record(time.perf_counter_ns(), measuring))  # type: ignore[arg-type]
            sent += 1
            measured_sent += measuring
        await asyncio.sleep(max(0.0, started + due * interval - time.perf_counter()))
    if pending:
        await asyncio.gather(*pending)
    elapsed = time.perf_counter() - measure_started
    after = sequencer.statistics()
    await _close_node(node, task)
    p50, p99, worst = summarize_ms(latencies)
    write_p50, write_p99, _ = summarize_ms(writes)
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


async def _main(arguments: argparse.Namespace) -> None:
    root = arguments.dir or Path(tempfile.mkdtemp(prefix="oms-bench-runtime-"))
    try:
        print(f"log folder: {root} (one O_DSYNC write per batch, preallocated segments)")
        header = (
            f"{'phase':<12}{'offered/s':>10} {'durable/s':>12} {'p50 ms':>9} {'p99 ms':>9} "
            f"{'max ms':>9} {'per batch':>10}   its writes p50/p99 ms   disk alone p50/p99 ms"
        )
        print(header)
        print("-" * len(header))
        result = await closed_loop(root / "closed", arguments.seconds, arguments.group, 64)
        _print_result("closed-loop", result)
        for index, rate_text in enumerate(arguments.rates.split(",")):
            rate = float(rate_text)
            result = await open_loop(
                root / f"open-{index}",
                arguments.seconds,
                arguments.group,
                rate,
                arguments.settle_seconds,
            )
            floor = disk_floor(root / "floor", arguments.group / rate, min(2.0, arguments.seconds))
            _print_result("open-loop", result, floor)
        stalls = cpu_stalls(min(5.0, arguments.seconds))
        print()
        print(
            f"this machine's CPU over {stalls.seconds:.0f} s, a thread doing nothing but read "
            f"the clock: held up > 1 ms {stalls.over_1ms} times, > 2 ms {stalls.over_2ms} "
            f"times, longest {stalls.longest_ms:.2f} ms, {stalls.stalled_fraction:.2%} of the "
            "time not running"
        )
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
    finally:
        if arguments.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def run(arguments: argparse.Namespace) -> int:
    uvloop.run(_main(arguments))
    return 0
