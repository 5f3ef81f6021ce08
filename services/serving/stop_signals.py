"""SIGINT and SIGTERM, heard by every service of this process; SIGUSR1 to see inside it.

asyncio keeps one handler per signal: a second `add_signal_handler` replaces the
first. When several services share a process (`oms shard --colocate`: the shard, its
persister, its bridge and its reconciler), each registers what stops it here, and one
signal stops them all, each gracefully. SIGUSR1 writes every asyncio task's stack to
stderr (the process's log), for a process that does not stop or does not answer:
`kill -USR1 <pid>`, then read the log.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import Callable
from types import AsyncGeneratorType, FrameType

import structlog

log = structlog.get_logger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_stops: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}


def on_stop_signal(stop: Callable[[], None]) -> None:
    """Call `stop` (on this loop) when the process is asked to stop."""
    loop = asyncio.get_running_loop()
    stops = _stops.get(loop)
    if stops is None:
        stops = _stops[loop] = []
        for signal_number in STOP_SIGNALS:
            loop.add_signal_handler(signal_number, _stop_all, loop)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks, loop)
    stops.append(stop)


def _stop_all(loop: asyncio.AbstractEventLoop) -> None:
    log.info("service.stopping", services=len(_stops.get(loop, ())))
    for stop in list(_stops.get(loop, ())):
        stop()


def dump_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Every task of `loop` with where it waits, on stderr."""
    tasks = asyncio.all_tasks(loop)
    lines = [f"--- {len(tasks)} asyncio tasks (SIGUSR1)"]
    for task in tasks:
        lines.append(f"--- {task!r}")
        lines.extend(f"    {place}" for place in await_chain(task.get_coro()))
    print("\n".join(lines), file=sys.stderr, flush=True)


def await_chain(awaitable: object, *, limit: int = 24) -> list[str]:
    """Where a coroutine waits: its frame, then each coroutine or generator it awaits.

    `Task.print_stack` shows a coroutine task's outermost frame only (so a task stuck
    in a library shows as stuck in our first call) and fails on a compiled frame
    (grpc's Cython ones have no line); this follows `cr_await`/`ag_await`/
    `gi_yieldfrom` to the innermost, naming what has no Python frame.
    """
    places: list[str] = []
    current: object = awaitable
    while current is not None and len(places) < limit:
        frame = _frame_of(current)
        if frame is None:
            places.append(f"in {current!r}")
            break
        code = frame.f_code
        places.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        current = _awaited_by(current)
    return places


def _frame_of(awaitable: object) -> FrameType | None:
    for name in ("cr_frame", "ag_frame", "gi_frame"):
        frame = getattr(awaitable, name, None)
        if isinstance(frame, FrameType):
            return frame
    return None


def _awaited_by(awaitable: object) -> object:
    for name in ("cr_await", "ag_await", "gi_yieldfrom"):
        inner = getattr(awaitable, name, None)
        if inner is not None:
            return _generator_behind(inner)
    return None


def _generator_behind(awaitable: object) -> object:
    """`async for` awaits an `async_generator_asend`, which does not expose its
    generator; the garbage collector's referents do (diagnostics only)."""
    if type(awaitable).__name__ in ("async_generator_asend", "async_generator_athrow"):
        for referent in gc.get_referents(awaitable):
            if isinstance(referent, AsyncGeneratorType):
                return referent
    return awaitable
