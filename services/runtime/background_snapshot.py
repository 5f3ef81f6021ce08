"""Snapshots that never stall the apply loop: serialize in a forked child.

`fork` gives the child a copy-on-write image of the whole process as of the
instant between two batches, so the snapshot is consistent as of one log
position while the parent keeps applying. The parent's pause is the `fork`
call itself (page-table copy), measured and reported. The child touches only
the state machine and plain file calls, then leaves with `os._exit` so no
inherited thread, event loop or atexit hook runs in it.

A child can also hang where none of its own code runs: inside `os.fork`, where
CPython drops the states of the threads the child did not inherit and runs what
they alone referenced (a fresh-clone suite run met one that never returned). So
the parent gives the child a deadline and kills it past that: the snapshot fails,
the previous one stands, and the next is tried at the next interval, instead of no
snapshot (and so no log truncation) ever again. The log's lock is never the
child's (`folder_lock.py`), so a hung child fences nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.runtime.core.replica import Replica
from services.runtime.snapshot_files import FileSnapshotStore, Snapshot, write_snapshot_file

_PR_SET_PDEATHSIG = 1
# A snapshot of millions of users serializes in seconds (a 25 MB one in about half a
# second here): ten minutes means the child is stuck, not slow.
CHILD_DEADLINE_S = 600.0


class SnapshotFailedError(RuntimeError):
    """The snapshot child exited with an error; the previous snapshot still stands."""


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    position: int
    fork_pause_ns: int  # how long the parent was stopped by fork()
    total_ns: int  # from fork until the snapshot was published


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child if its parent dies (an orphan must not linger)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the child still exits when done
        return


class ForkedSnapshotWriter:
    def __init__(
        self,
        store: FileSnapshotStore,
        release_in_child: Callable[[], None] | None = None,
        *,
        child_deadline_s: float = CHILD_DEADLINE_S,
        egress_floor: Callable[[], int | None] | None = None,
    ) -> None:
        self.store = store
        # Read on the loop when a snapshot is published: which older one to keep too.
        self._egress_floor = egress_floor
        self.child_deadline_s = child_deadline_s
        self.children_killed = 0
        self._release_in_child = release_in_child
        self.in_progress_position: int | None = None
        self.last_result: SnapshotResult | None = None
        self.longest_fork_pause_ns = 0

    def start(self, replica: Replica[object]) -> tuple[int, int, int]:
        """Fork the child; return (child pid, position, fork pause in ns)."""
        if self.in_progress_position is not None:
            raise RuntimeError("a snapshot is already being written")
        position = replica.applied_position
        consensus_time_ms = replica.consensus_time_ms
        staging = self.store.staging_path(position)
        started = time.perf_counter_ns()
        # Frozen objects are skipped by the cyclic collector in both processes, so
        # neither a collection in the parent nor one in the child walks (and so
        # copies) every page of the state while the child is serializing it. They
        # stay frozen afterwards: see services/runtime/collector.py.
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # child: serialize and leave without running any parent cleanup
            exit_code = 1
            try:
                gc.disable()
                _die_with_parent()
                if self._release_in_child is not None:
                    self._release_in_child()
                machine = replica.machine
                snapshot = Snapshot(
                    position, consensus_time_ms, machine.state_hash(), machine.snapshot()
                )
                write_snapshot_file(staging, snapshot)
                exit_code = 0
            finally:
                os._exit(exit_code)
        pause = time.perf_counter_ns() - started
        self.longest_fork_pause_ns = max(self.longest_fork_pause_ns, pause)
        self.in_progress_position = position
        return pid, position, pause

    async def wait(self, pid: int, position: int, fork_pause_ns: int, started_ns: int) -> int:
        """Wait for the child off the loop, publish the snapshot, return its position."""
        loop = asyncio.get_running_loop()
        try:
            # Opened before anything reaps the child, so a kill never reaches a reused pid.
            child = os.pidfd_open(pid)
            try:
                reaped = loop.run_in_executor(None, os.waitpid, pid, 0)
                try:
                    async with asyncio.timeout(self.child_deadline_s):
                        _, status = await asyncio.shield(reaped)
                except TimeoutError:
                    signal.pidfd_send_signal(child, signal.SIGKILL)
                    await reaped
                    self.children_killed += 1
                    self.store.discard_staged(position)
                    raise SnapshotFailedError(
                        f"snapshot child for position {position} ran past "
                        f"{self.child_deadline_s:g} s and was killed"
                    ) from None
            finally:
                os.close(child)
            if os.waitstatus_to_exitcode(status) != 0:
                self.store.discard_staged(position)
                raise SnapshotFailedError(
                    f"snapshot child for position {position} exited with status {status}"
                )
            floor = self._egress_floor() if self._egress_floor is not None else None
            await loop.run_in_executor(None, self.store.publish, position, floor)
        finally:
            self.in_progress_position = None
        self.last_result = SnapshotResult(
            position, fork_pause_ns, time.perf_counter_ns() - started_ns
        )
        return position

    async def take(self, replica: Replica[object]) -> SnapshotResult:
        """Fork, wait and publish in one call (tools and tests)."""
        started = time.perf_counter_ns()
        pid, position, pause = self.start(replica)
        await self.wait(pid, position, pause, started)
        if self.last_result is None:
            raise SnapshotFailedError("snapshot finished without a result")
        return self.last_result
