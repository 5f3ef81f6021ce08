"""`oms.v1.ReplicaUpgrades`: a group's state-machine versions, and the switch to a newer one.

Every replica answers `GetVersions`: the version its log is at (in force as of its
applied position), the versions its build implements, and the group's live replicas
with theirs, as the replica registry has them. The leader alone answers
`ActivateVersion(n)`: it logs a VERSION entry (`Sequencer.propose_version`), and every
replica decides under `n` from that position on. It refuses, changing nothing, while
any live replica of the group does not implement `n` (its build would stop at the
entry), while fewer replicas are registered than the caller says the group has (one
that is down cannot say what it runs), or when its own build does not implement `n`.
An `n` already in force is answered as such: a retry logs nothing.

A replica that was down during the switch and comes back on a build without `n`
stops at the entry (`UnsupportedVersionError`, exit 3) before applying it.

A group of one replica on a file log (`RuntimeHost`: `oms up` without `--replicas`)
answers the same service through `OneReplicaUpgrades`: `GetVersions` as its own leader
with no members (it has no replica registry), so `oms upgrade status` shows what it
runs; `ActivateVersion` is refused, changing nothing: the switch belongs to replicated
groups, rolled one replica at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import structlog

from protos.oms.v1 import replica_pb2
from services.coordination.errors import CoordinationError
from services.runtime.core.replica import describe_versions
from services.runtime.errors import IngressFullError

if TYPE_CHECKING:
    from services.runtime.hosting import RuntimeHost
    from services.runtime.replicated_host import ReplicatedHost

log = structlog.get_logger(__name__)
SERVICE_NAME = "oms.v1.ReplicaUpgrades"


class ReplicaUpgrades:
    def __init__(self, host: ReplicatedHost[Any]) -> None:
        self.host = host

    async def get_versions(
        self, request: replica_pb2.VersionsQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> replica_pb2.ReplicaVersions:
        host = self.host
        replica = host.node.replica
        answer = replica_pb2.ReplicaVersions(
            address=host.replication.advertise,
            leading=host.serving_as_leader,
            leader=host.leader_address,
            version=replica.machine.version,
            implemented_versions=sorted(replica.machine.implemented_versions),
            applied_position=replica.applied_position,
        )
        if host.registry is not None:
            try:
                members = await host.registry.members()
            except CoordinationError as error:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd: {error}")
            for member in members:
                answer.members.add(
                    address=member.address, implemented_versions=member.implemented_versions
                )
        return answer

    async def activate_version(
        self,
        request: replica_pb2.ActivateVersionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> replica_pb2.ActivateVersionResponse:
        host = self.host
        version = request.version
        if not host.serving_as_leader or not host.node.writing or host.registry is None:
            leader = host.leader_address or "unknown"
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"not the group's leader (leader: {leader})"
            )
        machine = host.node.replica.machine
        in_force = machine.version
        if version <= in_force:
            return replica_pb2.ActivateVersionResponse(
                version=in_force, position=0, already_in_force=True
            )
        refusal = await self._refusal(version, request.expected_replicas)
        if refusal:
            log.warning("upgrade.refused", version=version, why=refusal)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        position = await host.node.sequencer.propose_version(version)
        log.warning("upgrade.activated", version=version, position=position, was=in_force)
        return replica_pb2.ActivateVersionResponse(version=version, position=position)

    async def _refusal(self, version: int, expected_replicas: int) -> str:
        """Why the group cannot switch to `version` now, or ''."""
        host = self.host
        implemented = host.node.replica.machine.implemented_versions
        if version not in implemented:
            return (
                f"this leader's build implements versions {describe_versions(implemented)},"
                f" not {version}"
            )
        assert host.registry is not None
        try:
            members = await host.registry.members()
        except CoordinationError as error:
            return f"the replica registry could not be read: {error}"
        if len(members) < expected_replicas:
            return (
                f"{len(members)} of {expected_replicas} replicas registered"
                f" ({', '.join(m.address for m in members)}): a replica that is down cannot"
                " say what it implements"
            )
        lacking = [m for m in members if version not in m.implemented_versions]
        if lacking:
            named = "; ".join(
                f"{m.address} implements {describe_versions(frozenset(m.implemented_versions))}"
                for m in lacking
            )
            return f"not every replica implements version {version}: {named}"
        return ""

    def register(self, server: grpc.aio.Server) -> None:
        _register(server, self.get_versions, self.activate_version)


# Why a group of one replica does not switch versions (`OneReplicaUpgrades`).
ONE_REPLICA_REFUSAL = (
    "this group runs one replica on a file log: a state-machine version switch is for"
    " replicated groups, rolled one replica at a time (a mesh started with"
    " `oms up --replicas 3`)"
)


class OneReplicaUpgrades:
    """`oms.v1.ReplicaUpgrades` on a group of one replica on a file log: its versions,
    read from its applied state; the switch refused (it changes nothing)."""

    def __init__(self, host: RuntimeHost[Any]) -> None:
        self.host = host

    async def get_versions(
        self, request: replica_pb2.VersionsQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> replica_pb2.ReplicaVersions:
        host = self.host
        replica = host.node.replica
        return replica_pb2.ReplicaVersions(
            address=host.listen_address,
            leading=True,  # the one writer of its log
            leader=host.listen_address,
            version=replica.machine.version,
            implemented_versions=sorted(replica.machine.implemented_versions),
            applied_position=replica.applied_position,
        )  # no members: a group of one keeps no replica registry

    async def activate_version(
        self,
        request: replica_pb2.ActivateVersionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> replica_pb2.ActivateVersionResponse:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, ONE_REPLICA_REFUSAL)
        raise AssertionError("abort raises")  # pragma: no cover

    def register(self, server: grpc.aio.Server) -> None:
        _register(server, self.get_versions, self.activate_version)


def _register(server: grpc.aio.Server, get_versions: Any, activate_version: Any) -> None:
    handlers = {
        "GetVersions": grpc.unary_unary_rpc_method_handler(
            get_versions,
            request_deserializer=replica_pb2.VersionsQuery.FromString,
            response_serializer=replica_pb2.ReplicaVersions.SerializeToString,
        ),
        "ActivateVersion": grpc.unary_unary_rpc_method_handler(
            activate_version,
            request_deserializer=replica_pb2.ActivateVersionRequest.FromString,
            response_serializer=replica_pb2.ActivateVersionResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


async def start_new_log_at(host: RuntimeHost[Any], version: int) -> None:
    """On a new group's log (the caller saw it empty when the host started, before the
    sequencer logged anything), the writer logs a VERSION entry for `version` (0: the
    newest its build implements), so a new group decides under today's rules from its
    start instead of under version 1 until someone switches it. Logged like any switch:
    every replica, and every replay, switches at the same position; the timer entries
    and commands logged before it are decided under the version before, as they were.
    A group whose log held anything at the start is switched by `oms upgrade activate`
    only."""
    machine = host.node.replica.machine
    wanted = version or max(machine.implemented_versions)
    if wanted <= machine.version:
        return
    try:
        position = await host.node.sequencer.propose_version(wanted)
    except (ValueError, IngressFullError) as error:  # not implemented; or stopping
        log.error("upgrade.new_log_version_refused", version=wanted, error=str(error))
        return
    log.info("upgrade.new_log_version", version=wanted, position=position)
