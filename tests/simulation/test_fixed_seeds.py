"""The whole mesh, simulated: a fixed set of seeds, every fault kind on, no violation.

Each seed is 20,000 scheduler steps with faults (a few simulated seconds of
trading by 16 users on two shard groups and two matcher groups of three replicas
each), then settling and the independent audit. `oms sim --seeds 1000` is the long
run; this is the bounded one `make test` runs on every change.

Seed 80 found a defect of the system (2% of seeds did, README), since mended: a seed
that takes the mended path stays as its test.
"""

from __future__ import annotations

import pytest

from services.markets.catalog import load_catalog
from simulation.core.faults import (
    CRASH,
    DELAY,
    DROP,
    DUPLICATE,
    PAUSE,
    STORE_ABORT,
    STORE_DOWN,
    STORE_UNKNOWN,
    FaultPlan,
)
from simulation.core.world import SimConfig, run
from simulation.report_text import run_text

SEEDS = (1, 2, 3, 4, 5, 6, 7, 8)
STEPS = 20_000
# Process and database faults only: new kinds of fault elsewhere leave these runs alone.
RESTARTS = FaultPlan().only(
    frozenset({STORE_DOWN, CRASH, PAUSE, DROP, DELAY, DUPLICATE, STORE_ABORT, STORE_UNKNOWN})
)


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


def test_a_seed_whose_restarts_replay_for_the_persister_runs_clean() -> None:
    """The defect seed 80 found (README, "The whole mesh, simulated"; the runs have
    changed since, so seed 80 no longer meets it: `git checkout a359045` reproduces
    it): PostgreSQL down, the persister's cursor behind; a shard replica snapshotted
    past it, crashed, started again from that snapshot and led. Its egress window
    started after the snapshot, the log before it was truncated, and the persister,
    which will not skip rows, stopped for good (`EgressGapError` in the real one).
    Replicas now keep a snapshot at or before the cursor the log last heard (and the
    log after it), and a restart behind it replays from there
    (`services/runtime/core/snapshot_policy.py`). Seed 3 of a plan of process and
    database faults restarts so."""
    config = SimConfig(seed=3, steps=STEPS, markets=load_catalog().markets, plan=RESTARTS)
    result = run(config)
    assert result.ok, run_text(config, result, trace=False)
    assert result.figures.get("replays_for_egress", 0) >= 1  # the case that failed, taken again
