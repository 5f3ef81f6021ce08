"""Fixtures: a fresh PostgreSQL database per test, and real shard + persister processes.

Every mesh gets its own database on the session's PostgreSQL server (created with
asyncpg, dropped at the end), so tests never see each other's rows or cursors.
Processes are always killed and reaped, also when a test fails.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.persister.persister_process import PersisterProcess
from tests.shard_service.shard_process import ShardProcess

_databases = itertools.count(1)


def database_url_for(server_url: str, database: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{database}"))


async def _create_database(server_url: str, database: str) -> None:
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'CREATE DATABASE "{database}"')
    finally:
        await connection.close()


async def _drop_database(server_url: str, database: str) -> None:
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await connection.close()


@pytest.fixture
def new_database(database_url: str, request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """Makes empty databases named after the test module; drops them afterwards."""
    made: list[str] = []
    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.rsplit(".", 1)[-1].lower())

    def make() -> str:
        name = f"p_{module[:30]}_{next(_databases)}_{secrets.token_hex(3)}"
        _run_apart(_create_database(database_url, name))
        made.append(name)
        return database_url_for(database_url, name)

    try:
        yield make
    finally:
        for name in made:
            _run_apart(_drop_database(database_url, name))


def _run_apart(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run on a loop of its own: callers may be inside a test's running loop."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coroutine).result()


@dataclass
class Mesh:
    shard: ShardProcess
    persister: PersisterProcess
    database_url: str


@pytest.fixture
def start_mesh(
    tmp_path: Path, new_database: Callable[[], str], database_url: str
) -> Iterator[Callable[..., Mesh]]:
    """Starts a shard and its persister on a fresh database; kills and reaps them at the end."""
    processes: list[ShardProcess | PersisterProcess] = []

    def start(
        *,
        shard_environment: Mapping[str, str] | None = None,
        persister_environment: Mapping[str, str] | None = None,
    ) -> Mesh:
        index = len(processes) // 2 + 1
        url = new_database()
        shard = ShardProcess(tmp_path / f"shard-{index}", environment=shard_environment)
        processes.append(shard)
        shard.start_serving()
        persister = PersisterProcess(
            tmp_path / f"persister-{index}",
            shard_address=shard.address,
            database_url=url,
            environment=persister_environment,
        )
        processes.append(persister)
        persister.start_serving()
        return Mesh(shard, persister, url)

    try:
        yield start
    finally:
        for process in processes:
            process.stop()
