"""Settings of one `oms reconciler` process (the drift sweep of one user shard)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID
from services.settings import setting


@dataclass(frozen=True)
class ReconcilerSettings:
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
        env="OMS_RECONCILER_LEADER_LEASE",
        default=False,
        help="several instances per shard, one active: the holder of an etcd lease",
    )
    listen: str = setting(
        env="OMS_RECONCILER_LISTEN", default="127.0.0.1:7501", help="health and status"
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
    interval_ms: int = setting(
        env="OMS_RECONCILER_INTERVAL_MS", default=2_000, help="pause between two rounds"
    )
    max_users_per_round: int = setting(
        env="OMS_RECONCILER_MAX_USERS", default=200, help="users checked per round (the cap)"
    )
    report_only_on_drift: bool = setting(
        env="OMS_RECONCILER_ONLY_ON_DRIFT",
        default=True,
        help="report only disagreements unchanged between two looks a round apart; "
        "off reports every (user, group) every round: unsafe under load"
        " (services/reconciler/sweep.py)",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )

    def __post_init__(self) -> None:
        if self.interval_ms <= 0 or self.max_users_per_round <= 0:
            raise ValueError("reconciler interval and users per round must be positive")
