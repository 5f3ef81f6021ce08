"""Asking a mesh's replicated groups about their state-machine versions, and switching one.

What `oms upgrade` (`upgrade_command.py`) and the OmsCluster operator
(`k8s/operator/mesh_reconciler.py`) share: each replica's `oms.v1.ReplicaUpgrades`
answer, a group's summary (the version in force, the versions every replica
implements), and the switch asked of whichever replica leads (a follower answers
FAILED_PRECONDITION naming the leader; the leader refuses, changing nothing, unless
every registered replica implements the version: `services/runtime/upgrades.py`).
A group of one replica on a file log answers too, naming no members (it keeps no
replica registry): `replicated` is False, and its switch is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from protos.oms.v1 import replica_pb2
from services.clients.call_failures import call_failure
from services.clients.channels import mesh_channel
from services.mesh.status_rows import ProcessTarget
from services.mesh.status_targets import REPLICATED_KINDS

TIMEOUT_S = 5.0
ACTIVATE_TIMEOUT_S = 15.0
SERVICE = "/oms.v1.ReplicaUpgrades/"
NOT_LEADER = "not the group's leader"


@dataclass(frozen=True, slots=True)
class ReplicaVersions:
    address: str
    failure: str = ""  # why it did not answer; the rest is empty then
    leading: bool = False
    version: int = 0
    implemented: tuple[int, ...] = ()
    applied_position: int = 0
    replicated: bool = True  # False: a group of one replica on a file log


@dataclass(frozen=True, slots=True)
class GroupVersions:
    name: str  # "shard/s1", "matcher/g1"
    version: int  # in force (the highest a replica reports)
    replicas: list[ReplicaVersions] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        """Whether any replica answered."""
        return any(not r.failure for r in self.replicas)

    @property
    def replicated(self) -> bool:
        """A replicated group (logs in etcd, a leader elected), not one replica on a file
        log; as its replicas say (True when none answered: nothing says otherwise)."""
        return all(r.replicated for r in self.replicas if not r.failure)

    @property
    def everyone_implements(self) -> frozenset[int]:
        """The versions every replica implements (none when one does not answer)."""
        sets = [set(r.implemented) for r in self.replicas if not r.failure]
        if not sets or len(sets) < len(self.replicas):
            return frozenset()
        return frozenset(set.intersection(*sets))

    @property
    def can_activate(self) -> list[int]:
        return sorted(v for v in self.everyone_implements if v > self.version)

    def lacking(self, version: int) -> list[str]:
        """The replicas that cannot say they implement `version`, and why."""
        return [
            f"{r.address} {r.failure}"
            if r.failure
            else f"{r.address} implements {','.join(map(str, r.implemented))}"
            for r in self.replicas
            if r.failure or version not in r.implemented
        ]


class SwitchRefusedError(Exception):
    """The group's leader refused the switch (the message is its why)."""


class NoLeaderError(Exception):
    """No replica of the group led when asked."""


def groups_of(targets: Sequence[ProcessTarget]) -> dict[str, list[ProcessTarget]]:
    """The replicated groups among `targets`, by "kind/name"."""
    groups: dict[str, list[ProcessTarget]] = {}
    for target in targets:
        if target.service in REPLICATED_KINDS:
            groups.setdefault(f"{target.service}/{target.group}", []).append(target)
    return groups


async def replica_versions(address: str) -> ReplicaVersions:
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
    except grpc.aio.AioRpcError as error:
        return ReplicaVersions(address, failure=call_failure(error, TIMEOUT_S))
    except (OSError, ValueError) as error:
        return ReplicaVersions(address, failure=f"not reachable: {error}")
    return ReplicaVersions(
        address,
        leading=answer.leading,
        version=answer.version,
        implemented=tuple(sorted(answer.implemented_versions)),
        applied_position=answer.applied_position,
        replicated=len(answer.members) > 0,
    )


async def group_versions(name: str, targets: Sequence[ProcessTarget]) -> GroupVersions:
    answers = await asyncio.gather(*(replica_versions(t.address) for t in targets))
    version = max((answer.version for answer in answers), default=0)
    return GroupVersions(name, version, list(answers))


async def activate(
    targets: Sequence[ProcessTarget], version: int, expected_replicas: int
) -> replica_pb2.ActivateVersionResponse:
    """Ask each replica until the leader answers; `SwitchRefusedError` if it refuses."""
    request = replica_pb2.ActivateVersionRequest(
        version=version, expected_replicas=expected_replicas
    )
    why = "no replica answered"
    for target in targets:
        try:
            async with mesh_channel(target.address) as channel:
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
            why = error.details() or call_failure(error, ACTIVATE_TIMEOUT_S)
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION and not why.startswith(
                NOT_LEADER
            ):
                raise SwitchRefusedError(why) from error
            why = f"{target.address}: {call_failure(error, ACTIVATE_TIMEOUT_S)}"
        except (OSError, ValueError) as error:
            why = str(error)
    raise NoLeaderError(why)
