"""Percentiles over recorded latencies (nearest-rank, as load tools report them)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize_ms(values_ns: Sequence[int]) -> tuple[float, float, float]:
    """(p50, p99, max) in milliseconds."""
    ordered = sorted(values_ns)
    return (
        percentile(ordered, 0.50) / 1e6,
        percentile(ordered, 0.99) / 1e6,
        (ordered[-1] / 1e6) if ordered else math.nan,
    )
