"""Which processes `oms status` asks: from a state folder's `mesh.json`, or from etcd.

A local mesh (`oms up`) names every process in its record, followers and standbys
included. A deployed mesh is found in etcd under `/oms/v1/<mesh id>/`
(`services/coordination/group_keys.py`): each replicated group's live replicas
(`<kind>/<name>/replicas/<address>`, kept under each replica's lease) and each
leader-only role's holder (`<role>/<shard>/leader`). Etcd names only the holder of a
leader-only role, so a standby persister, bridge or reconciler, and the gateways
(which keep nothing in etcd), appear only when given (`--gateway`).
"""

from __future__ import annotations

from services.coordination.etcd_channel import prefix_end
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import mesh_prefix
from services.mesh.mesh_record import MeshRecord
from services.mesh.status_rows import ProcessTarget

REPLICATED_KINDS = ("shard", "matcher")
LEADER_ONLY_ROLES = ("persister", "bridge", "reconciler")


def targets_of_record(record: MeshRecord) -> list[ProcessTarget]:
    """Every process `oms up` started for this record, grouped by service."""
    targets = [ProcessTarget("gateway", "", 0, record.gateway)]
    if record.market_data:
        targets.append(ProcessTarget("marketdata", "", 0, record.market_data))
    clusters = record.clusters()
    for cluster in clusters:
        targets += [
            ProcessTarget("shard", cluster.cluster_id, index, address)
            for index, address in enumerate(cluster.shard_replicas())
        ]
    for group in record.matchers:
        targets += [
            ProcessTarget("matcher", group, index, address)
            for index, address in enumerate(record.matcher_replicas(group))
        ]
    for role in LEADER_ONLY_ROLES:
        for cluster in clusters:
            targets += [
                ProcessTarget(role, cluster.cluster_id, index, address)
                for index, address in enumerate(cluster.role_addresses(role))
            ]
    return targets


async def targets_in_etcd(
    session: EtcdSession, mesh_id: str, gateways: list[str]
) -> list[ProcessTarget]:
    """The mesh's processes as etcd knows them, plus the gateways given."""
    root = mesh_prefix(mesh_id)
    targets = [
        ProcessTarget("gateway", "", index, address) for index, address in enumerate(gateways)
    ]
    for kind in REPLICATED_KINDS:
        for name in await _names(session, root + f"{kind}/".encode()):
            replicas = root + f"{kind}/{name}/replicas/".encode()
            entries = await session.range(replicas, prefix_end(replicas), keys_only=True)
            addresses = sorted(entry.key[len(replicas) :].decode() for entry in entries)
            targets += [
                ProcessTarget(kind, name, index, address) for index, address in enumerate(addresses)
            ]
    for role in LEADER_ONLY_ROLES:
        for name in await _names(session, root + f"{role}/".encode()):
            holder = await session.get(root + f"{role}/{name}/leader".encode())
            if holder is not None and holder.value:
                targets.append(ProcessTarget(role, name, 0, holder.value.decode()))
    return targets


async def _names(session: EtcdSession, prefix: bytes) -> list[str]:
    """The group names under `prefix` (`<name>/...`), one range request each: each
    request asks for the first key past the previous name's keys, so a group's log
    (thousands of keys) is never listed."""
    names: list[str] = []
    start, end = prefix, prefix_end(prefix)
    while True:
        found = await session.range(start, end, limit=1, keys_only=True)
        if not found:
            return names
        name = found[0].key[len(prefix) :].split(b"/", 1)[0].decode()
        names.append(name)
        start = prefix_end(prefix + name.encode() + b"/")
