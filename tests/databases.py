"""A database of its own on the test PostgreSQL server, for one mesh (tests/full_mesh.py).

Each mesh gets a fresh database: its persister's cursor and user ids must start
with its shard's log, never with another mesh's rows. It is dropped with the mesh.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

_numbers = itertools.count(1)


def fresh_database(server_url: str, prefix: str = "oms_mesh") -> str:
    """Create an empty database on the server of `server_url`; return its URL."""
    name = f"{prefix}_{os.getpid()}_{next(_numbers)}"
    _run_apart(_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    _run_apart(_execute(server_url, f'CREATE DATABASE "{name}"'))
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


def drop_database(server_url: str, database_url: str) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    _run_apart(_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _execute(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def _run_apart(coroutine: Coroutine[Any, Any, None]) -> None:
    # Its own thread and loop: callers may be sync fixtures or async tests alike.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, coroutine).result()
