"""Where the local mesh listens and its admin credentials: `state_dir/mesh.json`.

`oms up` writes it before starting the services (ports chosen free, reused on the
next `oms up` while still free), and `oms demo` / `oms client` read it to find the
gateway. The admin secret is generated once per state folder; the file is 0600.

With `--replicas 3` the shard and every matcher group run three replicas each
over logs in etcd; a state folder keeps the replica count it was made with (a
file log and an etcd log of the same shard would disagree on every position the
persister has recorded), so a change of count asks for a new folder.

Each state folder names its mesh once (`mesh_id`, `mesh-` and 8 random hex digits):
every service gets it as `OMS_MESH_ID`, so its keys in etcd are its own even on an
etcd shared with other meshes, and the persister claims the database for it
(`persister/mesh_identity.py`).

With `--shards N` the mesh has N user-shard clusters, `s1` (the fields `shard`,
`persister`, `bridge`, `reconciler`) and `s2`..`sN` (`other_clusters`), each with its
own shard (and followers), persister, bridge and reconciler. A folder keeps its
number of clusters too: a mesh grows or shrinks by scaling waves (`omsctl`), which
move users in the routing document, not by starting it with another number.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from services.infra.ports import LOOPBACK, free_port, port_is_free

RECORD_NAME = "mesh.json"
SHARD_ID = "s1"
MAX_SHARDS = 16


class MeshRecordError(ValueError):
    """The state folder was made for another shape of mesh."""


@dataclass(frozen=True)
class ClusterRecord:
    """One user-shard cluster's addresses."""

    cluster_id: str
    shard: str
    persister: str
    bridge: str
    reconciler: str
    shard_followers: list[str] = field(default_factory=list)
    # Co-located and replicated: each follower replica's persister, bridge and reconciler.
    role_followers: list[list[str]] = field(default_factory=list)

    def shard_replicas(self) -> list[str]:
        return [self.shard, *self.shard_followers]

    def roles_of_replica(self, index: int) -> tuple[str, str, str]:
        """The persister, bridge and reconciler addresses beside shard replica `index`."""
        if index == 0:
            return self.persister, self.bridge, self.reconciler
        persister, bridge, reconciler = self.role_followers[index - 1]
        return persister, bridge, reconciler

    def role_addresses(self, role: str) -> list[str]:
        """Every address of `role` (persister, bridge or reconciler) in the cluster."""
        at = ("persister", "bridge", "reconciler").index(role)
        return [getattr(self, role), *(roles[at] for roles in self.role_followers)]


@dataclass(frozen=True)
class MeshRecord:
    gateway: str
    shard: str
    persister: str
    bridge: str
    reconciler: str
    matchers: dict[str, str] = field(default_factory=dict)  # group -> address
    admin_api_key: str = ""
    admin_api_secret: str = ""
    shard_id: str = SHARD_ID
    replicas: int = 1
    # Replicas beyond the first (`shard`, `matchers[group]`), when replicas > 1.
    shard_followers: list[str] = field(default_factory=list)
    matcher_followers: dict[str, list[str]] = field(default_factory=dict)
    mesh_id: str = ""  # "" only in a record written before mesh ids existed
    shards: int = 1
    other_clusters: list[ClusterRecord] = field(default_factory=list)  # s2..sN
    # Each service's Prometheus endpoint (`GET /metrics`), by the name `oms up` gives it.
    metrics: dict[str, str] = field(default_factory=dict)
    # The persister's master key (base64): it seals the API keys' secrets in PostgreSQL.
    # Kept here, 0600, beside the admin secret; "" in a record made before it existed.
    master_key: str = ""
    # Whether its links are TLS, with the development authority under state_dir/tls
    # (`services/transport/development.py`); False without `oms up --plaintext`'s
    # opposite, and in a record written before TLS existed.
    tls: bool = False
    # Each shard replica runs its cluster's persister, bridge and reconciler in its own
    # process (`oms up --colocate`, `oms shard --colocate`); the addresses stay as above,
    # and each follower replica's roles have their own (`role_followers`).
    colocated: bool = False
    role_followers: list[list[str]] = field(default_factory=list)
    # The market-data service's public address; "" in a record made before it existed.
    market_data: str = ""

    @property
    def replicated(self) -> bool:
        return self.replicas > 1

    @property
    def sharded(self) -> bool:
        """More than one cluster: the gateway routes by the routing document in etcd."""
        return self.shards > 1

    def clusters(self) -> list[ClusterRecord]:
        first = ClusterRecord(
            self.shard_id,
            self.shard,
            self.persister,
            self.bridge,
            self.reconciler,
            list(self.shard_followers),
            [list(roles) for roles in self.role_followers],
        )
        return [first, *self.other_clusters]

    def shard_replicas(self) -> list[str]:
        return [self.shard, *self.shard_followers]

    def matcher_replicas(self, group: str) -> list[str]:
        return [self.matchers[group], *self.matcher_followers.get(group, [])]

    def matcher_setting(self) -> str:
        return ",".join(f"{group}={address}" for group, address in self.matchers.items())


def read_mesh_record(state_dir: Path) -> MeshRecord | None:
    path = state_dir / RECORD_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    data["other_clusters"] = [ClusterRecord(**c) for c in data.get("other_clusters", [])]
    return MeshRecord(**data)


def prepare_mesh_record(
    state_dir: Path,
    groups: list[str],
    *,
    replicas: int = 1,
    shards: int = 1,
    colocated: bool = False,
) -> MeshRecord:
    """The previous record's ports where still free, new free ports otherwise."""
    if replicas < 1:
        raise MeshRecordError("a group runs at least one replica")

    if not 1 <= shards <= MAX_SHARDS:
        raise MeshRecordError(f"a local mesh runs 1 to {MAX_SHARDS} shard clusters")
    previous = read_mesh_record(state_dir)
    if previous is not None and previous.shards != shards:
        raise MeshRecordError(
            f"{state_dir} holds a mesh of {previous.shards} shard cluster(s), not {shards}: "
            "its routing document and logs belong to that one; scale it with omsctl, or "
            "choose another --state-dir"
        )
    if previous is not None and previous.replicas != replicas:
        raise MeshRecordError(
            f"{state_dir} holds a mesh of {previous.replicas} replica(s) per group, not "
            f"{replicas}: its logs and the database's positions belong to that one; "
            "choose another --state-dir"
        )
    if previous is not None and previous.replicated and not previous.mesh_id:
        raise MeshRecordError(
            f"{state_dir} holds a replicated mesh made before meshes had ids: its logs in "
            "etcd are under keys no service reads now; choose another --state-dir"
        )

    address = reuse_or_new_address

    old_matchers = previous.matchers if previous else {}
    old_shard_followers = previous.shard_followers if previous else []
    old_matcher_followers = previous.matcher_followers if previous else {}

    def followers(old: list[str]) -> list[str]:
        return [address(old[i] if i < len(old) else None) for i in range(replicas - 1)]

    def role_followers(old: list[list[str]]) -> list[list[str]]:
        if not colocated:
            return []
        return [
            [address(old[i][at] if i < len(old) else None) for at in range(3)]
            for i in range(replicas - 1)
        ]

    old_clusters = {c.cluster_id: c for c in previous.other_clusters} if previous else {}

    def cluster(index: int) -> ClusterRecord:
        cluster_id = f"s{index}"
        old = old_clusters.get(cluster_id)
        return ClusterRecord(
            cluster_id,
            shard=address(old.shard if old else None),
            persister=address(old.persister if old else None),
            bridge=address(old.bridge if old else None),
            reconciler=address(old.reconciler if old else None),
            shard_followers=followers(old.shard_followers if old else []),
            role_followers=role_followers(old.role_followers if old else []),
        )

    record = MeshRecord(
        gateway=address(previous.gateway if previous else None),
        shard=address(previous.shard if previous else None),
        persister=address(previous.persister if previous else None),
        bridge=address(previous.bridge if previous else None),
        reconciler=address(previous.reconciler if previous else None),
        matchers={group: address(old_matchers.get(group)) for group in groups},
        admin_api_key=previous.admin_api_key if previous else "admin-" + secrets.token_hex(4),
        admin_api_secret=previous.admin_api_secret if previous else secrets.token_hex(32),
        replicas=replicas,
        mesh_id=(previous.mesh_id if previous else "") or "mesh-" + secrets.token_hex(4),
        shard_followers=followers(old_shard_followers),
        matcher_followers={
            group: followers(old_matcher_followers.get(group, [])) for group in groups
        }
        if replicas > 1
        else {},
        shards=shards,
        other_clusters=[cluster(index) for index in range(2, shards + 1)],
        metrics=dict(previous.metrics) if previous else {},
        # Kept for the folder's life: a new one would not open the secrets sealed before.
        master_key=(previous.master_key if previous else "")
        or base64.b64encode(secrets.token_bytes(32)).decode(),
        colocated=colocated,
        role_followers=role_followers(previous.role_followers if previous else []),
        market_data=address((previous.market_data or None) if previous else None),
    )
    write_mesh_record(state_dir, record)
    return record


def reuse_or_new_address(old: str | None) -> str:
    """`old` while its port is still free, else a new free loopback port."""
    if old:
        port = int(old.rsplit(":", 1)[1])
        if port_is_free(LOOPBACK, port):
            return old
    return f"{LOOPBACK}:{free_port()}"


def write_mesh_record(state_dir: Path, record: MeshRecord) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / RECORD_NAME
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump(asdict(record), out, indent=2)
    temporary.replace(path)
