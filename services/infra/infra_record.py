"""infra.json: what `oms infra up` started, so later commands can find, reuse or stop it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from services.infra.ports import LOOPBACK

logger = structlog.get_logger(__name__)


@dataclass(frozen=True)
class EtcdRecord:
    pid: int | None
    client_port: int
    peer_port: int
    data_dir: Path
    # Its client port is mutual TLS and its auth on (`oms up` without --plaintext): a
    # folder keeps that once set, as etcd's store keeps its users and auth.
    tls: bool = False

    @property
    def endpoint(self) -> str:
        address = f"{LOOPBACK}:{self.client_port}"
        return f"https://{address}" if self.tls else address


@dataclass(frozen=True)
class PostgresRecord:
    pid: int | None
    port: int
    data_dir: Path
    url: str


@dataclass(frozen=True)
class InfraRecord:
    etcd: EtcdRecord | None = None
    postgres: PostgresRecord | None = None

    def stopped(self) -> InfraRecord:
        """The same servers with no pid; their ports are kept so the next `up` reuses them."""
        return InfraRecord(
            etcd=None if self.etcd is None else replace(self.etcd, pid=None),
            postgres=None if self.postgres is None else replace(self.postgres, pid=None),
        )


def read_record(path: Path) -> InfraRecord:
    try:
        raw = json.loads(path.read_text())
        return InfraRecord(
            etcd=_etcd_from(raw.get("etcd")),
            postgres=_postgres_from(raw.get("postgres")),
        )
    except FileNotFoundError:
        return InfraRecord()
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        # Starting afresh is safe: both servers refuse a data folder a live server still holds.
        logger.warning("ignoring unreadable infra state", path=str(path), error=str(error))
        return InfraRecord()


def write_record(path: Path, record: InfraRecord) -> None:
    raw: dict[str, Any] = {}
    if record.etcd is not None:
        etcd = record.etcd
        raw["etcd"] = {
            "pid": etcd.pid,
            "client_port": etcd.client_port,
            "peer_port": etcd.peer_port,
            "data_dir": str(etcd.data_dir),
            "tls": etcd.tls,
        }
    if record.postgres is not None:
        postgres = record.postgres
        raw["postgres"] = {
            "pid": postgres.pid,
            "port": postgres.port,
            "data_dir": str(postgres.data_dir),
            "url": postgres.url,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a crash never leaves a half-written file behind.
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(partial, path)


def _etcd_from(raw: dict[str, Any] | None) -> EtcdRecord | None:
    if raw is None:
        return None
    return EtcdRecord(
        pid=_optional_int(raw["pid"]),
        client_port=int(raw["client_port"]),
        peer_port=int(raw["peer_port"]),
        data_dir=Path(raw["data_dir"]),
        tls=bool(raw.get("tls", False)),
    )


def _postgres_from(raw: dict[str, Any] | None) -> PostgresRecord | None:
    if raw is None:
        return None
    return PostgresRecord(
        pid=_optional_int(raw["pid"]),
        port=int(raw["port"]),
        data_dir=Path(raw["data_dir"]),
        url=str(raw["url"]),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
