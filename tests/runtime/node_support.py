"""Helpers for tests that run a `RuntimeNode`: never hang when `run()` dies."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

ResultT = TypeVar("ResultT")
DURABLE_TIMEOUT_S = 30.0


async def settle(
    awaitable: asyncio.Future[ResultT],
    run_task: asyncio.Task[None],
    timeout_s: float = DURABLE_TIMEOUT_S,
) -> ResultT:
    """The result of `awaitable`, failing at once (with its error) if `run_task` ends first."""
    waiters: set[asyncio.Future[Any]] = {awaitable, run_task}
    done, _ = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if awaitable in done:
        return awaitable.result()
    if run_task in done:
        run_task.result()  # raises what stopped the sequencer
        raise AssertionError("node.run() returned while a submission was pending")
    raise AssertionError(f"not durable within {timeout_s} s")
