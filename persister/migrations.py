"""Versioned schema migrations: plain SQL files applied once, in order, on start.

`migrations/NNNN_name.sql` files ship inside the package. `apply_migrations` runs
in one transaction holding a transaction-scoped advisory lock, so persisters of
several shards starting together apply each file exactly once; the others wait,
then find nothing to do. `schema_migrations` records each applied version with
the SHA-256 of its text: a shipped file that differs from what was applied is
drift and stops the start (`MigrationError`) rather than guessing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from persister.errors import MigrationError
from persister.store import Store

# pg_advisory_xact_lock key of schema changes; any constant all persisters share.
MIGRATION_LOCK_KEY = 0x6F6D735F6D6967  # "oms_mig"
_FILE_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def shipped_migrations() -> list[Migration]:
    """The migrations in this build, by version; names must be NNNN_name.sql, unique."""
    folder = resources.files("persister").joinpath("migrations")
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.fullmatch(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migration files have version {version}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    if not found:
        raise MigrationError("no migrations shipped: package data is missing")
    return [found[version] for version in sorted(found)]


async def apply_migrations(store: Store, migrations: list[Migration] | None = None) -> list[int]:
    """Apply what is missing; returns the versions applied now (empty when up to date)."""
    wanted = shipped_migrations() if migrations is None else migrations
    applied_now: list[int] = []
    async with store.transaction() as session:
        await session.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await session.execute(_CREATE_TABLE)
        rows = await session.fetch("SELECT version, name, checksum FROM schema_migrations")
        applied = {row["version"]: row for row in rows}
        shipped = {migration.version for migration in wanted}
        unknown = sorted(set(applied) - shipped)
        if unknown:
            raise MigrationError(f"the database has migrations this build lacks: {unknown}")
        for migration in wanted:
            row = applied.get(migration.version)
            if row is not None:
                if row["checksum"] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.version} ({migration.name}) differs from the "
                        "one applied; write a new migration instead of editing an old one"
                    )
                continue
            await session.execute(migration.sql)
            await session.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
            applied_now.append(migration.version)
    return applied_now
