"""What the sequencer and recovery need from a log, whatever stores it.

The embedded backend (`file_log.FileLogStore`) keeps segment files on local disk.
An etcd backend appends each record as a key under the shard's prefix in a
transaction guarded by the leader key's revision, and followers watch the
prefix; it fits the same protocol, so callers never change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Protocol

from services.runtime.core.log_batch import LogBatch


@dataclass(frozen=True, slots=True)
class LogTail:
    """The state of a log right after it was opened and repaired."""

    first_position: int  # oldest entry still stored (1 for an untruncated log)
    last_position: int  # 0 when the log holds no entry
    consensus_time_ms: int  # of the last record; 0 when empty
    torn_bytes_dropped: int  # bytes of an incomplete tail record removed on open


class LogStore(Protocol):
    async def open(self) -> LogTail:
        """Acquire the right to append (fencing) and repair a torn tail."""
        ...

    def append(self, batch: LogBatch, record: bytes) -> Awaitable[None]:
        """Start storing `record` (the encoding of `batch`) now; durable once awaited.

        The write must begin before this returns, so the sequencer can apply the
        batch while the disk (or etcd) works. Raises `LogFencedError` when this
        process is no longer the writer.
        """
        ...

    def read_from(self, position: int) -> AsyncIterator[LogBatch]:
        """Every stored batch whose entries lie at or after `position`, in order."""
        ...

    async def truncate_before(self, position: int) -> None:
        """Allow the store to drop records whose entries all lie before `position`."""
        ...

    async def close(self) -> None: ...
