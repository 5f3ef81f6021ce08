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

import grpc

from protos.oms.v1 import replica_pb2
from services.clients.channels import mesh_channel
from services.mesh.mesh_locator import MeshNotFoundError, add_location_arguments, located_mesh
from services.mesh.status_rows import ProcessTarget
from services.mesh.status_targets import REPLICATED_KINDS

TIMEOUT_S = 5.0
ACTIVATE_TIMEOUT_S = 15.0
SERVICE = "/oms.v1.ReplicaUpgrades/"


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


async def versions_of(address: str) -> replica_pb2.ReplicaVersions | str:
    """A replica's answer, or why there is none."""
    try:
        async with mesh_channel(address) as channel:
            call = channel.unary_unary(
                SERVICE + "GetVersions",
                request_serializer=replica_pb2.VersionsQuery.SerializeToString,
                response_deserializer=replica_pb2.ReplicaVersions.FromString,
            )
            answer: replica_pb2.ReplicaVersions = await call(
                replica_pb2.VersionsQuery(), timeout=TIMEOUT_S
            )
            return answer
    except grpc.aio.AioRpcError as error:
        return f"no answer: {error.code().name} {error.details() or ''}".strip()
    except (OSError, ValueError) as error:
        return f"no answer: {error}"


def _groups(targets: Sequence[ProcessTarget]) -> dict[str, list[ProcessTarget]]:
    groups: dict[str, list[ProcessTarget]] = {}
    for target in targets:
        if target.service in REPLICATED_KINDS:
            groups.setdefault(f"{target.service}/{target.group}", []).append(target)
    return groups


def _versions(values: Sequence[int]) -> str:
    return ",".join(str(value) for value in sorted(values)) or "1"


async def _group_report(name: str, targets: list[ProcessTarget]) -> dict[str, Any]:
    answers = await asyncio.gather(*(versions_of(target.address) for target in targets))
    replicas: list[dict[str, Any]] = []
    common: set[int] | None = None
    in_force = 0
    for target, answer in zip(targets, answers, strict=True):
        if isinstance(answer, str):
            replicas.append({"address": target.address, "failure": answer})
            common = set()  # a replica that does not answer cannot say what it runs
            continue
        implemented = sorted(answer.implemented_versions)
        common = set(implemented) if common is None else common & set(implemented)
        in_force = max(in_force, answer.version)
        replicas.append(
            {
                "address": target.address,
                "role": "leader" if answer.leading else "follower",
                "version": answer.version,
                "implemented_versions": implemented,
                "applied_position": answer.applied_position,
            }
        )
    ready = sorted(v for v in (common or set()) if v > in_force)
    return {"group": name, "version": in_force, "can_activate": ready, "replicas": replicas}


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
            groups = _groups(await mesh.find())
    except MeshNotFoundError as error:
        print(error, file=sys.stderr)
        return 2
    reports = [await _group_report(name, targets) for name, targets in sorted(groups.items())]
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
            groups = _groups(await mesh.find())
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
    request = replica_pb2.ActivateVersionRequest(
        version=arguments.version, expected_replicas=expected
    )
    why = "no replica answered"
    for target in targets:  # the leader answers; a follower names it
        answer = await _ask_activation(target.address, request)
        if isinstance(answer, replica_pb2.ActivateVersionResponse):
            if answer.already_in_force:
                print(f"{name}: version {answer.version} is already in force")
            else:
                print(f"{name}: version {answer.version} in force from position {answer.position}")
            return 0
        refused, why = answer
        if refused:
            print(f"{command}: {name}: refused: {why}")
            return 1
    print(f"{command}: {name}: {why}")
    return 1


async def _ask_activation(
    address: str, request: replica_pb2.ActivateVersionRequest
) -> replica_pb2.ActivateVersionResponse | tuple[bool, str]:
    """The leader's answer, or (refused by the leader, why)."""
    try:
        async with mesh_channel(address) as channel:
            call = channel.unary_unary(
                SERVICE + "ActivateVersion",
                request_serializer=replica_pb2.ActivateVersionRequest.SerializeToString,
                response_deserializer=replica_pb2.ActivateVersionResponse.FromString,
            )
            answer: replica_pb2.ActivateVersionResponse = await call(
                request, timeout=ACTIVATE_TIMEOUT_S
            )
            return answer
    except grpc.aio.AioRpcError as error:
        details = error.details() or error.code().name
        not_leader = details.startswith("not the group's leader")
        return (error.code() == grpc.StatusCode.FAILED_PRECONDITION and not not_leader, details)
    except (OSError, ValueError) as error:
        return (False, str(error))
