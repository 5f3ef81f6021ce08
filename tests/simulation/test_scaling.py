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
from simulation.core.faults import CRASH, DELAY, DROP, SCALE, FaultPlan
from simulation.core.world import SimConfig, SimWorld
from simulation.report_text import run_text

STEPS = 20_000
# The controller killed often while it scales.
KILLING = FaultPlan(process_fault_ppm=300_000).only(frozenset({SCALE, CRASH, DROP, DELAY}))


def _run(seed: int, plan: FaultPlan | None = None, steps: int = STEPS) -> SimWorld:
    markets = load_catalog().markets
    config = SimConfig(seed=seed, steps=steps, markets=markets, plan=plan or FaultPlan())
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


def test_a_group_joins_and_another_leaves_while_users_trade() -> None:
    """Seed 30: s3 joins (its users move in a wave, the cut-over holds the few that
    would not go flat on their old owner), then s1 or s2 leaves the same way."""
    world = _run(30)
    figures = world.waves.figures
    assert figures["scale_outs"] == 1 and figures["scale_ins"] == 1, figures
    assert world.waves.landed > 0
    document = world.routing
    assert len(document.clusters) == 2
    assert all(c.state == ClusterState.ACTIVE for c in document.clusters)
    removed = set(world.shard_ids) - {c.cluster_id for c in document.clusters}
    residents = _residents_by_group(world)
    for group in removed:
        assert not residents[group], f"{group} left the document but holds users"
    for group, users in residents.items():
        for user in users:
            assert document.owner_of(user) == group, f"user {user} resident off its owner"


def test_a_scale_in_whose_users_will_not_go_flat_is_undone() -> None:
    """Seed 28: a group's cut-over found users still holding open orders after the
    quiesce time: the cut-over is undone, the group stays draining and keeps owning
    them, nothing is lost (the audit after settling)."""
    world = _run(28)
    assert world.waves.figures["scale_ins_blocked"] == 1, world.waves.figures
    states = {c.cluster_id: c.state for c in world.routing.clusters}
    assert ClusterState.DRAINING in states.values(), states
    draining = next(c for c, state in states.items() if state == ClusterState.DRAINING)
    residents = _residents_by_group(world)
    assert all(world.routing.owner_of(user) == draining for user in residents[draining])


def test_a_controller_killed_mid_operation_is_resumed_by_the_next() -> None:
    """The controller killed while it had users in transit or a cut-over under way:
    the next incarnation settles the transits and finishes or undoes the cut-over."""
    world = _run(4, KILLING, 30_000)
    figures = world.waves.figures
    assert figures["wave_operations_killed"] >= 1, figures
    assert figures["wave_resumes"] >= 1
    assert not world.routing.transit and not world.routing.cutting_over
