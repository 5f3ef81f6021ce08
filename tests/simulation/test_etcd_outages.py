"""etcd's quorum lost while the mesh trades, in the simulated mesh.

What the real runtime does (`services/runtime/etcd_log.py`, `replicated_host.py`),
modelled in `simulation/core/replica_node.py` over `etcd_model.py`: a leader retries
the record etcd did not answer and, past its append deadline, ends (crash-only) and
is started again; replicas that cannot read the log at their start end and are
started again; no lease expires while etcd has no quorum, and every one is extended
a TTL past the outage; an append sent as the quorum went may have committed, and
whoever reads next (the retry, or the next leader) finds it. Judged by the checks
after every step and the audit after settling.
"""

from __future__ import annotations

from services.markets.catalog import load_catalog
from simulation.core.faults import CRASH, DELAY, DROP, DUPLICATE, ETCD_DOWN, FaultPlan
from simulation.core.world import SimConfig, run
from simulation.report_text import run_text

OUTAGES = FaultPlan().only(frozenset({ETCD_DOWN, CRASH, DROP, DELAY, DUPLICATE}))


def test_leaders_outlasted_by_an_outage_end_and_the_log_keeps_what_etcd_took() -> None:
    """Seed 1: six outages long and short among crashes; three leaders ended on their
    append deadline, an append committed unanswered (found by the next leader's
    read), starts that could not read the log retried, groups served again after
    each."""
    config = SimConfig(seed=1, steps=40_000, markets=load_catalog().markets, plan=OUTAGES)
    result = run(config)
    assert result.ok, run_text(config, result, trace=True)
    figures = result.figures
    assert figures["leaders_ended_etcd_unavailable"] >= 1, figures
    assert figures["etcd_unanswered_commits"] >= 1
    assert figures["starts_failed_etcd_unavailable"] >= 1
    assert result.faults["etcd_down"] >= 1
    after_outages = [key for key in result.leaderless_ms if key.endswith("etcd_down")]
    assert after_outages, result.leaderless_ms  # unserved, then served again
