"""`oms upgrade`: the state-machine versions of every replicated group, and the switch.

    oms upgrade status                       each group's version in force, and what
                                             each replica's build implements
    oms upgrade activate GROUP VERSION       the group's leader logs the switch

GROUP is `shard/<cluster>` or `matcher/<group>` (or the bare name when only one group
has it). `activate` asks the group's leader (`oms.v1.ReplicaUpgrades`,
`services/runtime/upgrades.py`), which refuses while a live replica's build does not
implement VERSION or fewer replicas are registered than `--replicas` (default: as
many as the mesh names for the group: a replica that is down cannot say what it
runs). The mesh is found as `oms status` finds it (`--state-dir`, `--etcd`).

A group of one replica on a file log (`oms up` without `--replicas`) shows its version
and its build's too, and says that the switch is for replicated groups (`oms up
--replicas 3`); its replica refuses `activate`, changing nothing. Such groups keep
nothing in etcd, so `--etcd` finds none of them (it says so).
Exit status: 0 done (or already in force), 1 refused or unanswered, 2 bad usage or
no mesh (or no replicated group in etcd).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from services.coordination.errors import CoordinationUnavailable
from services.mesh.mesh_locator import MeshNotFoundError, add_location_arguments, located_mesh
from services.mesh.version_switch import (
    GroupVersions,
    NoLeaderError,
    SwitchRefusedError,
    activate,
    group_versions,
    groups_of,
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "upgrade", help="state-machine versions of the replicated groups, and the switch"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    status = verbs.add_parser("status", help="each group's version and its replicas' builds")
    add_location_arguments(status)
    status.add_argument("--json", action="store_true", help="the groups as JSON")
    status.set_defaults(handler=run_status)
    activate = verbs.add_parser("activate", help="switch a group to a newer version")
    add_location_arguments(activate)
    activate.add_argument("group", help="shard/<cluster> or matcher/<group>")
    activate.add_argument("version", type=int)
    activate.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="refuse unless this many replicas are registered (default: the mesh's count)",
    )
    activate.set_defaults(handler=run_activate)


def group_report(group: GroupVersions) -> dict[str, Any]:
    replicas: list[dict[str, Any]] = []
    for replica in group.replicas:
        if replica.failure:
            replicas.append({"address": replica.address, "failure": replica.failure})
            continue
        replicas.append(
            {
                "address": replica.address,
                "role": "leader" if replica.leading else "follower",
                "version": replica.version,
                "implemented_versions": list(replica.implemented),
                "applied_position": replica.applied_position,
            }
        )
    return {
        "group": group.name,
        "version": group.version if group.answered else None,
        "replicated": group.replicated,
        "can_activate": group.can_activate if group.replicated else [],
        "replicas": replicas,
    }


def _versions(values: Sequence[int]) -> str:
    return ",".join(str(value) for value in sorted(values)) or "1"


ONE_REPLICA_NOTE = (
    "A group of one replica (file log) stays at the version in force: a switch (`oms upgrade"
    " activate`) is for replicated groups, rolled one replica at a time;"
    " `oms up --replicas 3` (in a new state folder) runs them."
)


def group_line(report: dict[str, Any]) -> str:
    """The group's summary line: its version in force, and what it can switch to."""
    name = report["group"]
    if report["version"] is None:
        return f"{name}: no replica answered"
    if not report["replicated"]:
        return f"{name}: version {report['version']} in force; one replica (file log)"
    ready = report["can_activate"]
    can = f"can activate {_versions(ready)}" if ready else "nothing newer every replica runs"
    return f"{name}: version {report['version']} in force; {can}"


def replica_line(replica: dict[str, Any]) -> str:
    if "failure" in replica:
        return f"  {replica['address']}: {replica['failure']}"
    return (
        f"  {replica['address']} {replica['role']}: at {replica['version']},"
        f" implements {_versions(replica['implemented_versions'])},"
        f" applied {replica['applied_position']}"
    )


def status_lines(title: str, reports: Sequence[dict[str, Any]]) -> list[str]:
    """What `oms upgrade status` prints for these groups."""
    lines = [title]
    for report in reports:
        lines.append(group_line(report))
        lines += [replica_line(replica) for replica in report["replicas"]]
    if any(not report["replicated"] for report in reports):
        lines.append(ONE_REPLICA_NOTE)
    return lines


def run_status(arguments: argparse.Namespace) -> int:
    return asyncio.run(_status(arguments))


async def _status(arguments: argparse.Namespace) -> int:
    command = "oms upgrade status"
    try:
        async with located_mesh(arguments, command) as mesh:
            groups = groups_of(await mesh.find())
    except MeshNotFoundError as error:
        print(error, file=sys.stderr)
        return 2
    except CoordinationUnavailable as error:
        print(f"{command}: etcd did not answer: {error}", file=sys.stderr)
        return 1
    if not groups:
        print(f"{command}: {mesh.title}: {mesh.nothing_found}", file=sys.stderr)
        if arguments.json:
            print(json.dumps([]))
        return 2
    reports = [
        group_report(await group_versions(name, targets))
        for name, targets in sorted(groups.items())
    ]
    if arguments.json:
        print(json.dumps(reports))
    else:
        print("\n".join(status_lines(mesh.title, reports)))
    answered = all("failure" not in r for report in reports for r in report["replicas"])
    return 0 if answered else 1


def run_activate(arguments: argparse.Namespace) -> int:
    return asyncio.run(_activate(arguments))


async def _activate(arguments: argparse.Namespace) -> int:
    command = "oms upgrade activate"
    try:
        async with located_mesh(arguments, command) as mesh:
            groups = groups_of(await mesh.find())
    except MeshNotFoundError as error:
        print(error, file=sys.stderr)
        return 2
    except CoordinationUnavailable as error:
        print(f"{command}: etcd did not answer: {error}", file=sys.stderr)
        return 1
    if not groups:
        print(f"{command}: {mesh.title}: {mesh.nothing_found}", file=sys.stderr)
        return 2
    chosen = [name for name in groups if arguments.group in (name, name.split("/", 1)[1])]
    if len(chosen) != 1:
        known = ", ".join(sorted(groups)) or "none"
        print(f"{command}: {arguments.group!r} names no single group (groups: {known})")
        return 2
    name = chosen[0]
    targets = groups[name]
    expected = len(targets) if arguments.replicas is None else arguments.replicas
    try:
        answer = await activate(targets, arguments.version, expected)
    except SwitchRefusedError as error:
        print(f"{command}: {name}: refused: {error}")
        return 1
    except NoLeaderError as error:
        print(f"{command}: {name}: {error}")
        return 1
    if answer.already_in_force:
        print(f"{name}: version {answer.version} is already in force")
    else:
        print(f"{name}: version {answer.version} in force from position {answer.position}")
    return 0
