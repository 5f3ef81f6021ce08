"""An OmsCluster's `spec.stateMachineVersion`: every replicated group switched to it once
every live replica of the group runs a build that implements it.

Image changes roll the StatefulSets pod by pod (Kubernetes does that); the version
the groups decide under is a separate step, this one. At each reconcile, for each
shard cluster and matcher group with live replicas in etcd (their replica-registry
keys), as `oms upgrade activate` would: a group already at the version (or past it)
is left as it is; a group whose every replica implements it is switched through its
leader (`services/runtime/upgrades.py`, which checks the registry again); a group
with a replica that does not (a pod not rolled yet) waits, and the reconcile is
retried (`VersionNotReadyError`). The version is never lowered.
"""

from __future__ import annotations

from services.coordination.etcd_session import EtcdSession
from services.mesh.status_targets import targets_in_etcd
from services.mesh.version_switch import activate, group_versions, groups_of


class VersionNotReadyError(Exception):
    """A group has a replica whose build does not implement the version yet."""


class VersionRollout:
    def __init__(self, session: EtcdSession, mesh_id: str) -> None:
        self.session = session
        self.mesh_id = mesh_id

    async def ensure(self, version: int) -> dict[str, int]:
        """Each group's version in force once switched where it can be ("shard/s1": 2)."""
        groups = groups_of(await targets_in_etcd(self.session, self.mesh_id, []))
        in_force: dict[str, int] = {}
        waiting: list[str] = []
        for name, targets in sorted(groups.items()):
            versions = await group_versions(name, targets)
            lacking = versions.lacking(version)
            if versions.version >= version or lacking:
                in_force[name] = versions.version
                if versions.version < version:
                    waiting.append(f"{name}: {'; '.join(lacking)}")
                continue
            answer = await activate(targets, version, len(targets))
            in_force[name] = answer.version
        if waiting:
            raise VersionNotReadyError(
                f"state-machine version {version} waits for replicas that do not implement"
                f" it: {' | '.join(waiting)}"
            )
        return in_force
