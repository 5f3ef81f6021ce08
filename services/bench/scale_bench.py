"""`oms bench scale`: what a scaling wave costs the users trading through it.

A throwaway mesh of three user-shard clusters is started as `make run` starts one
(`oms up --shards 3 --active 2`: s3 runs, joined as receiving, owning nobody). Makers
(whales, pinned where the hash puts them) keep resting quotes on BTC-USDT; takers
(normal users, routed by the hash) send IOC orders through them at `--rate` orders
a second, open loop, each a signed unary PlaceOrder: a taker is flat again within
milliseconds of each order, so a wave can move it. An answer that says "retry"
(UNAVAILABLE, a deadline, NOT_OWNER past the gateway's patience while the user is
in transit) is retried with the same client order id, as a client does, and the
latency of an order runs from its slot to its final answer, retries included.

For each count of `--residents` (takers made resident first, one order each), with
the load running: `--phase-s` seconds before, the scale-out (the wave controller's
`activate s3`, in waves of `--wave-size`, as `omsctl activate s3` runs it), the
same after, the scale-in (`remove s3`) and the same after it. Printed: per phase,
orders acknowledged per second, p50/p99/max latency and retried answers; per wave,
its seconds against the resident users it moved.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import uvloop

from gateway.client import AdminClient, GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2
from services.bench.latency import summarize_ms
from services.bench.mesh_launch import LaunchedMesh
from services.clients.channels import gateway_channel
from services.coordination.etcd_session import EtcdSession
from services.routing.routing_store import RoutingStore
from services.routing.shard_probe import ShardProbe
from services.routing.wave_controller import WaveController, WaveProgress, WaveSettings

SYMBOL = "BTC-USDT"
MID_TICKS = 6_500_000
MAKERS = 4
MAKER_LOTS = 100_000  # per quote, topped up between rounds: takers never exhaust one
FUNDS = {"USDT": 10**15, "BTC": 10**13}
RETRY_PAUSE_S = 0.02
CALL_TIMEOUT_S = 5.0
RETRIED_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=int, default=200, help="taker orders offered per second")
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds before/after a wave")
    parser.add_argument(
        "--residents",
        default="150,600",
        help="resident takers at each scale-out, in turn (about a third of them move)",
    )
    parser.add_argument("--wave-size", type=int, default=64, help="users in transit at once")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a temporary one")


@dataclass(frozen=True)
class Trader:
    user_id: int
    api_key: str
    api_secret: str


@dataclass
class Sample:
    slot_s: float  # when the order was due (monotonic)
    latency_s: float
    retries: int


@dataclass
class PhaseFigures:
    name: str
    seconds: float
    samples: list[Sample] = field(default_factory=list)

    def line(self) -> str:
        p50, p99, most = summarize_ms([int(s.latency_s * 1e9) for s in self.samples])
        retried = sum(1 for s in self.samples if s.retries)
        rate = len(self.samples) / self.seconds if self.seconds > 0 else 0.0
        return (
            f"  {self.name:<22}{rate:>10,.0f}{p50:>9.2f}{p99:>9.2f}{most:>9.2f}"
            f"{retried:>9,}{self.seconds:>9.2f}"
        )


def run(arguments: argparse.Namespace) -> int:
    if arguments.state_dir is None:
        with tempfile.TemporaryDirectory(prefix="oms-bench-scale-") as folder:
            return _run_in(Path(folder), arguments)
    return _run_in(arguments.state_dir, arguments)


def _run_in(state_dir: Path, arguments: argparse.Namespace) -> int:
    counts = [int(part) for part in str(arguments.residents).split(",") if part.strip()]
    print(f"starting the mesh (3 clusters, s3 receiving) under {state_dir} ...", flush=True)
    with LaunchedMesh(state_dir, shards=3, active=2) as mesh:
        uvloop.run(_measure(mesh, counts, arguments))
    return 0


async def _measure(
    mesh: LaunchedMesh, counts: Sequence[int], arguments: argparse.Namespace
) -> None:
    record = mesh.record
    assert record is not None
    endpoints = mesh.etcd_endpoints
    probe = ShardProbe(
        {c.cluster_id: c.shard for c in record.clusters()},
        etcd_endpoints=endpoints,
        mesh_id=record.mesh_id,
    )
    async with (
        EtcdSession(endpoints) as session,
        gateway_channel(record.gateway) as channel,
    ):
        store = RoutingStore(session, record.mesh_id)
        settings = WaveSettings(wave_size=arguments.wave_size)
        controller = WaveController(store, probe, settings)
        admin = AdminClient(
            record.gateway,
            api_key=record.admin_api_key,
            api_secret=record.admin_api_secret,
            channel=channel,
        )
        makers = await _open(admin, MAKERS, whale=True)
        stored = await store.read()
        assert stored is not None
        for maker in makers:  # pinned where they are: the waves never move the liquidity
            owner = stored.document.owner_of(maker.user_id)
            await controller.move(maker.user_id, owner, pin=True)
        quotes = _Quotes([_client(record.gateway, channel, m) for m in makers])
        await quotes.place()
        takers: list[Trader] = []
        print(
            f"\nrate {arguments.rate}/s offered, phases of {arguments.phase_s:g} s, "
            f"waves of {arguments.wave_size}; per phase:"
        )
        print(
            f"  {'phase':<22}{'orders/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
            f"{'retried':>9}{'seconds':>9}"
        )
        waves: list[tuple[int, WaveProgress]] = []
        for count in counts:
            takers += await _open(admin, count - len(takers), whale=False)
            clients = [_client(record.gateway, channel, t) for t in takers[:count]]
            load = _TakerLoad(clients, arguments.rate, quotes)
            await load.warm()  # every taker resident: one order each
            print(f"{count} resident takers:")
            running = asyncio.create_task(load.run())
            try:
                for name, step in (
                    ("before", None),
                    ("scale-out s3", controller.activate("s3")),
                    ("after scale-out", None),
                    ("scale-in s3", controller.remove("s3")),
                    ("after scale-in", None),
                ):
                    started = time.monotonic()
                    if step is None:
                        await asyncio.sleep(arguments.phase_s)
                    else:
                        waves.append((count, await step))
                    ended = time.monotonic()
                    figures = PhaseFigures(name, ended - started, load.between(started, ended))
                    print(figures.line(), flush=True)
            finally:
                load.stop.set()
                await running
            await quotes.place()  # top the quotes up for the next round
        print("\nwaves: resident takers, operation, seconds, resident users moved, waves")
        for count, progress in waves:
            print(
                f"  {count:>6}  {progress.operation:<12}{progress.seconds:>8.2f} s"
                f"{progress.moved:>8} moved{progress.waves:>6} waves"
                + (f", returned {len(progress.returned)}" if progress.returned else "")
                + (f", held {len(progress.held)}" if progress.held else "")
            )
    await probe.close()


async def _open(admin: AdminClient, count: int, *, whale: bool) -> list[Trader]:
    tier = shard_pb2.USER_TIER_WHALE if whale else shard_pb2.USER_TIER_NORMAL
    traders = []
    for _ in range(max(0, count)):
        created = await admin.create_user(tier=tier)
        for asset, amount in FUNDS.items():
            ack = await admin.deposit(
                created.user_id, asset, amount, f"bench-scale-{created.user_id}-{asset}"
            )
            if not ack.accepted:
                raise RuntimeError(f"deposit for user {created.user_id} refused: {ack}")
        traders.append(Trader(created.user_id, created.api_key, created.api_secret))
    return traders


def _client(address: str, channel: grpc.aio.Channel, trader: Trader) -> OmsClient:
    return OmsClient(
        address,
        user_id=trader.user_id,
        api_key=trader.api_key,
        api_secret=trader.api_secret,
        channel=channel,
        timeout_s=CALL_TIMEOUT_S,
    )


async def _answer(client: OmsClient, request: gateway_pb2.PlaceOrderRequest) -> int:
    """Place until a definitive answer; how many retries it took."""
    for retries in itertools.count():
        try:
            ack = await client.place_order(request)
        except GatewayCallError as error:
            if error.code.name not in RETRIED_CODES:
                raise
        else:
            if not ack.retryable:
                return retries
        await asyncio.sleep(RETRY_PAUSE_S)
    raise AssertionError("unreachable")


class _Quotes:
    """The makers' resting bid and ask (a large one each, so takers never run out)."""

    def __init__(self, makers: Sequence[OmsClient]) -> None:
        self.makers = makers
        self._rounds = itertools.count(1)

    async def place(self) -> None:
        round_number = next(self._rounds)
        for index, maker in enumerate(self.makers):
            side = common_pb2.SIDE_BUY if index % 2 == 0 else common_pb2.SIDE_SELL
            offset = -1_000 if side == common_pb2.SIDE_BUY else 1_000
            request = maker.place_request(
                f"quote-{round_number}-{index}",
                SYMBOL,
                side,
                price_ticks=MID_TICKS + offset,
                quantity_lots=MAKER_LOTS,
            )
            await _answer(maker, request)


class _TakerLoad:
    def __init__(self, takers: Sequence[OmsClient], rate: int, quotes: _Quotes) -> None:
        self.takers = takers
        self.rate = rate
        self.quotes = quotes
        self.samples: list[Sample] = []
        self.stop = asyncio.Event()
        self.retries: Counter[str] = Counter()
        self._numbers = itertools.count(1)
        self._random = random.Random(7)

    def _request(self, taker: OmsClient) -> gateway_pb2.PlaceOrderRequest:
        buy = self._random.random() < 0.5
        # Through the makers' quotes, IOC: it fills there and never rests.
        return taker.place_request(
            f"take-{taker.user_id}-{next(self._numbers)}",
            SYMBOL,
            common_pb2.SIDE_BUY if buy else common_pb2.SIDE_SELL,
            price_ticks=MID_TICKS + 30_000 if buy else MID_TICKS - 30_000,
            quantity_lots=1,
            time_in_force=common_pb2.TIME_IN_FORCE_IOC,
        )

    async def warm(self) -> None:
        for start in range(0, len(self.takers), 64):
            await asyncio.gather(
                *(_answer(t, self._request(t)) for t in self.takers[start : start + 64])
            )

    def between(self, started: float, ended: float) -> list[Sample]:
        return [s for s in self.samples if started <= s.slot_s < ended]

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        for index in itertools.count():
            if self.stop.is_set():
                break
            slot = started + index / self.rate
            delay = slot - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            taker = self.takers[self._random.randrange(len(self.takers))]
            task = asyncio.create_task(self._one(taker, slot))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def _one(self, taker: OmsClient, slot: float) -> None:
        retries = await _answer(taker, self._request(taker))
        self.samples.append(Sample(slot, time.monotonic() - slot, retries))
