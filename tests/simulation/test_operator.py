"""An operator at the admin API while users trade, in the simulated mesh: halts, risk
limits and restarts decided by the real shard machine (`operator_controls.py`) under
lost, late and duplicated messages, crashes and users moving between groups.

After settling: every accepted answer the operator got has its `admin_audit` row,
no row beyond the copies of its commands a leader took, no request changing a
user twice, and no user is left halted or limited once the operator lifted everything
(`simulation/core/operator_model.py`); the money checks and the audit hold as in
every run.
"""

from __future__ import annotations

from services.markets.catalog import load_catalog
from simulation.core.defects import OPERATOR_UNPINNED
from simulation.core.faults import (
    CRASH,
    DELAY,
    DROP,
    DUPLICATE,
    OPERATOR,
    SCALE,
    USER_MOVE,
    FaultPlan,
)
from simulation.core.world import SimConfig, SimWorld
from simulation.report_text import run_text

OPERATING = FaultPlan().only(frozenset({OPERATOR, CRASH, DROP, DELAY, DUPLICATE, USER_MOVE, SCALE}))


def test_operator_decisions_are_audited_once_and_lifted_under_faults() -> None:
    """Seed 6: five accepted decisions and a sixth whose answer was lost, each with its
    row; halts and limits lifted through crashes and moves."""
    config = SimConfig(seed=6, steps=20_000, markets=load_catalog().markets, plan=OPERATING)
    world = SimWorld(config)
    result = world.run()
    assert result.ok, run_text(config, result, trace=True)
    figures = result.figures
    assert figures["operator_accepted"] >= 3, figures
    assert figures["operator_audit_rows"] > figures["operator_accepted"]  # an answer lost
    assert world.operator.idle


def test_seed_852_which_found_the_late_halt_runs_clean() -> None:
    """Mended (README, "The whole mesh, simulated", item 5): a halt delivered twice, one
    copy decided at once, the user resumed, the late copy decided after the resume left
    the user halted. Controls now carry the request's id and the control version they
    were read at: the late copy is refused CONTROL_VERSION_STALE."""
    config = SimConfig(seed=852, steps=20_000, markets=load_catalog().markets)
    result = SimWorld(config).run()
    assert result.ok, run_text(config, result, trace=True)


def test_controls_sent_unpinned_are_caught_leaving_a_user_halted() -> None:
    """The planted control: the admin API as it was (no request id, no version)."""
    config = SimConfig(
        seed=852, steps=20_000, markets=load_catalog().markets, defect=OPERATOR_UNPINNED
    )
    result = SimWorld(config).run()
    assert [v.kind for v in result.violations] == ["operator-lift"], result.violations
