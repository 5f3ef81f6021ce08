"""Clock steps of one process at a time, under Debian's libfaketime, in a real mesh.

Each of the shard, matcher `g1` and the gateway runs with libfaketime preloaded,
reading its clock's offset from a file the test rewrites (as an NTP step or an
operator would move a host's clock). Only the wall clock moves: monotonic clocks
(timeouts, leases, timer spacing) are left alone, as a real step leaves them. What
the README's "Clocks" section promises, shown:

- the gateway checks a request's timestamp against its own clock: ten minutes
  ahead, a client's signed call is refused `STALE_TIMESTAMP`; back, accepted;
- a matcher's consensus time follows its clock forward at once: a GTD order whose
  expiry is ten minutes away expires when the clock is an hour ahead;
- a shard's consensus time never goes back: an hour back, it holds what it had
  reached while timer entries go on at their cadence (they once stopped for the
  step's whole length) and orders are taken; an hour ahead, it follows at once, and
  a user idle under a ten-minute TTL is evicted; back again, it holds once more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.client import AdminClient, GatewayCallError
from protos.oms.v1 import common_pb2
from tests.bridge.bridge_process import service_status
from tests.clock_faults.faketime import LIBFAKETIME, needs_libfaketime
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, PRICE, open_account

T = TypeVar("T")
pytestmark = [pytest.mark.slow, needs_libfaketime]
HOUR_S = 3_600
HOUR_MS = HOUR_S * 1_000
WAIT_S = 20.0
POLL_S = 0.05


class ProcessClock:
    """One process's wall clock: the real one plus an offset, read from a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step(0)

    def environment(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(LIBFAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_CACHE_DURATION": "1",  # the file read again at most once a second
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # a step moves the wall clock only
        }

    def step(self, offset_s: int) -> None:
        self.path.write_text(f"{offset_s:+d}\n")


async def until(probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + WAIT_S
    while True:
        value = await probe()
        if check(value):
            return value
        assert time.monotonic() < deadline, f"{what}: still {value!r} after {WAIT_S:g} s"
        await asyncio.sleep(POLL_S)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def numbers(address: str) -> dict[str, int]:
    return dict((await service_status(address)).counters)


async def resident(admin: AdminClient, user_id: int) -> bool:
    page = await admin.list_users(after_user_id=user_id - 1, limit=1)
    (user,) = page.users
    return bool(user.resident)


async def test_clock_steps_of_a_shard_a_matcher_and_a_gateway(
    tmp_path: Path, database_url: str
) -> None:
    clocks = {name: ProcessClock(tmp_path / f"{name}.clock") for name in ("shard", "g1", "gw")}
    mesh = FullMesh.create(
        tmp_path / "mesh",
        database_url,
        # Flat users leave after ten idle minutes of consensus time.
        shard_environment={**clocks["shard"].environment(), "OMS_SHARD_IDLE_TTL_MS": "600000"},
        matcher_environment={"g1": clocks["g1"].environment()},
        gateway_environment=clocks["gw"].environment(),
    )
    try:
        await asyncio.to_thread(mesh.start)
        async with mesh.admin() as admin:
            await steps(mesh, admin, clocks)
    finally:
        mesh.stop()


async def steps(mesh: FullMesh, admin: AdminClient, clocks: dict[str, ProcessClock]) -> None:
    alice = await open_account(admin, {"USDT": 10_000_000_000})
    bob = await open_account(admin, {"USDT": 1_000_000})  # flat: only the TTL keeps him
    async with alice.client(mesh.gateway.address) as client:
        gtd = await client.place(
            "gtd-1",
            BTC,
            common_pb2.SIDE_BUY,
            price_ticks=PRICE - 100_000,
            quantity_lots=1,
            time_in_force=common_pb2.TIME_IN_FORCE_GTD,
            expire_at_ms=now_ms() + 600_000,
        )
        assert gtd.accepted, gtd
        await until(
            lambda: client.get_order(order_id=gtd.order_id),
            lambda o: o.status == common_pb2.ORDER_STATUS_OPEN,
            "the GTD order rests",
        )

        # The gateway ten minutes ahead: the client's timestamps are stale to it.
        clocks["gw"].step(600)
        error = await until(refusal_of(client.balances), lambda e: e is not None, "refused")
        assert error is not None and error.reason.endswith("STALE_TIMESTAMP"), error
        clocks["gw"].step(0)
        await until(refusal_of(client.balances), lambda e: e is None, "accepted again")

        # Matcher g1 an hour ahead: its consensus time follows, the GTD order expires.
        clocks["g1"].step(HOUR_S)
        await until(
            lambda: client.get_order(order_id=gtd.order_id),
            lambda o: o.status == common_pb2.ORDER_STATUS_EXPIRED,
            "the GTD order expires",
        )
        clocks["g1"].step(0)
        g1 = await until(
            lambda: numbers(mesh.matchers["g1"].address),
            lambda n: n.get("sequencer.clock_steps_back") == 1,
            "g1 sees its clock stepped back",
        )
        assert g1["consensus_time_ms"] >= now_ms() + HOUR_MS - 60_000, g1

        # The shard an hour back: consensus time holds, timers and orders go on.
        shard = mesh.shard.address
        before = await numbers(shard)
        clocks["shard"].step(-HOUR_S)
        during = await until(
            lambda: numbers(shard),
            lambda n: n.get("sequencer.clock_steps_back") == 1,
            "the shard sees its clock stepped back",
        )
        later = await until(
            lambda: numbers(shard),
            lambda n: n["applied_position"] >= during["applied_position"] + 3,
            "timer entries go on",
        )
        assert later["consensus_time_ms"] >= before["consensus_time_ms"], (before, later)
        held = later["consensus_time_ms"]
        assert held < now_ms() + 60_000, later  # not an hour back, not ahead either
        placed = await client.place(
            "during-1", BTC, common_pb2.SIDE_BUY, price_ticks=PRICE - 100_000, quantity_lots=1
        )
        assert placed.accepted, placed
        assert placed.stamp.consensus_time_ms >= held, placed
        assert await resident(admin, bob.user_id)

        # An hour ahead: consensus time follows at once; ten idle minutes have passed.
        clocks["shard"].step(HOUR_S)
        ahead = await until(
            lambda: numbers(shard),
            lambda n: n["consensus_time_ms"] >= now_ms() + HOUR_MS - 60_000,
            "consensus time follows the clock forward",
        )
        await until(lambda: resident(admin, bob.user_id), lambda r: not r, "bob is evicted")

        # Back to the real time: held an hour ahead, and orders are still taken.
        clocks["shard"].step(0)
        back = await until(
            lambda: numbers(shard),
            lambda n: n.get("sequencer.clock_steps_back") == 2,
            "the shard sees its second step back",
        )
        assert back["consensus_time_ms"] >= ahead["consensus_time_ms"], (ahead, back)
        placed = await client.place(
            "after-1", BTC, common_pb2.SIDE_BUY, price_ticks=PRICE - 100_000, quantity_lots=1
        )
        assert placed.accepted, placed
        assert placed.stamp.consensus_time_ms >= ahead["consensus_time_ms"], placed


def refusal_of(
    call: Callable[[], Awaitable[object]],
) -> Callable[[], Awaitable[GatewayCallError | None]]:
    """A probe for `until`: the gateway's refusal of a fresh `call()`, or None."""

    async def probe() -> GatewayCallError | None:
        try:
            await call()
        except GatewayCallError as error:
            return error
        return None

    return probe
