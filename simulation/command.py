"""`oms sim`: the whole mesh simulated for one seed, or a campaign of seeds.

oms sim --seed 7 --steps 20000          # one run, reproducible: same trace, same hash
oms sim --seed 7 --steps 20000 --shrink # a failing run shrunk to a short reproducer
oms sim --seeds 1000 --report chaos.json # a campaign on every core; exit 1 on a violation
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from services.markets.catalog import load_catalog
from simulation import campaign
from simulation.core.defects import DEFECTS
from simulation.core.faults import FAULT_KINDS, NO_FAULTS, FaultPlan
from simulation.core.shrink import shrink
from simulation.core.world import SimConfig, SimResult, run
from simulation.report_text import campaign_markdown, reproduce_command, run_text


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "sim",
        help="simulate the whole mesh in one process for a seed, with faults (or many seeds)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20_000, help="scheduler steps with faults")
    parser.add_argument("--seeds", type=int, default=0, help="run this many seeds from --seed")
    parser.add_argument(
        "--faults",
        default="all",
        help=f"all, none, or a comma list of: {', '.join(FAULT_KINDS)}",
    )
    parser.add_argument("--defect", choices=DEFECTS, default="", help="plant a defect on purpose")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing run")
    parser.add_argument("--trace", action="store_true", help="print the injected faults")
    parser.add_argument("--json", action="store_true", help="one run's result as JSON")
    parser.add_argument("--report", type=Path, help="a campaign's figures, as JSON")
    parser.add_argument("--workers", type=int, default=0, help="processes (default: cores)")
    parser.set_defaults(handler=main)


def fault_plan(text: str) -> FaultPlan:
    if text == "all":
        return FaultPlan()
    if text == "none":
        return NO_FAULTS
    kinds = frozenset(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = sorted(kinds - set(FAULT_KINDS))
    if unknown:
        raise SystemExit(f"oms sim: unknown fault kinds {unknown}; known: {list(FAULT_KINDS)}")
    return FaultPlan().only(kinds)


def main(arguments: argparse.Namespace) -> int:
    plan = fault_plan(arguments.faults)
    if arguments.seeds:
        return _campaign(arguments, plan)
    config = _config(arguments, plan, arguments.seed)
    result = run(config)
    if arguments.json:
        print(json.dumps(asdict(result) | {"ok": result.ok}, indent=1, default=sorted))
    else:
        print(run_text(config, result, trace=arguments.trace))
    if not result.ok and arguments.shrink:
        _print_shrunk(config, result)
    return 0 if result.ok else 1


def _config(arguments: argparse.Namespace, plan: FaultPlan, seed: int) -> SimConfig:
    return SimConfig(
        seed=seed,
        steps=arguments.steps,
        markets=load_catalog().markets,
        plan=plan,
        defect=arguments.defect,
    )


def _print_shrunk(config: SimConfig, result: SimResult) -> None:
    shrunk = shrink(config, result)
    print(f"\nshrunk in {shrunk.runs} runs to: {reproduce_command(shrunk.config)}")
    print(run_text(shrunk.config, shrunk.result, trace=True))


def _campaign(arguments: argparse.Namespace, plan: FaultPlan) -> int:
    total = arguments.seeds
    done = 0

    def progress(result: SimResult) -> None:
        nonlocal done
        done += 1
        if not result.ok:
            violation = result.violations[0]
            print(f"seed {result.seed}: {violation.kind}: {violation.detail}", flush=True)
        if done % max(1, total // 10) == 0:
            print(f"  {done}/{total} seeds", file=sys.stderr, flush=True)

    figures, failures = campaign.run_campaign(
        arguments.seed,
        total,
        arguments.steps,
        plan,
        defect=arguments.defect,
        workers=arguments.workers or None,
        progress=progress,
    )
    if arguments.report:
        campaign.save(figures, arguments.report)
    print(campaign_markdown(figures))
    if failures and arguments.shrink:
        first = failures[0]
        _print_shrunk(_config(arguments, plan, first.seed), first)
    return 1 if failures else 0
