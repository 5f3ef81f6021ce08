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
import signal
import sys
from collections.abc import Callable

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
    print(f"--- {len(tasks)} asyncio tasks (SIGUSR1)", file=sys.stderr, flush=True)
    for task in tasks:
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()
