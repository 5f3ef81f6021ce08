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
Exit status: 0 done (or already in force), 1 refused or unanswered, 2 bad usage or
no mesh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

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


def _report(group: GroupVersions) -> dict[str, Any]:
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
        "version": group.version,
        "can_activate": group.can_activate,
        "replicas": replicas,
    }


def _versions(values: Sequence[int]) -> str:
    return ",".join(str(value) for value in sorted(values)) or "1"


def _print_group(report: dict[str, Any]) -> None:
    ready = report["can_activate"]
    can = f"can activate {_versions(ready)}" if ready else "nothing newer every replica runs"
    print(f"{report['group']}: version {report['version']} in force; {can}")
    for replica in report["replicas"]:
        if "failure" in replica:
            print(f"  {replica['address']}: {replica['failure']}")
            continue
        print(
            f"  {replica['address']} {replica['role']}: at {replica['version']},"
            f" implements {_versions(replica['implemented_versions'])},"
            f" applied {replica['applied_position']}"
        )


def run_status(arguments: argparse.Namespace) -> int:
    return asyncio.run(_status(arguments))


async def _status(arguments: argparse.Namespace) -> int:
    try:
        async with located_mesh(arguments, "oms upgrade status") as mesh:
            groups = groups_of(await mesh.find())
    except MeshNotFoundError as error:
        print(error, file=sys.stderr)
        return 2
    reports = [
        _report(await group_versions(name, targets)) for name, targets in sorted(groups.items())
    ]
    if arguments.json:
        print(json.dumps(reports))
    else:
        print(mesh.title)
        for report in reports:
            _print_group(report)
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
