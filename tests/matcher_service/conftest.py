"""Fixtures: real `oms matcher` processes on loopback, and per-test names.

Starting a matcher costs about two seconds (interpreter and imports), so tests that
only talk to it share one session-wide process: each test gets its own OMS shard
name and user ids, and starts from empty books (a halt that cancels every resting
order, then a resume). Tests that kill, stop or configure a matcher get their own
through `new_matcher`, which always reaps what it started.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import SYMBOLS, OrderFactory, halt, resume
from tests.matcher_service.matcher_process import MatcherProcess, aio_channel

_shard_numbers = itertools.count(1)
_user_blocks = itertools.count(1)
USERS_PER_TEST = 8


@pytest.fixture(scope="session")
def shared_matcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MatcherProcess]:
    with MatcherProcess(tmp_path_factory.mktemp("shared-matcher") / "data") as process:
        yield process


@pytest.fixture
async def matcher(shared_matcher: MatcherProcess) -> AsyncIterator[MatcherClient]:
    """A client of the shared matcher, whose books are empty and trading (no halt)."""
    async with aio_channel(shared_matcher.address) as channel:
        client = MatcherClient(channel)
        await client.run(
            *(halt(symbol, cancel_resting=True) for symbol in SYMBOLS),
            *(resume(symbol) for symbol in SYMBOLS),
        )
        yield client


@pytest.fixture
def orders(request: pytest.FixtureRequest) -> OrderFactory:
    """Orders of an OMS shard that no other test uses."""
    name = request.node.originalname.removeprefix("test_")[:40]
    return OrderFactory(f"{name}.{next(_shard_numbers)}")


@pytest.fixture
def users() -> tuple[int, ...]:
    """User ids that no other test uses."""
    base = next(_user_blocks) * 100
    return tuple(base + offset for offset in range(1, USERS_PER_TEST + 1))


@pytest.fixture
def new_matcher(tmp_path: Path) -> Iterator[Callable[..., MatcherProcess]]:
    """Makes dedicated (not yet started) matcher processes; kills and reaps them at the end."""
    made: list[MatcherProcess] = []

    def make(**options: Any) -> MatcherProcess:
        process = MatcherProcess(tmp_path / f"matcher-{len(made) + 1}", **options)
        made.append(process)
        return process

    try:
        yield make
    finally:
        for process in made:
            process.stop()
