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
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from protos.oms.v1 import common_pb2, matcher_pb2
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
