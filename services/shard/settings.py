"""Settings of one `oms shard` process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID
from services.settings import setting


@dataclass(frozen=True)
class ShardServiceSettings:
    shard_id: str = setting(env="OMS_SHARD_ID", default="s1", help="prefixes every order id")
    listen: str = setting(
        env="OMS_SHARD_LISTEN", default="127.0.0.1:7201", help="gRPC listen address, host:port"
    )
    data_dir: Path = setting(
        env="OMS_SHARD_DATA_DIR",
        default=Path("state/shard"),
        help="the replica's folder: its log (file log) and its snapshots",
    )
    markets_file: Path | None = setting(
        env="OMS_MARKETS_FILE", default=None, help="market catalog (default: packaged)"
    )
    version_at_start: int = setting(
        env="OMS_SHARD_VERSION_AT_START",
        default=0,
        help="the state-machine version a new group's empty log starts at (0: the newest"
        " this build implements); a log that holds entries is switched only by"
        " `oms upgrade activate`",
    )
    snapshot_interval_entries: int = setting(
        env="OMS_SHARD_SNAPSHOT_ENTRIES",
        default=200_000,
        help="log entries between two snapshots (0: none); the log is truncated behind one",
    )
    checkpoint_interval_entries: int = setting(
        env="OMS_SHARD_CHECKPOINT_ENTRIES",
        default=100_000,
        help="entries between two logged state hashes (checked by replays and followers)",
    )
    timer_interval_ms: int = setting(
        env="OMS_SHARD_TIMER_MS",
        default=100,
        help="spacing of timer entries in the log (eviction sweeps, redrives), in ms; it"
        " widens up to OMS_SHARD_IDLE_TIMER_MS while idle",
    )
    idle_timer_interval_ms: int = setting(
        env="OMS_SHARD_IDLE_TIMER_MS",
        default=1_000,
        help="while no command comes and timers find nothing to do, their spacing doubles up"
        " to this (sweeps and redrives of an idle shard run this late at most)",
    )
    mark_interval_ms: int = setting(
        env="OMS_SHARD_MARK_INTERVAL_MS", default=100, help="cadence of conflated mark prices"
    )
    saturation_dwell_ms: int = setting(
        env="OMS_SHARD_SATURATION_DWELL_MS", default=10, help="queue dwell that raises an alert"
    )
    idle_ttl_ms: int = setting(
        env="OMS_SHARD_IDLE_TTL_MS",
        default=30 * 60_000,
        help="a flat user idle this long (consensus time, ms) is evicted: written back to"
        " PostgreSQL and dropped from memory",
    )
    max_resident: int = setting(
        env="OMS_SHARD_MAX_RESIDENT",
        default=2_000_000,
        help="resident users, at most: past it the least recently used flat users are"
        " evicted before their idle time",
    )
    max_in_flight_sagas: int = setting(
        env="OMS_SHARD_MAX_IN_FLIGHT",
        default=100_000,
        help="submits and cancels on their way to the matchers, at most: new orders are"
        " refused BACKPRESSURE (retryable) past it",
    )
    max_inflight_batches: int = setting(
        env="OMS_SHARD_MAX_INFLIGHT_BATCHES",
        default=64,
        help="command batches of one Execute stream in the log and not yet answered, at most",
    )
    retained_egress_records: int = setting(
        env="OMS_SHARD_RETAINED_EGRESS",
        default=100_000,
        help="durable egress kept for subscribers to resume from, in log records (and at"
        " most OMS_SHARD_RETAINED_EGRESS_ITEMS items)",
    )
    retained_egress_items: int = setting(
        env="OMS_SHARD_RETAINED_EGRESS_ITEMS",
        default=4_000_000,
        help="durable egress kept for subscribers to resume from, in items: the persister"
        " can fall this far behind and still resume (measured at the bench's maximum: about"
        " 7 items and 0.37 KB an item per order, so 4 million are some 580,000 orders,"
        " 1.4 GB)",
    )
    log_backend: str = setting(
        env="OMS_SHARD_LOG",
        default="file",
        help="file: one replica, its log on local disk; etcd: a replica of a group whose"
        " log is in etcd (OMS_ETCD_ENDPOINTS), led by the holder of its leader key",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: the etcd log and the leader key (OMS_SHARD_LOG=etcd)",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    advertise: str = setting(
        env="OMS_SHARD_ADVERTISE",
        default="",
        help="host:port other services reach this replica at (default: --listen)",
    )
    lease_ttl_s: int = setting(
        env="OMS_SHARD_LEASE_TTL_S", default=2, help="the leader key's lease (etcd log only)"
    )
    etcd_compact_interval_s: int = setting(
        env="OMS_ETCD_COMPACT_INTERVAL_S",
        default=30,
        help="how often the leader compacts etcd's history behind its log (etcd log only)",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )
