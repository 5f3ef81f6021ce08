"""Settings of one `oms bridge` process (the matcher client of one user shard)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID
from services.settings import setting


@dataclass(frozen=True)
class BridgeSettings:
    shard_address: str = setting(
        env="OMS_SHARD_ADDRESS",
        default="127.0.0.1:7201",
        help="host:port of the shard, or etcd: its leader as etcd names it",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: for the lease, and for addresses given as etcd",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    leader_lease: bool = setting(
        env="OMS_BRIDGE_LEADER_LEASE",
        default=False,
        help="several instances per shard, one active: the holder of an etcd lease",
    )
    listen: str = setting(
        env="OMS_BRIDGE_LISTEN", default="127.0.0.1:7401", help="health and status"
    )
    shard_id: str = setting(env="OMS_SHARD_ID", default="s1", help="the shard's order id prefix")
    matchers: str = setting(
        env="OMS_MATCHERS",
        default="g1=127.0.0.1:7101",
        help="matcher group addresses: g1=host:port,g2=host:port",
    )
    markets_file: Path | None = setting(
        env="OMS_MARKETS_FILE", default=None, help="market catalog (default: packaged)"
    )
    max_batch_commands: int = setting(
        env="OMS_BRIDGE_MAX_BATCH",
        default=1_000,
        help="matcher commands per MatcherCommandBatch",
    )
    queue_capacity: int = setting(
        env="OMS_BRIDGE_QUEUE_CAPACITY",
        default=20_000,
        help="fresh commands waiting per matcher group before the egress reader waits",
    )
    shard_batch_bytes: int = setting(
        env="OMS_BRIDGE_SHARD_BATCH_BYTES",
        default=3 * 1024 * 1024,
        help="bytes of events in one batch to the shard, under the shard's entry cap (4 MiB)",
    )
    mark_interval_ms: int = setting(
        env="OMS_BRIDGE_MARK_INTERVAL_MS",
        default=50,
        help="last prices are read and published at most this often (conflated)",
    )
    backoff_initial_ms: int = setting(
        env="OMS_BRIDGE_BACKOFF_INITIAL_MS",
        default=100,
        help="first wait before reconnecting to the shard or a matcher, in ms; it doubles"
        " on each failure",
    )
    backoff_max_ms: int = setting(
        env="OMS_BRIDGE_BACKOFF_MAX_MS",
        default=2_000,
        help="the longest wait between two reconnection attempts, in ms",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )
