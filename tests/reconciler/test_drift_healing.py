"""Drift between the matcher and the shard, injected, then healed by the reconciler.

- A dropped matcher event: the Cancelled of a resting order never reaches the
  shard (later events do), so the shard keeps a phantom OPEN order with its
  reservation; the reconciler closes it and releases the reservation.
- Events the matcher no longer retains: the bridge resumes from the oldest
  retained sequence (OUT_OF_RANGE, counted), the phantom left behind is healed.
- An order the matcher holds and the shard does not know: flagged as an
  impossible state, never guessed at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from protos.oms.v1 import common_pb2, shard_pb2
from tests.bridge.bridge_process import service_status
from tests.bridge.mesh import SHARD_ID, MeshClients, mesh_clients
from tests.bridge.mesh_checks import check_invariants, wait_quiet
from tests.bridge.order_updates import wait_order_update
from tests.reconciler.conftest import ReconciledMesh
from tests.reconciler.drift_injection import foreign_order, matcher_cancel
from tests.shard_service.shard_client import (
    USDT,
    balance,
    eventually,
    hydrate,
    limit_order,
    matcher_events,
)

OWNER, OTHER = 51, 52
FUNDS = 1_000_000_000
PRICE = 6_000_000  # rests below the 6,500,000 reference, inside the 10 % band
RESERVED = PRICE + PRICE * 2_000 // 1_000_000  # one lot plus the taker fee
OPEN = common_pb2.ORDER_STATUS_OPEN
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED
IOC = common_pb2.TIME_IN_FORCE_IOC


@pytest.fixture
async def reconciled(
    new_reconciled_mesh: Callable[..., ReconciledMesh], request: pytest.FixtureRequest
) -> AsyncIterator[tuple[ReconciledMesh, MeshClients]]:
    options = getattr(request, "param", {})
    made = new_reconciled_mesh(**options)
    processes = made.processes
    await asyncio.to_thread(
        processes.start, processes.shard, *processes.matchers.values(), processes.bridge
    )
    async with mesh_clients(processes) as mesh:
        await mesh.wait_bridge_connected()
        await mesh.shard.run(
            hydrate(OWNER, balances=[(USDT, FUNDS)]), hydrate(OTHER, balances=[(USDT, FUNDS)])
        )
        yield made, mesh


async def _resting_order(mesh: MeshClients) -> str:
    """A buy of OWNER resting at g1 through the bridge; its order id."""
    (placed,) = await mesh.shard.run(
        limit_order(OWNER, "rest-1", price_ticks=PRICE, quantity_lots=1)
    )
    assert placed.accepted, placed
    await wait_order_update(mesh.shard, placed.order_id, OPEN, from_position=placed.stamp.position)
    assert balance(await mesh.shard.actor(OWNER), USDT).reserved == RESERVED
    return placed.order_id


async def _assert_phantom(mesh: MeshClients, order_id: str) -> None:
    """The shard holds `order_id` OPEN with its reservation; the matcher has cancelled it."""
    view = await mesh.shard.actor(OWNER)
    assert [(o.order_id, o.status, o.reserved) for o in view.open_orders] == [
        (order_id, OPEN, RESERVED)
    ]
    at_matcher = await mesh.matchers["g1"].get_order(order_id)
    assert at_matcher is not None and at_matcher.status == CANCELLED


async def _heal_with_reconciler(
    made: ReconciledMesh, mesh: MeshClients, order_id: str
) -> shard_pb2.ShardStatus:
    before = (await mesh.shard.status()).counters
    await asyncio.to_thread(made.reconciler.start_serving)

    def healed(status: shard_pb2.ShardStatus) -> bool:
        counters = status.counters
        return (
            counters["reconcile_phantoms_closed"] > before["reconcile_phantoms_closed"]
            and counters["reconcile_reservations_released"]
            > before["reconcile_reservations_released"]
        )

    status = await eventually(mesh.shard.status, healed, timeout_s=15)
    usdt = balance(await mesh.shard.actor(OWNER), USDT)
    assert (usdt.total, usdt.reserved) == (FUNDS, 0)
    assert not (await mesh.shard.actor(OWNER)).open_orders
    await wait_order_update(mesh.shard, order_id, CANCELLED)
    report = await service_status(made.reconciler.address)
    assert report.counters["rounds"] >= 1, report
    assert report.counters["users_checked"] >= 2, report
    assert report.counters["reports_sent"] >= 1, report
    return status


async def test_dropped_cancelled_event_leaves_a_phantom_the_reconciler_closes(
    reconciled: tuple[ReconciledMesh, MeshClients],
) -> None:
    made, mesh = reconciled
    g1 = mesh.matchers["g1"]
    order_id = await _resting_order(mesh)

    assert made.processes.bridge.terminate() == 0
    before = await g1.last_sequence(SHARD_ID)
    (cancelled,) = await g1.run(matcher_cancel(order_id, OWNER))
    assert cancelled.order.status == CANCELLED
    # The next sequences: an IOC the shard never placed (Accepted, then Cancelled).
    (ioc,) = await g1.submit(foreign_order(OTHER, price_ticks=PRICE, time_in_force=IOC))
    assert not ioc.reject_reason, ioc
    events = await g1.events(SHARD_ID, before + 1)
    assert [(e.order_id, e.WhichOneof("event")) for e in events] == [
        (order_id, "cancelled"),
        (ioc.order.order.order_id, "accepted"),
        (ioc.order.order.order_id, "cancelled"),
    ]
    # The shard gets everything after the Cancelled: it skips one sequence.
    await mesh.shard.run(matcher_events(events[1:], group="g1"))
    assert (await mesh.shard.status()).counters["matcher_sequence_gaps"] == 1
    await asyncio.to_thread(made.processes.bridge.start_serving)
    await mesh.wait_bridge_connected()
    await wait_quiet(mesh)
    await _assert_phantom(mesh, order_id)

    status = await _heal_with_reconciler(made, mesh, order_id)
    assert status.counters["reconcile_impossible_states"] == 0
    await wait_quiet(mesh)
    await check_invariants(mesh, gaps_expected=True)


@pytest.mark.parametrize(
    "reconciled",
    [
        {
            "matcher_environment": {"g1": {"OMS_MATCHER_RETAINED_EVENTS": "4"}},
            # Every (user, group) reported every round, as the bare design says.
            "reconciler_environment": {"OMS_RECONCILER_ONLY_ON_DRIFT": "0"},
        }
    ],
    indirect=True,
)
async def test_events_past_retention_are_skipped_loudly_and_healed(
    reconciled: tuple[ReconciledMesh, MeshClients],
) -> None:
    made, mesh = reconciled
    g1 = mesh.matchers["g1"]
    order_id = await _resting_order(mesh)
    made.processes.bridge.kill()
    (cancelled,) = await g1.run(matcher_cancel(order_id, OWNER))
    assert cancelled.order.status == CANCELLED
    for _ in range(3):  # six more events: the Cancelled leaves the 4-event window
        await g1.submit(foreign_order(OTHER, price_ticks=PRICE, time_in_force=IOC))
    last = await g1.last_sequence(SHARD_ID)
    assert last == 8

    await asyncio.to_thread(made.processes.bridge.start_serving)
    await mesh.wait_bridge_connected()
    await wait_quiet(mesh)
    report = await mesh.bridge_status()
    assert report.counters["sequence_out_of_range"] == 1, report
    assert report.counters["events_skipped"] == 3, report  # 2, 3, 4: the window is 5..8
    assert report.info["last_delivered_sequence.g1"] == str(last)
    await _assert_phantom(mesh, order_id)

    await _heal_with_reconciler(made, mesh, order_id)
    reconciler = await service_status(made.reconciler.address)
    assert reconciler.counters["reports_sent"] >= 4, reconciler  # two users, two groups
    await wait_quiet(mesh)
    await check_invariants(mesh, gaps_expected=True)


@pytest.mark.parametrize(
    # One user per round: the drifting user is the second, found once the window moves on.
    "reconciled",
    [{"reconciler_environment": {"OMS_RECONCILER_MAX_USERS": "1"}}],
    indirect=True,
)
async def test_order_only_the_matcher_holds_is_flagged_impossible(
    reconciled: tuple[ReconciledMesh, MeshClients],
) -> None:
    made, mesh = reconciled
    g1 = mesh.matchers["g1"]
    stray = foreign_order(OTHER, price_ticks=PRICE)
    (rested,) = await g1.submit(stray)
    assert rested.order.status == OPEN, rested
    await wait_quiet(mesh)  # the bridge delivered its Accepted: an orphan to the shard
    before = (await mesh.shard.status()).counters
    assert before["orphan_events"] >= 1

    await asyncio.to_thread(made.reconciler.start_serving)

    def flagged(status: shard_pb2.ShardStatus) -> bool:
        counters = status.counters
        return counters["reconcile_impossible_states"] > before["reconcile_impossible_states"]

    status = await eventually(mesh.shard.status, flagged, timeout_s=15)
    assert status.counters["reconcile_phantoms_closed"] == before["reconcile_phantoms_closed"]
    report = await eventually(
        lambda: service_status(made.reconciler.address),
        lambda report: report.counters["window_wraps"] >= 1,
    )
    assert report.counters["users_checked"] >= 2, report
    usdt = balance(await mesh.shard.actor(OTHER), USDT)
    assert (usdt.total, usdt.reserved) == (FUNDS, 0), "flagged, never guessed at"

    # The operator's fix: cancel it at the matcher; then both sides agree again.
    (cancelled,) = await g1.run(matcher_cancel(stray.order_id, OTHER))
    assert cancelled.order.status == CANCELLED
    await wait_quiet(mesh)
    await check_invariants(mesh)
