"""Settings of one `oms matcher` process (one matcher group)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    dedup_horizon_ms: int = setting(env="OMS_MATCHER_DEDUP_HORIZON_MS", default=600_000)
    retained_events_per_shard: int = setting(env="OMS_MATCHER_RETAINED_EVENTS", default=100_000)
    snapshot_interval_entries: int = setting(env="OMS_MATCHER_SNAPSHOT_ENTRIES", default=200_000)
    timer_interval_ms: int = setting(env="OMS_MATCHER_TIMER_MS", default=50)
    max_inflight_batches: int = setting(
        env="OMS_MATCHER_MAX_INFLIGHT", default=64, help="per Execute stream"
    )
    log_level: str = setting(env="OMS_LOG_LEVEL", default="INFO")
