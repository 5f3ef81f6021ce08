"""Settings of one `oms matcher` process (one matcher group)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID
from services.settings import setting


@dataclass(frozen=True)
class MatcherServiceSettings:
    group: str = setting(env="OMS_MATCHER_GROUP", default="g1", help="matcher group to run")
    listen: str = setting(
        env="OMS_MATCHER_LISTEN", default="127.0.0.1:7101", help="gRPC listen address"
    )
    data_dir: Path = setting(
        env="OMS_MATCHER_DATA_DIR", default=Path("state/matcher"), help="log and snapshots"
    )
    markets_file: Path | None = setting(
        env="OMS_MARKETS_FILE", default=None, help="market catalog (default: packaged)"
    )
    dedup_horizon_ms: int = setting(
        env="OMS_MATCHER_DEDUP_HORIZON_MS",
        default=600_000,
        help="a finished order's id stays known (a re-sent submit is a duplicate) this"
        " long after it ends, in ms",
    )
    retained_events_per_shard: int = setting(
        env="OMS_MATCHER_RETAINED_EVENTS",
        default=100_000,
        help="events kept per user shard for a bridge that resumes; older ones are gone"
        " (the reconciler heals what a resume past them missed)",
    )
    retained_market_data_per_symbol: int = setting(
        env="OMS_MATCHER_RETAINED_MARKET_DATA",
        default=10_000,
        help="book updates, and as many trades, kept per symbol for a market-data service"
        " that resumes; one that asks for older ones gets a fresh snapshot of the book",
    )
    version_at_start: int = setting(
        env="OMS_MATCHER_VERSION_AT_START",
        default=0,
        help="the state-machine version a new group's empty log starts at (0: the newest"
        " this build implements); a log that holds entries is switched only by"
        " `oms upgrade activate`",
    )
    snapshot_interval_entries: int = setting(
        env="OMS_MATCHER_SNAPSHOT_ENTRIES",
        default=200_000,
        help="log entries between two snapshots (0: none); the log is truncated behind one",
    )
    checkpoint_interval_entries: int = setting(
        env="OMS_MATCHER_CHECKPOINT_ENTRIES",
        default=10_000,
        help="entries between two logged state hashes (checked by replays and followers)",
    )
    timer_interval_ms: int = setting(
        env="OMS_MATCHER_TIMER_MS",
        default=50,
        help="spacing of timer entries in the log (GTD expiries, dedup sweeps), in ms; it"
        " widens up to OMS_MATCHER_IDLE_TIMER_MS while idle",
    )
    idle_timer_interval_ms: int = setting(
        env="OMS_MATCHER_IDLE_TIMER_MS",
        default=500,
        help="while no command comes and timers expire nothing, their spacing doubles up"
        " to this (a GTD order on an idle group expires at most this late)",
    )
    max_inflight_batches: int = setting(
        env="OMS_MATCHER_MAX_INFLIGHT", default=64, help="per Execute stream"
    )
    log_backend: str = setting(
        env="OMS_MATCHER_LOG",
        default="file",
        help="file: one replica, its log on local disk; etcd: a replica of a group whose"
        " log is in etcd (OMS_ETCD_ENDPOINTS), led by the holder of its leader key",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: the etcd log and the leader key "
        "(OMS_MATCHER_LOG=etcd)",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    advertise: str = setting(
        env="OMS_MATCHER_ADVERTISE",
        default="",
        help="host:port other services reach this replica at (default: --listen)",
    )
    lease_ttl_s: int = setting(
        env="OMS_MATCHER_LEASE_TTL_S", default=2, help="the leader key's lease (etcd log only)"
    )
    etcd_compact_interval_s: int = setting(
        env="OMS_ETCD_COMPACT_INTERVAL_S",
        default=30,
        help="how often the leader compacts etcd's history behind its log (etcd log only)",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )
