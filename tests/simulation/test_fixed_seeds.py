"""The whole mesh, simulated: a fixed set of seeds, every fault kind on, no violation.

Each seed is 20,000 scheduler steps with faults (a few simulated seconds of
trading by 16 users on two shard groups and two matcher groups of three replicas
each), then settling and the independent audit. `oms sim --seeds 1000` is the long
run; this is the bounded one `make test` runs on every change.

Seed 80 finds an open defect of the system (2% of seeds do, README): it is pinned by
`test_seed_80_finds_the_open_egress_gap_defect` below until the defect is mended.
"""

from __future__ import annotations

import pytest

from services.markets.catalog import load_catalog
from simulation.core.world import SimConfig, run
from simulation.report_text import run_text

SEEDS = (1, 2, 3, 4, 5, 6, 7, 8)
STEPS = 20_000


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seed_runs_without_a_violation(seed: int) -> None:
    config = SimConfig(seed=seed, steps=STEPS, markets=load_catalog().markets)
    result = run(config)
    assert result.ok, run_text(config, result, trace=False)
    # The run did what it is for: faults, trades, failovers, and checks.
    assert sum(result.faults.values()) > 0
    assert result.figures["fills_stored"] > 0
    assert result.clients["acknowledged_orders"] > 0
    assert result.figures["conservation_checks"] >= STEPS
    assert result.audit_checks > 0


def test_seed_80_finds_the_open_egress_gap_defect() -> None:
    """Open defect (README, "The whole mesh, simulated"): PostgreSQL is down, so the
    persister's cursor stays behind; a shard leader snapshots past it, crashes, starts
    again from that snapshot and leads again. Its egress window starts after the
    snapshot, the log before it is truncated, and the persister, which will not skip
    rows, stops for good (`EgressGapError` in the real one). When this is mended the
    test fails: then seed 80 runs clean like the others."""
    config = SimConfig(seed=80, steps=STEPS, markets=load_catalog().markets)
    result = run(config)
    assert [v.kind for v in result.violations] == ["egress-gap"], run_text(
        config, result, trace=False
    )
