"""Settings of one `oms persister` process (one per user shard)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID, mesh_prefix
from services.settings import setting


@dataclass(frozen=True)
class PersisterSettings:
    shard_address: str = setting(
        env="OMS_SHARD_ADDRESS",
        default="127.0.0.1:7201",
        help="host:port of the shard, or etcd: its leader as etcd names it",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: for the lease, and for a shard address given as etcd",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    leader_lease: bool = setting(
        env="OMS_PERSISTER_LEADER_LEASE",
        default=False,
        help="take the shard's etcd lease before writing; its term is the fencing token",
    )
    listen: str = setting(
        env="OMS_PERSISTER_LISTEN", default="127.0.0.1:7301", help="gRPC listen address, host:port"
    )
    advertise: str = setting(
        env="OMS_PERSISTER_ADVERTISE",
        default="",
        help="with the lease: the address its leader key names, where gateways find it "
        "(default: the listen address)",
    )
    database_url: str = setting(
        env="OMS_DATABASE_URL", default="", help="postgresql:// URL of the system of record"
    )
    shard_id: str = setting(
        env="OMS_SHARD_ID", default="s1", help="the shard whose rows and cursor this one writes"
    )
    write_interval_ms: int = setting(
        env="OMS_PERSISTER_WRITE_INTERVAL_MS",
        default=10,
        help="cadence of write-behind transactions",
    )
    max_rows_per_transaction: int = setting(
        env="OMS_PERSISTER_MAX_BATCH_ROWS",
        default=5_000,
        help="rows written in one write-behind transaction, at most",
    )
    max_buffered_rows: int = setting(
        env="OMS_PERSISTER_MAX_BUFFERED_ROWS",
        default=200_000,
        help="the egress follower waits (backpressure) while this many rows await a write",
    )
    read_workers: int = setting(
        env="OMS_PERSISTER_READ_WORKERS",
        default=4,
        help="concurrent readers of each kind (hydrations, dedup lookups), each on a connection",
    )
    max_reads_per_query: int = setting(
        env="OMS_PERSISTER_MAX_READS_PER_QUERY",
        default=500,
        help="users (or order ids) one read query asks PostgreSQL about, at most",
    )
    max_pending_reads: int = setting(
        env="OMS_PERSISTER_MAX_PENDING_READS",
        default=50_000,
        help="requests beyond this are shed; the shard asks again after 5 s",
    )
    unknown_user_ttl_ms: int = setting(
        env="OMS_PERSISTER_UNKNOWN_USER_TTL_MS", default=2_000, help="negative cache lifetime"
    )
    max_unknown_users: int = setting(
        env="OMS_PERSISTER_MAX_UNKNOWN_USERS",
        default=100_000,
        help="user ids the negative cache holds, at most (the oldest go first)",
    )
    flush_reanswer_window_ms: int = setting(
        env="OMS_PERSISTER_FLUSH_REANSWER_MS",
        default=30_000,
        help="on every (re)connect, flush answers committed this recently are sent again",
    )
    read_wait_ms: int = setting(
        env="OMS_PERSISTER_READ_WAIT_MS",
        default=2_000,
        help="a read as of a shard position waits this long for the writes before it (BEHIND)",
    )
    pool_size: int = setting(
        env="OMS_PERSISTER_POOL_SIZE",
        default=8,
        help="PostgreSQL connections; at least the read workers plus 2 (the writer, one RPC)",
    )
    startup_timeout_ms: int = setting(
        env="OMS_PERSISTER_STARTUP_TIMEOUT_MS",
        default=30_000,
        help="at start, PostgreSQL and etcd are waited for this long before giving up, in ms",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )
    master_key: str = setting(
        env="OMS_PERSISTER_MASTER_KEY",
        default="",
        help="32 bytes, base64: seals the HMAC secrets in the database (or the _FILE)",
    )
    master_key_file: Path | None = setting(
        env="OMS_PERSISTER_MASTER_KEY_FILE", default=None, help="a file holding the master key"
    )
    retired_master_keys: str = setting(
        env="OMS_PERSISTER_RETIRED_MASTER_KEYS",
        default="",
        help="master keys replaced by a rotation, base64, comma-separated: they open, never seal",
    )
    retired_master_keys_file: Path | None = setting(
        env="OMS_PERSISTER_RETIRED_MASTER_KEYS_FILE",
        default=None,
        help="a file of retired master keys, one per line",
    )

    def problems(self) -> list[str]:
        found = []
        if not self.database_url:
            found.append("a database URL is required (--database-url or OMS_DATABASE_URL)")
        if not self.shard_id or ":" in self.shard_id:
            found.append("shard id must be non-empty and contain no ':'")
        try:
            mesh_prefix(self.mesh_id)
        except ValueError as error:
            found.append(f"OMS_MESH_ID: {error}")
        positive = {
            "write_interval_ms": self.write_interval_ms,
            "max_rows_per_transaction": self.max_rows_per_transaction,
            "max_buffered_rows": self.max_buffered_rows,
            "read_workers": self.read_workers,
            "max_reads_per_query": self.max_reads_per_query,
            "max_pending_reads": self.max_pending_reads,
            "unknown_user_ttl_ms": self.unknown_user_ttl_ms,
            "max_unknown_users": self.max_unknown_users,
            "pool_size": self.pool_size,
            "read_wait_ms": self.read_wait_ms,
        }
        found += [
            f"{name} must be positive, not {value}" for name, value in positive.items() if value < 1
        ]
        if self.pool_size < self.read_workers + 2:
            found.append("pool_size must cover the read workers, the writer and one RPC")
        return found
