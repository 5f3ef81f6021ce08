"""Fixtures: real `oms shard` processes on loopback with their own data folders.

Starting a shard costs about two seconds, so tests that only talk to it share one
session-wide process and use user ids no other test uses. Tests that kill, stop or
configure a shard start their own through `new_shard`, which always reaps it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shard_service.shard_client import ShardClient
from tests.shard_service.shard_process import ShardProcess, aio_channel

_user_blocks = itertools.count(1)
USERS_PER_TEST = 8


@pytest.fixture(scope="session")
def shared_shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardProcess]:
    with ShardProcess(tmp_path_factory.mktemp("shared-shard") / "data") as process:
        yield process


@pytest.fixture
async def shard(shared_shard: ShardProcess) -> AsyncIterator[ShardClient]:
    async with aio_channel(shared_shard.address) as channel:
        yield ShardClient(channel)


@pytest.fixture
def users() -> tuple[int, ...]:
    """User ids no other test uses."""
    base = next(_user_blocks) * 100
    return tuple(base + offset for offset in range(1, USERS_PER_TEST + 1))


@pytest.fixture
def new_shard(tmp_path: Path) -> Iterator[Callable[..., ShardProcess]]:
    """Makes dedicated (not yet started) shard processes; kills and reaps them at the end."""
    made: list[ShardProcess] = []

    def make(**options: Any) -> ShardProcess:
        process = ShardProcess(tmp_path / f"shard-{len(made) + 1}", **options)
        made.append(process)
        return process

    try:
        yield make
    finally:
        for process in made:
            process.stop()
