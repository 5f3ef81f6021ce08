"""Named monotonic counters, read by the Status service and the statistics log line.

Each component declares the names it keeps, so every counter shows up (at zero)
from the start and a misspelt name fails loudly instead of starting a new count.
"""

from __future__ import annotations

from collections.abc import Iterable


class Counters:
    def __init__(self, names: Iterable[str]) -> None:
        self._values: dict[str, int] = dict.fromkeys(names, 0)

    def add(self, name: str, amount: int = 1) -> None:
        if name not in self._values:
            raise KeyError(f"undeclared counter {name!r}")
        self._values[name] += amount

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        return dict(self._values)
