"""Many seeds at once, on every core: `oms sim --seeds N`, and the figures of `oms chaos report`.

Each seed runs in a worker process (a run is pure: workers share nothing); the
figures are summed here and written as JSON, which `oms chaos report` renders.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.markets.catalog import Market, load_catalog
from simulation.core.faults import FaultPlan
from simulation.core.world import SimConfig, SimResult, run


@dataclass(slots=True)
class CampaignFigures:
    first_seed: int = 0
    seeds: int = 0
    steps_per_seed: int = 0
    fault_kinds: list[str] = field(default_factory=list)
    defect: str = ""
    passed: int = 0
    failed: dict[str, list[int]] = field(default_factory=dict)  # violation kind -> seeds
    steps: int = 0
    simulated_ms: int = 0
    wall_s: float = 0.0
    workers: int = 1
    faults: dict[str, int] = field(default_factory=dict)
    clients: dict[str, int] = field(default_factory=dict)
    figures: dict[str, int] = field(default_factory=dict)
    audit_checks: int = 0
    leaderless_ms: dict[str, list[int]] = field(default_factory=dict)
    longest_client_wait_ms: int = 0

    def add(self, result: SimResult) -> None:
        self.seeds += 1
        if result.ok:
            self.passed += 1
        else:
            self.failed.setdefault(result.violations[0].kind, []).append(result.seed)
        self.steps += result.steps
        self.simulated_ms += result.simulated_ms
        self.faults = dict(Counter(self.faults) + Counter(result.faults))
        self.clients = dict(
            Counter(self.clients)
            + Counter({k: v for k, v in result.clients.items() if k != "longest_wait_ms"})
        )
        self.figures = dict(Counter(self.figures) + Counter(result.figures))
        self.audit_checks += result.audit_checks
        for kind, durations in result.leaderless_ms.items():
            self.leaderless_ms.setdefault(kind, []).extend(durations)
        self.longest_client_wait_ms = max(
            self.longest_client_wait_ms, result.clients.get("longest_wait_ms", 0)
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["leaderless_ms"] = {k: sorted(v) for k, v in self.leaderless_ms.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CampaignFigures:
        return cls(**data)


def _run_one(arguments: tuple[int, int, tuple[Market, ...], FaultPlan, str]) -> SimResult:
    seed, steps, markets, plan, defect = arguments
    return run(SimConfig(seed=seed, steps=steps, markets=markets, plan=plan, defect=defect))


def run_campaign(
    first_seed: int,
    seeds: int,
    steps: int,
    plan: FaultPlan,
    *,
    defect: str = "",
    workers: int | None = None,
    progress: Callable[[SimResult], None] | None = None,
) -> tuple[CampaignFigures, list[SimResult]]:
    markets = load_catalog().markets
    workers = workers or os.cpu_count() or 1
    figures = CampaignFigures(
        first_seed=first_seed,
        steps_per_seed=steps,
        fault_kinds=sorted(plan.kinds),
        defect=defect,
        workers=workers,
    )
    jobs: Iterable[tuple[int, int, tuple[Market, ...], FaultPlan, str]] = (
        (seed, steps, markets, plan, defect) for seed in range(first_seed, first_seed + seeds)
    )
    failures: list[SimResult] = []
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(_run_one, jobs):
            figures.add(result)
            if not result.ok:
                failures.append(result)
            if progress is not None:
                progress(result)
    figures.wall_s = round(time.monotonic() - started, 1)
    return figures, failures


def save(figures: CampaignFigures, path: Path) -> None:
    path.write_text(json.dumps(figures.to_json(), indent=1, sort_keys=True) + "\n")


def load(path: Path) -> CampaignFigures:
    return CampaignFigures.from_json(json.loads(path.read_text()))
