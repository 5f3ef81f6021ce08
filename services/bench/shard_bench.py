"""`oms bench shard`: the user shard state machine in-process, on one core.

Two figures:

1. Commands applied per second with `--users` resident users (1,000,000 by
   default), a mix of limit orders, cancels, matcher events (accepted, fills,
   cancelled) and deposits spread over the users; once with already-decoded
   commands (`ShardMachine.apply_commands`) and once from `ShardCommandBatch`
   bytes of about `--batch` commands (`ShardMachine.apply`, protobuf decoding
   included). Each matcher event travels as its own command. Also the cost of
   one incremental `state_hash()` after each phase.
   Then the same decoded commands through `ShardFloor`
   (`services/bench/shard_floor.py`): a subset of the shard's work in the
   cheapest Python, the yardstick for how far the shard is from what one core
   can do at all.
2. The eviction sweep with 10k, 100k and 1M resident users of which `--expired`
   are idle past the TTL: time per sweep and actors visited, which must be
   expired + 1 whatever the resident count.

The resident users are built through `bulk_hydrate` (what a run of HydrateUser
does, minus egress). Then, as the shard service runs after recovery
(`services/runtime/collector.py`), the garbage collector is collected once and
frozen and its thresholds raised: the long-lived actors leave the collector's
generations, so collections only look at young objects.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from services.bench.shard_floor import ShardFloor, floor_seconds
from services.runtime.collector import settle_long_lived_state
from services.runtime.core.state_machine import ApplyContext
from services.shard.core.codec import encode_command_batch
from services.shard.core.commands import (
    CancelOrder,
    Command,
    Deposit,
    MatcherEvent,
    MatcherEvents,
    PlaceOrder,
)
from services.shard.core.egress import BeginDehydrate
from services.shard.core.settings import RateLimitSettings, ShardSettings, SymbolSettings
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.user_state import UserState
from services.shard.core.vocabulary import BUY, LIMIT, PPM, SELL, EventKind

SHARD_ID = "bench"
SYMBOL = SymbolSettings(
    symbol="BTC-USDT",
    base_asset="BTC",
    quote_asset="USDT",
    lot_size=1_000,
    tick_size=10,
    maker_fee_ppm=1_000,
    taker_fee_ppm=2_000,
    matcher_group="g1",
)
START_MS = 1_700_000_000_000
TTL_MS = 30 * 60_000
WAVE = 2_000  # orders per pipeline wave


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--users", type=int, default=1_000_000, help="resident users")
    parser.add_argument(
        "--orders", type=int, default=60_000, help="order lifecycles per phase (~5.5 commands each)"
    )
    parser.add_argument("--batch", type=int, default=100, help="commands per log entry")
    parser.add_argument(
        "--sweep-sizes", default="10000,100000,1000000", help="resident users per sweep case"
    )
    parser.add_argument("--expired", type=int, default=1_000, help="idle users per sweep")
    parser.add_argument("--sweeps", type=int, default=5, help="sweeps measured per case")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--gc",
        choices=("freeze", "default", "off"),
        default="freeze",
        help="collector after building the state: freeze it and raise its thresholds (as "
        "the services run), leave it, or disable it",
    )


def bench_settings(users: int) -> ShardSettings:
    return ShardSettings(
        shard_id=SHARD_ID,
        symbols=(SYMBOL,),
        idle_ttl_ms=TTL_MS,
        max_resident=users * 2 + 10,
        max_evictions_per_sweep=10_000,
        dedup_filter_bits=1 << 26,
        normal_rate_limit=RateLimitSettings(burst_orders=1_000, orders_per_second=1_000),
    )


RESIDENT_BALANCES = (("USDT", 10**15), ("BTC", 10**12))


def resident_states(first_user: int, count: int) -> Iterator[UserState]:
    for user_id in range(first_user, first_user + count):
        yield UserState(user_id, balances=RESIDENT_BALANCES)


def unsettle_gc() -> None:
    """Undo `settle_gc` once a phase is measured: collect normally again."""
    if not gc.isenabled():
        gc.enable()
    gc.unfreeze()


def settle_gc(mode: str) -> None:
    if mode == "freeze":
        settle_long_lived_state()  # exactly what a service does after recovery
        return
    gc.collect()
    if mode == "off":
        gc.freeze()
        gc.disable()


# --- the workload ----------------------------------------------------------------------


@dataclass
class _Order:
    user_id: int
    order_id: str
    is_buy: bool


@dataclass
class Workload:
    """Commands in log order, and how many of each kind."""

    commands: list[Command]
    counts: dict[str, int]


class WorkloadBuilder:
    """Order lifecycles over random users, pipelined so every order's events follow it.

    Per order: place (limit buy or sell, 2 lots), deposit, Accepted, a partial
    fill, then either a cancel and its Cancelled or the final fill. Orders move
    through the stages in waves, so each log batch mixes every kind.
    """

    def __init__(self, users: int, seed: int) -> None:
        self.users = users
        self.random = random.Random(seed)
        self.user_seq: dict[int, int] = {}
        self.sequence = 0
        self.trade_id = 0
        self.correlation = 0
        self.orders_made = 0

    def build(self, orders: int) -> Workload:
        counts = dict.fromkeys(("place", "deposit", "accepted", "fill", "cancel", "cancelled"), 0)
        commands: list[Command] = []
        waves = -(-orders // WAVE)
        stages: list[list[_Order]] = []
        made = 0
        for index in range(waves + 5):
            wave: list[_Order] = []
            while index < waves and len(wave) < WAVE and made < orders:
                wave.append(_Order(self.random.randint(1, self.users), "", made % 2 == 0))
                made += 1
            stages.append(wave)
            step: list[tuple[str, _Order]] = []
            for order in wave:
                step.append(("place", order))
                step.append(("deposit", order))
            if index >= 1:
                step.extend(("accepted", order) for order in stages[index - 1])
            if index >= 2:
                step.extend(("fill", order) for order in stages[index - 2])
            if index >= 3:
                for position, order in enumerate(stages[index - 3]):
                    step.append(("cancel" if position % 2 else "final", order))
            if index >= 4:
                for position, order in enumerate(stages[index - 4]):
                    if position % 2:
                        step.append(("cancelled", order))
            # Stages of one order sit in different waves, so shuffling a wave keeps
            # every order's own events in order while mixing the kinds.
            self.random.shuffle(step)
            for kind, order in step:
                if kind == "place":
                    # The shard numbers a user's orders in log order: so does the workload.
                    seq = self.user_seq.get(order.user_id, 0) + 1
                    self.user_seq[order.user_id] = seq
                    order.order_id = f"{SHARD_ID}:{order.user_id}:{seq}"
                commands.append(self._command(kind, order.user_id, order.order_id, order.is_buy))
                counts["fill" if kind == "final" else kind] += 1
        return Workload(commands, counts)

    def _command(self, kind: str, user_id: int, order_id: str, is_buy: bool) -> Command:
        self.correlation += 1
        correlation = self.correlation
        if kind == "place":
            side = BUY if is_buy else SELL
            client_id = f"c{order_id}"
            return PlaceOrder(
                correlation, user_id, client_id, SYMBOL.symbol, side, LIMIT, 0, 100, 2, 0, 0, 0, 0
            )
        if kind == "deposit":
            return Deposit(correlation, user_id, "USDT", 1_000, f"t{correlation}")
        if kind == "cancel":
            return CancelOrder(correlation, user_id, order_id, "", 0)
        self.sequence += 1
        head = (self.sequence, SHARD_ID, order_id, user_id)
        if kind == "accepted":
            event = MatcherEvent(*head, int(EventKind.ACCEPTED))
        elif kind == "cancelled":
            event = MatcherEvent(*head, int(EventKind.CANCELLED), remaining_lots=1, reason=1)
        else:
            self.trade_id += 1
            done = kind == "final"
            notional = 100 * 1 * SYMBOL.tick_size
            event = MatcherEvent(
                *head,
                int(EventKind.FILL),
                self.trade_id,
                SYMBOL.symbol,
                BUY if is_buy else SELL,
                100,
                1,
                notional,
                notional * SYMBOL.taker_fee_ppm // PPM,
                False,
                0 if done else 1,
                done,
                0,
            )
        return MatcherEvents(correlation, SYMBOL.matcher_group, (event,))


def batches(commands: Sequence[Command], size: int) -> list[list[Command]]:
    return [list(commands[start : start + size]) for start in range(0, len(commands), size)]


# --- phase 1: throughput --------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputResult:
    label: str
    commands: int
    seconds: float
    egress: int
    hash_ms: float

    @property
    def per_second(self) -> float:
        return self.commands / self.seconds


def throughput(arguments: argparse.Namespace) -> tuple[list[ThroughputResult], dict[str, int]]:
    users = arguments.users
    machine = ShardMachine(bench_settings(users))
    print(f"building {users:,} resident users ...", flush=True)
    started = time.perf_counter()
    machine.bulk_hydrate(resident_states(1, users), START_MS)
    built_s = time.perf_counter() - started
    started = time.perf_counter()
    machine.state_hash()  # digests every actor once; later hashes are incremental
    first_hash_s = time.perf_counter() - started
    print(f"  built in {built_s:.1f} s; first full state hash {first_hash_s:.1f} s", flush=True)
    builder = WorkloadBuilder(users, arguments.seed)
    decoded = builder.build(arguments.orders)
    encoded_workload = builder.build(arguments.orders)
    encoded = [encode_command_batch(group) for group in batches(encoded_workload.commands, 100)]
    settle_gc(arguments.gc)
    results = []

    now = START_MS + 1
    started = time.perf_counter()
    egress = 0
    for index, group in enumerate(batches(decoded.commands, arguments.batch)):
        egress += len(machine.apply_commands(group, now + index))
    elapsed = time.perf_counter() - started
    hash_started = time.perf_counter()
    machine.state_hash()
    hash_ms = (time.perf_counter() - hash_started) * 1000
    results.append(
        ThroughputResult("decoded commands", len(decoded.commands), elapsed, egress, hash_ms)
    )

    now += 1_000_000
    context = ApplyContext()
    started = time.perf_counter()
    egress = 0
    for index, data in enumerate(encoded):
        context.position = index + 1
        context.consensus_time_ms = now + index
        egress += len(machine.apply(data, context))
    elapsed = time.perf_counter() - started
    hash_started = time.perf_counter()
    machine.state_hash()
    hash_ms = (time.perf_counter() - hash_started) * 1000
    results.append(
        ThroughputResult(
            "ShardCommandBatch bytes", len(encoded_workload.commands), elapsed, egress, hash_ms
        )
    )
    machine.state.accounts.check_conservation()
    counters = dict(machine.statistics().counters)
    unsettle_gc()
    return results, {**decoded.counts, **{f"shard.{k}": v for k, v in counters.items()}}


def floor_throughput(arguments: argparse.Namespace) -> ThroughputResult:
    """The same decoded workload through `ShardFloor`, the least work per command."""
    floor = ShardFloor(SHARD_ID, SYMBOL)
    floor.add_users(1, arguments.users, RESIDENT_BALANCES)
    workload = WorkloadBuilder(arguments.users, arguments.seed).build(arguments.orders)
    groups = batches(workload.commands, arguments.batch)
    settle_gc(arguments.gc)
    seconds = floor_seconds(floor, groups, START_MS + 1)
    unsettle_gc()
    if floor.orders:
        raise RuntimeError(f"floor left {len(floor.orders)} orders open: it skipped work")
    return ThroughputResult("floor (not the shard)", len(workload.commands), seconds, 0, 0.0)


# --- phase 2: sweeps -------------------------------------------------------------------


@dataclass(frozen=True)
class SweepResult:
    resident: int
    expired: int
    visited: tuple[int, ...]
    evicted: tuple[int, ...]
    times_ms: tuple[float, ...]


def sweep_case(resident: int, expired: int, sweeps: int, gc_mode: str) -> SweepResult:
    """`sweeps` cohorts of `expired` users go idle one millisecond apart; the rest stay warm."""
    machine = ShardMachine(bench_settings(resident))
    cold = expired * sweeps
    for cohort in range(sweeps):
        machine.bulk_hydrate(resident_states(1 + cohort * expired, expired), START_MS + cohort)
    machine.bulk_hydrate(resident_states(1 + cold, resident - cold), START_MS + TTL_MS // 2)
    settle_gc(gc_mode)
    context = ApplyContext()
    visited, evicted, times = [], [], []
    for cohort in range(sweeps):
        context.position = cohort + 1
        context.consensus_time_ms = START_MS + TTL_MS + cohort
        started = time.perf_counter()
        egress = machine.on_timer(context)
        times.append((time.perf_counter() - started) * 1000)
        last = machine.last_sweep
        visited.append(last.visited)
        evicted.append(sum(1 for item in egress if type(item) is BeginDehydrate))
    del machine
    unsettle_gc()
    gc.collect()
    return SweepResult(resident, expired, tuple(visited), tuple(evicted), tuple(times))


# --- output ------------------------------------------------------------------------------


def run(arguments: argparse.Namespace) -> int:
    print("oms bench shard: one process, one core, consensus time simulated")
    results, counts = throughput(arguments)
    gc.collect()
    print("the same decoded commands through the floor (services/bench/shard_floor.py) ...")
    floor = floor_throughput(arguments)
    print()
    header = (
        f"{'input':<26}{'commands':>10}{'seconds':>9}{'commands/s':>12}"
        f"{'egress/cmd':>11}{'state_hash ms':>15}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        print(
            f"{result.label:<26}{result.commands:>10,}{result.seconds:>9.2f}"
            f"{result.per_second:>12,.0f}{result.egress / result.commands:>11.2f}"
            f"{result.hash_ms:>15.1f}"
        )
    print(
        f"{floor.label:<26}{floor.commands:>10,}{floor.seconds:>9.2f}"
        f"{floor.per_second:>12,.0f}{'':>11}{'':>15}"
    )
    print(
        f"the shard applies decoded commands at {results[0].per_second / floor.per_second:.0%} "
        "of the floor's rate (the floor does a subset of the shard's work in flat Python: "
        "a yardstick, not a proven limit)"
    )
    mix = ", ".join(f"{kind} {counts[kind]:,}" for kind in ("place", "deposit", "accepted"))
    mix += ", " + ", ".join(f"{kind} {counts[kind]:,}" for kind in ("fill", "cancel", "cancelled"))
    print(f"mix per phase: {mix}")
    print(
        f"shard counters: accepted orders {counts['shard.orders_accepted']:,}, "
        f"fills settled {counts['shard.fills_settled']:,}, "
        f"dedup lookups sent {counts['shard.dedup_lookups_sent']}, "
        f"orphan events {counts['shard.orphan_events']}, "
        f"refused orders {counts['shard.orders_refused']}"
    )
    print(f"(resident users {arguments.users:,}; garbage collector: {arguments.gc})")
    print()
    header = (
        f"{'resident':>10}{'expired':>9}{'visited':>9}{'evicted':>9}"
        f"{'median ms':>11}{'max ms':>9}   visited == expired + 1"
    )
    print(header)
    print("-" * len(header))
    ok = True
    for size_text in arguments.sweep_sizes.split(","):
        size = int(size_text)
        case = sweep_case(size, arguments.expired, arguments.sweeps, arguments.gc)
        holds = all(v == case.expired + 1 for v in case.visited)
        ok = ok and holds
        print(
            f"{case.resident:>10,}{case.expired:>9,}{statistics.median(case.visited):>9,.0f}"
            f"{statistics.median(case.evicted):>9,.0f}{statistics.median(case.times_ms):>11.2f}"
            f"{max(case.times_ms):>9.2f}   {'yes' if holds else 'NO: ' + str(case.visited)}"
        )
    return 0 if ok else 1
