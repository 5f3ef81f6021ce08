"""Shard groups added and removed while users trade, in the simulated mesh.

The simulation's wave controller (`simulation/core/routing_model.py`) decides with the
real document changes and the real choice of movers (`services/routing/core/
wave_plan.py`); the checks after every step (no user resident on two groups, money
conserved across the groups and the database, epochs never going back) and the
settling audit judge it; `test_planted_defects.py` plants a controller that lands
users before their old group lets go, and requires it found. The seeds were picked
from `oms sim` runs for what they do.
"""

from __future__ import annotations

from services.markets.catalog import load_catalog
from services.routing.core.routing_document import ClusterState
from simulation.core.faults import (
    CRASH,
    DELAY,
    DROP,
    DUPLICATE,
    SCALE,
    STORE_ABORT,
    STORE_UNKNOWN,
    USER_MOVE,
    FaultPlan,
)
from simulation.core.world import SimConfig, SimWorld
from simulation.report_text import run_text

STEPS = 20_000
# Routing and message faults only (no process faults): new kinds of fault elsewhere
# leave these runs alone.
SCALING = FaultPlan().only(
    frozenset({SCALE, USER_MOVE, DROP, DELAY, DUPLICATE, STORE_ABORT, STORE_UNKNOWN})
)
# The controller killed often while it scales.
KILLING = FaultPlan(process_fault_ppm=300_000).only(frozenset({SCALE, CRASH, DROP, DELAY}))


def _run(seed: int, plan: FaultPlan, steps: int = STEPS) -> SimWorld:
    markets = load_catalog().markets
    config = SimConfig(seed=seed, steps=steps, markets=markets, plan=plan)
    world = SimWorld(config)
    result = world.run()
    assert result.ok, run_text(config, result, trace=True)
    return world


def _residents_by_group(world: SimWorld) -> dict[str, set[int]]:
    residents = {}
    for shard in world.shard_ids:
        leader = world.leading_replica(shard)
        assert leader is not None, f"{shard} has no leader after settling"
        residents[shard] = set(leader.machine.state.actors)
    return residents


def _owned_where_resident(world: SimWorld) -> dict[str, set[int]]:
    residents = _residents_by_group(world)
    for group, users in residents.items():
        for user in users:
            assert world.routing.owner_of(user) == group, f"user {user} resident off its owner"
    return residents


def test_a_group_joins_while_users_trade() -> None:
    """Seed 5: s3 joins; the residents the hash gives it move in a wave, and the
    cut-over holds on their old group the few that would not go flat."""
    world = _run(5, SCALING)
    figures = world.waves.figures
    assert figures["scale_outs"] == 1 and figures["scale_users_held"] >= 1, figures
    assert world.waves.landed > 0
    assert {c.cluster_id: c.state for c in world.routing.clusters}["s3"] == ClusterState.ACTIVE
    _owned_where_resident(world)


def test_a_group_leaves_while_users_trade() -> None:
    """Seed 37: a group's users moved to the others, its cut-over found it empty, and it
    left the document; settled, it holds nobody. (Rare: a user with a resting order
    cannot go flat in transit, since its cancels are refused too, and undoes a
    removal: the next test.)"""
    world = _run(37, SCALING)
    assert world.waves.figures["scale_ins"] == 1, world.waves.figures
    document = world.routing
    assert len(document.clusters) == 1 and document.clusters[0].state == ClusterState.ACTIVE
    removed = set(world.shard_ids) - {c.cluster_id for c in document.clusters} - {"s3"}
    residents = _owned_where_resident(world)
    assert removed and all(not residents[group] for group in removed)


def test_a_scale_in_whose_users_will_not_go_flat_is_undone() -> None:
    """Seed 1: a group's cut-over found users still holding open orders after the
    quiesce time: the cut-over is undone, the group stays draining and keeps owning
    them, nothing is lost (the audit after settling)."""
    world = _run(1, SCALING, 30_000)
    assert world.waves.figures["scale_ins_blocked"] == 1, world.waves.figures
    states = {c.cluster_id: c.state for c in world.routing.clusters}
    draining = [c for c, state in states.items() if state == ClusterState.DRAINING]
    assert len(draining) == 1, states
    residents = _owned_where_resident(world)
    assert residents[draining[0]], "the draining group holds its users still"


def test_a_controller_killed_mid_operation_is_resumed_by_the_next() -> None:
    """The controller killed while it had users in transit or a cut-over under way:
    the next incarnation settles the transits and finishes or undoes the cut-over."""
    world = _run(1, KILLING, 30_000)
    figures = world.waves.figures
    assert figures["wave_operations_killed"] >= 1, figures
    assert figures["wave_resumes"] >= 1
    assert not world.routing.transit and not world.routing.cutting_over
    _owned_where_resident(world)
