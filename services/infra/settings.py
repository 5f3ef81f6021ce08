"""Where local infrastructure comes from: external endpoints, or servers started under state_dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.settings import setting

DEFAULT_STATE_DIR = Path("state")


@dataclass(frozen=True)
class InfraSettings:
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="comma-separated host:port of an existing etcd; unset starts an embedded one",
    )
    database_url: str = setting(
        env="OMS_DATABASE_URL",
        default="",
        help="postgresql:// URL of an existing database; unset starts an embedded PostgreSQL",
    )
    state_dir: Path = setting(
        env="OMS_STATE_DIR",
        default=DEFAULT_STATE_DIR,
        help="folder for embedded servers' data, logs and infra.json",
    )
