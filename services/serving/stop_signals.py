"""SIGINT and SIGTERM, heard by every service of this process.

asyncio keeps one handler per signal: a second `add_signal_handler` replaces the
first. When several services share a process (`oms shard --colocate`: the shard, its
persister, its bridge and its reconciler), each registers what stops it here, and one
signal stops them all, each gracefully.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

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
    stops.append(stop)


def _stop_all(loop: asyncio.AbstractEventLoop) -> None:
    for stop in list(_stops.get(loop, ())):
        stop()
