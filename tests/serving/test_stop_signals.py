"""SIGUSR1's task dump: where each task waits, to the innermost awaited call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from services.serving.stop_signals import await_chain


async def _events(ready: asyncio.Event) -> AsyncGenerator[int, None]:
    ready.set()
    await asyncio.Event().wait()  # never set: where the dump must point
    yield 1


async def _watch(ready: asyncio.Event) -> None:
    async for _ in _events(ready):
        pass


async def test_the_chain_follows_a_coroutine_into_the_generator_it_awaits() -> None:
    ready = asyncio.Event()
    task = asyncio.create_task(_watch(ready))
    await ready.wait()
    await asyncio.sleep(0)
    try:
        chain = await_chain(task.get_coro())
    finally:
        task.cancel()
    names = [place.rsplit(" in ", 1)[-1] for place in chain]
    assert names[:3] == ["_watch", "_events", "wait"], chain
    assert all(__file__ in place for place in chain[:2])


def test_an_awaitable_without_a_python_frame_is_named_not_an_error() -> None:
    (place,) = await_chain(42)
    assert place == "in 42"
