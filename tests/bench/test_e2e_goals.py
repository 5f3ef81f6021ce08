"""`oms bench e2e`'s goals block: each API's maximum against the row-lock design, and the
unary path's own goals, from results made here (no mesh is started)."""

from __future__ import annotations

from services.bench.e2e_bench import PhaseResult, _goal_lines
from services.bench.row_lock_design import DesignResult
from services.bench.transport_counts import PhaseTransport


def _result(api: str, offered: int, acked: int, **fields: object) -> PhaseResult:
    return PhaseResult(api, "uniform", offered, acked, 0, 1.0, 1.0, 2.0, 3.0, **fields)  # type: ignore[arg-type]


def test_the_unary_maximum_is_held_to_its_ratio_and_its_gateway_goals() -> None:
    transport = PhaseTransport(
        links={("gateway", "shard"): 100, ("shard", "gateway"): 100},
        sent={},
        received={},
        switches={},
    )
    results = [
        _result(
            "unary",
            0,
            2_000,
            cpu_us_per_order={"gateway": 350.0, "shard": 100.0},
            transport=transport,
            load_cpu_us_per_order=310.0,
        ),
        _result("stream", 0, 5_000),
    ]
    design = [DesignResult("full", "uniform", 16, 1_000.0, 10.0, 40.0, 0)]
    lines = _goal_lines(results, design)
    assert (
        "uniform: unary maximum 2,000/s = 2.00x the row-lock design's full job (1,000/s at 16"
        " clients) (at least 1.5x; the load generator spent 310 µs per order on the same"
        " cores): met"
    ) in lines
    assert any(line.startswith("uniform: stream maximum 5,000/s = 5.00x") for line in lines)
    assert (
        "uniform: gateway CPU per unary order at the maximum µs 350.00 (at most 300): NOT met"
        in lines
    )
    assert (
        "uniform: gateway→shard messages per unary order at the maximum 0.05 (at most 0.1): met"
        in lines
    )
