"""Followers on etcd's watches while its history is compacted, in the simulated mesh.

What the real follower does (`services/runtime/log_follower.py`), modelled in
`simulation/core/replica_node.py` over `etcd_model.py`: it reads the log's records to
the end, watches their keys from the revision that read saw, and applies each change
that follows on; a broken watch, a compacted one, or a read etcd does not answer sends
it back to a range read. A paused follower's watch falls behind (etcd holds a
bounded buffer for it) and a compaction passes it: the leader's own after a
truncation, or another's (`etcd_compact`: an operator, etcd's auto-compaction).
Judged by the checks after every step, and after settling by every replica having
applied what the log held a round before.
"""

from __future__ import annotations

from services.markets.catalog import load_catalog
from simulation.core.faults import DELAY, DROP, ETCD_COMPACT, PAUSE, FaultPlan
from simulation.core.world import SimConfig, run
from simulation.report_text import run_text

# Processes paused (their watches fall behind) and etcd's history compacted, often.
COMPACTIONS = FaultPlan(process_fault_ppm=300_000).only(
    frozenset({PAUSE, ETCD_COMPACT, DROP, DELAY})
)


def test_followers_behind_a_compaction_read_the_range_again_and_catch_up() -> None:
    """Seed 2: a watch fell behind a paused follower, a compaction passed it, and the
    follower caught up by a range read; nothing else went wrong."""
    config = SimConfig(seed=2, steps=20_000, markets=load_catalog().markets, plan=COMPACTIONS)
    result = run(config)
    assert result.ok, run_text(config, result, trace=True)
    figures = result.figures
    assert result.faults["etcd_compact"] >= 1 and figures["etcd_compactions"] >= 1, figures
    assert figures["etcd_watches_fell_behind"] >= 1
    assert figures["etcd_watches_compacted"] >= 1
    assert figures["follower_rereads_WatchCompacted"] >= 1


def test_broken_watches_are_read_again_under_every_fault() -> None:
    """Seed 3 with every fault kind: watch streams break like the bridge's, and each
    follower goes back to a range read and on."""
    config = SimConfig(seed=3, steps=20_000, markets=load_catalog().markets)
    result = run(config)
    assert result.ok, run_text(config, result, trace=True)
    assert result.figures["follower_rereads_WatchBroken"] >= 1, result.figures
    assert result.figures["follower_range_reads"] > result.figures["etcd_watches_compacted"]
