"""The gateway's counters, read by `oms.v1.Status/GetStatus` (and so by the metrics).

Names are dotted: `requests.PlaceOrder`, `auth_failures.BAD_SIGNATURE`,
`validation_failures.OUT_OF_RANGE`, `shard_unavailable`, ... A counter that
never moved is absent, which reads as zero.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping


class GatewayCounters:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        self._counts[name] += amount

    def get(self, name: str) -> int:
        return self._counts[name]

    def snapshot(self) -> Mapping[str, int]:
        return dict(self._counts)
