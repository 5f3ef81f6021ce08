"""`oms bench upgrade`: what a rolling upgrade costs the callers, per replica rolled.

For a user shard, then for a matcher group: three replicas over a log in etcd and a
steady load of commands retried with their ids until answered, as `oms bench
failover` runs them (`failover_bench.py`: the same processes, loads and etcd). Then
each replica in turn, followers first and the leader last, as a StatefulSet's rolling
update goes: SIGTERM (a graceful stop: a leader resigns its lease), started again on
the next build (`--next-build MODULE`, run as `python -m MODULE <kind> ...`; by default
this build again), and caught up with the leader. The figure per replica is the
longest the load went without an acknowledgement from its stop until it had caught up
(and a few more commands were answered). Last, when every replica's build implements
a state-machine version newer than the group's, the leader logs the switch
(`oms.v1.ReplicaUpgrades/ActivateVersion`) and the figure is the longest gap around it.
The load then stops, and the run fails unless every replica reaches one position with
one state hash.

The next build of a real upgrade is a new image; `--next-build
tests.upgrade.next_release` runs this code plus a version 2 (from a checkout, where
the tests are), so the switch is measured too.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import uvloop

from protos.oms.v1 import status_pb2, status_pb2_grpc
from services.bench.failover_bench import (
    CALLERS,
    DEFAULT_LEASE_TTL_S,
    REPLICAS,
    STEADY_ACKS,
    CatalogSetting,
    CommandLoad,
    FailoverBenchError,
    GroupPlan,
    MatcherLoad,
    ReplicaGroup,
    ReplicaProcess,
    ShardLoad,
    delete_group_keys,
    plan_groups,
    refuse_used_groups,
    replica_group,
    run_measured,
)
from services.bench.runtime_bench import etcd_for_bench, load_average, machine_line
from services.clients.channels import mesh_channel
from services.infra.settings import InfraSettings
from services.markets.catalog import Market
from services.mesh.status_rows import ProcessTarget
from services.mesh.version_switch import (
    NoLeaderError,
    SwitchRefusedError,
    activate,
    group_versions,
)
from services.settings import load_settings

START_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class UpgradeBenchError(FailoverBenchError):
    """A replica did not stop, start or catch up, or the switch was refused: no figure."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--next-build",
        default="services.command_line",
        dest="next_build",
        help="the module the rolled replicas run (default: this build's `oms`)",
    )
    parser.add_argument(
        "--lease-ttl-s",
        type=int,
        default=DEFAULT_LEASE_TTL_S,
        dest="lease_ttl_s",
        help="the leader key's lease of every replica (default %(default)s)",
    )
    parser.add_argument(
        "--groups",
        choices=("both", "shard", "matcher"),
        default="both",
        help="which groups to roll (default %(default)s)",
    )
    parser.add_argument("--matcher-group", default="g1", dest="matcher_group")
    parser.add_argument("--markets-file", type=Path, default=None, dest="markets_file")


@dataclass(frozen=True, slots=True)
class GroupUpgrade:
    label: str
    rolls: list[tuple[str, float]]  # (which replica: "follower" or "leader", longest gap s)
    switch: str  # "v1 -> v2: 0.03 s", or why there was none


def _progress(text: str) -> None:
    print(f"[upgrade] {text}", file=sys.stderr, flush=True)


def longest_gap(load: CommandLoad, scan_from: int, since: float) -> float:
    """The longest time without an acknowledgement from `since` on (acks from `scan_from`)."""
    previous = since
    longest = 0.0
    for _, acknowledged in load.acks[scan_from:]:
        if acknowledged < since:
            continue
        longest = max(longest, acknowledged - previous)
        previous = acknowledged
    return longest


async def roll(
    group: ReplicaGroup, replica: ReplicaProcess, load: CommandLoad, next_build: str
) -> float:
    scan_from = len(load.acks)
    stopped_at = time.monotonic()
    replica.terminate()
    deadline = stopped_at + STOP_TIMEOUT_S
    while replica.running():
        if time.monotonic() > deadline:
            # Where it waits, in its log (services/serving/stop_signals.py), then the error.
            if replica.process is not None:
                replica.process.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1.0)
            raise UpgradeBenchError(
                f"{replica.name} still ran {STOP_TIMEOUT_S:g} s after SIGTERM:\n"
                f"{replica.log_tail(200)}"
            )
        await asyncio.sleep(0.02)
    replica.entry_module = next_build
    replica.start()
    await group.wait_caught_up(replica, CATCH_UP_TIMEOUT_S)
    await load.wait_acks(STEADY_ACKS, START_TIMEOUT_S)
    return longest_gap(load, scan_from, stopped_at)


async def switch(group: ReplicaGroup, load: CommandLoad) -> str:
    """The newest version every replica implements, activated; the gap around it."""
    targets = [
        ProcessTarget(group.kind, group.name, index, replica.address)
        for index, replica in enumerate(group.replicas)
    ]
    versions = await group_versions(group.label, targets)
    newer = versions.can_activate
    if not newer:
        implemented = sorted(versions.everyone_implements)
        return f"none: every replica implements {implemented}, {versions.version} in force"
    scan_from = len(load.acks)
    started = time.monotonic()
    try:
        await activate(targets, newer[-1], REPLICAS)
    except (SwitchRefusedError, NoLeaderError) as error:
        raise UpgradeBenchError(f"{group.label}: the switch failed: {error}") from error
    await load.wait_acks(STEADY_ACKS, START_TIMEOUT_S)
    gap = longest_gap(load, scan_from, started)
    return f"v{versions.version} -> v{newer[-1]}: {gap:.2f} s"


async def upgrade_group(
    group: ReplicaGroup, load: CommandLoad, next_build: str
) -> tuple[list[tuple[str, float]], str]:
    _progress(f"{group.label}: starting {len(group.replicas)} replicas")
    group.start()
    for replica in group.replicas:
        await group.wait_answering(replica, START_TIMEOUT_S)
    await group.wait_leader(START_TIMEOUT_S)
    await load.prepare()
    load.start()
    await load.wait_acks(STEADY_ACKS, START_TIMEOUT_S)
    leader, _ = await group.wait_leader(START_TIMEOUT_S)
    order = [replica for replica in group.replicas if replica is not leader] + [leader]
    rolls = []
    for replica in order:
        role = "leader" if replica is leader else "follower"
        gap = await roll(group, replica, load, next_build)
        _progress(f"{group.label}: {replica.name} ({role}) rolled: longest gap {gap:.2f} s")
        rolls.append((role, gap))
    switched = await switch(group, load)
    await load.stop()
    await agreed(group)
    return rolls, switched


async def agreed(group: ReplicaGroup) -> None:
    """Once the load has stopped: every replica at one position with one state hash (a
    follower that diverged would have stopped on the leader's logged hashes already)."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while True:
        reports = await asyncio.gather(*(_status(replica.address) for replica in group.replicas))
        positions = {report.counters["applied_position"] for report in reports if report}
        if all(reports) and len(positions) == 1:
            hashes = {report.info["state_hash"] for report in reports if report}
            if len(hashes) != 1:
                raise UpgradeBenchError(f"{group.label}: replicas at one position differ: {hashes}")
            return
        if time.monotonic() > deadline:
            raise UpgradeBenchError(f"{group.label}: replicas never met at one position")
        await asyncio.sleep(0.05)


async def _status(address: str) -> status_pb2.StatusReport | None:
    try:
        async with mesh_channel(address) as channel:
            report: status_pb2.StatusReport = await status_pb2_grpc.StatusStub(channel).GetStatus(
                status_pb2.StatusRequest(), timeout=2
            )
            return report
    except grpc.aio.AioRpcError:
        return None


async def run_groups(
    arguments: argparse.Namespace,
    plans: Sequence[GroupPlan],
    market: Market,
    *,
    root: Path,
    endpoints: Sequence[str],
    shared_etcd: bool,
    groups: list[ReplicaGroup],
) -> list[GroupUpgrade]:
    if shared_etcd:
        await refuse_used_groups(endpoints, plans)
    results = []
    try:
        for plan in plans:
            group = replica_group(plan, root, endpoints, arguments.lease_ttl_s)
            groups.append(group)
            load: CommandLoad = (
                ShardLoad(endpoints, plan.name, CALLERS)
                if plan.kind == "shard"
                else MatcherLoad(endpoints, plan.name, market, CALLERS)
            )
            try:
                rolls, switched = await upgrade_group(group, load, arguments.next_build)
            finally:
                await load.stop()
                group.stop()
            results.append(GroupUpgrade(group.label, rolls, switched))
    finally:
        if shared_etcd:
            for group in groups:
                group.stop()
            await delete_group_keys(endpoints, plans)
    return results


def table(results: Sequence[GroupUpgrade]) -> list[str]:
    width = max(len("group"), *(len(result.label) for result in results))
    header = f"{'group':<{width}}  {'per replica rolled (s)':<32}{'median':>8}{'max':>8}  switch"
    lines = [header, "-" * len(header)]
    for result in results:
        gaps = [gap for _, gap in result.rolls]
        rolled = " ".join(
            f"{gap:.2f}{'L' if role == 'leader' else ''}" for role, gap in result.rolls
        )
        lines.append(
            f"{result.label:<{width}}  {rolled:<32}{statistics.median(gaps):>8.2f}"
            f"{max(gaps):>8.2f}  {result.switch}"
        )
    return lines


def measure(arguments: argparse.Namespace) -> None:
    load_before = load_average()
    shared_etcd = bool(load_settings(InfraSettings).etcd_endpoints)
    markets_file = load_settings(
        CatalogSetting, overrides={"markets_file": arguments.markets_file}
    ).markets_file
    plans, market = plan_groups(arguments, markets_file, shard_prefix="upgrade")
    if arguments.groups != "both":
        plans = tuple(plan for plan in plans if plan.kind == arguments.groups)
    root = Path(tempfile.mkdtemp(prefix="oms-bench-upgrade-"))
    groups: list[ReplicaGroup] = []
    try:
        with etcd_for_bench(root) as etcd:
            try:
                results = uvloop.run(
                    run_groups(
                        arguments,
                        plans,
                        market,
                        root=root,
                        endpoints=etcd.endpoints,
                        shared_etcd=shared_etcd,
                        groups=groups,
                    )
                )
            finally:
                for group in groups:
                    group.stop()
        where = etcd.description if shared_etcd else "an embedded etcd, fsync on"
        print(
            "a rolling upgrade: each replica SIGTERMed and started on "
            f"{arguments.next_build}, followers first (L: the leader); the longest the "
            f"load went unanswered, in seconds; {REPLICAS} replicas per group, lease "
            f"{arguments.lease_ttl_s} s, {CALLERS} callers each; {where}"
        )
        for line in table(results):
            print(line)
        print(machine_line(load_before), flush=True)
    finally:
        for group in groups:
            group.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(arguments: argparse.Namespace) -> int:
    return run_measured("upgrade", measure, arguments)
