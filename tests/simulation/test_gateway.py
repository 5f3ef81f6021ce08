"""The gateway's own decisions in the simulated mesh (`simulation/core/gateway_model.py`
over `gateway/core/`): requests checked, translated and stamped with the routing epoch
they were routed by, NOT_OWNER followed as the gateway's router does, malformed
requests refused with their reason and nothing sent on."""

from __future__ import annotations

from services.markets.catalog import load_catalog
from simulation.core.world import SimConfig, run
from simulation.report_text import run_text


def test_the_gateway_reroutes_and_refuses_as_the_real_one_under_every_fault() -> None:
    """Seed 3 with every fault kind: users moved and groups scaled while they trade; the
    gateway's routing lags the document, shards lag the gateway, and it goes on."""
    config = SimConfig(seed=3, steps=20_000, markets=load_catalog().markets)
    result = run(config)
    assert result.ok, run_text(config, result, trace=True)
    figures = result.figures
    # NOT_OWNER from a shard that had not logged the gateway's epoch: asked again.
    assert figures["gateway_not_owner"] >= 1 and figures["gateway_shard_epoch_behind"] >= 1
    # Users in transit waited for, the document read from etcd past the watch's grace,
    # and a client told UNAVAILABLE once the re-routing budget was spent.
    assert figures["gateway_in_transit_waits"] >= 1 and figures["gateway_routing_reads"] >= 1
    assert figures["gateway_unavailable_in_transit"] >= 1, figures
    # Malformed orders refused with their own reasons (each checked by the run).
    assert result.clients["malformed_refused"] >= 3
    refused = {key for key in figures if key.startswith("gateway_refused_")}
    assert refused == {
        "gateway_refused_INVALID_FIELD",
        "gateway_refused_OUT_OF_RANGE",
        "gateway_refused_UNKNOWN_SYMBOL",
    }, refused
