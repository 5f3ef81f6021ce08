"""Shrinking a failing run: fewer steps, fewer kinds of fault, the same violation.

A run is a pure function of its config, so a failure found at step k is reproduced by
the same seed run for k steps (its trace is a prefix). Violations found after the
faulty phase (the settling audit) need a search: the step count is bisected. Then
each kind of fault is switched off in turn, and kept off if the failure (the same
kind of violation) remains; then the steps are bisected again. The result is the
config to rerun (`oms sim --seed S --steps N --faults ...`) and its fault trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulation.core.world import SimConfig, SimResult, run

DEFAULT_BUDGET_RUNS = 60


@dataclass(frozen=True, slots=True)
class Shrunk:
    config: SimConfig
    result: SimResult
    runs: int


class _Search:
    def __init__(self, kind: str, budget: int) -> None:
        self.kind = kind
        self.budget = budget
        self.runs = 0

    def fails(self, config: SimConfig) -> SimResult | None:
        """The run's result if it fails the same way; None if it passes (or differs)."""
        self.runs += 1
        result = run(config)
        if result.violations and result.violations[0].kind == self.kind:
            return result
        return None

    @property
    def spent(self) -> bool:
        return self.runs >= self.budget

    def fewest_steps(self, config: SimConfig, result: SimResult) -> tuple[SimConfig, SimResult]:
        found = result.violations[0]
        if found.step < config.steps:
            candidate = replace(config, steps=found.step)
            again = self.fails(candidate)
            if again is not None:
                return candidate, again
        passing, failing = 0, config.steps
        best = (config, result)
        while failing - passing > 1 and not self.spent:
            middle = (passing + failing) // 2
            candidate = replace(config, steps=middle)
            again = self.fails(candidate)
            if again is None:
                passing = middle
            else:
                failing, best = middle, (candidate, again)
        return best


def shrink(config: SimConfig, result: SimResult, budget_runs: int = DEFAULT_BUDGET_RUNS) -> Shrunk:
    if result.ok:
        raise ValueError("nothing to shrink: the run passed")
    search = _Search(result.violations[0].kind, budget_runs)
    best, best_result = search.fewest_steps(config, result)
    for kind in sorted(best.plan.kinds):
        if search.spent:
            break
        candidate = replace(best, plan=best.plan.without(kind))
        again = search.fails(candidate)
        if again is not None:
            best, best_result = candidate, again
    if not search.spent:
        best, best_result = search.fewest_steps(best, best_result)
    return Shrunk(best, best_result, search.runs)
