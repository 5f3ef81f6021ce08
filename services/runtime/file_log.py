"""The embedded log backend: checksummed records in segment files on local disk.

Segments are named after the first position they hold
(`segment-00000000000000000001.log`). Each segment is preallocated with zeros
when it is created and written in place with `O_DSYNC`, so a write returns
only once its data is on disk and no append has to journal a file-size change
(on this kind of disk that halves the median and tightens the tail compared
with appending and calling `fdatasync`). The end of the data is the first
all-zero record header. One writer per log folder is enforced by `FolderLock`, a lock a forked
child never holds.

On open, the newest segment is scanned: an incomplete or damaged record at the
very end of its data is a torn write from a crash and is cut off; damage that
is followed by a valid record is corruption and refuses to open. Older
segments are verified as they are read during recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from services.runtime.core.log_batch import (
    RECORD_HEADER,
    RECORD_MAGIC,
    LogBatch,
    RecordCorruptedError,
    decode_batch_at,
    record_length_at,
)
from services.runtime.errors import LogCorruptedError, LogFencedError
from services.runtime.folder_lock import FolderLock
from services.runtime.log_store import LogTail
from services.runtime.writer_thread import WriterThread

log = structlog.get_logger(__name__)
ResultT = TypeVar("ResultT")

SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".log"
SPARE_SEGMENT = "spare-segment.tmp"
DEFAULT_SEGMENT_BYTES = 32 * 1024 * 1024
_ZERO_CHUNK = bytes(1024 * 1024)
PACED_CHUNK_BYTES = 128 * 1024
SPARE_PAUSE_S = 0.002  # 32 MiB in about half a second: done long before the segment fills
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "little")
_EMPTY_HEADER = bytes(RECORD_HEADER.size)


def segment_name(first_position: int) -> str:
    return f"{SEGMENT_PREFIX}{first_position:020d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Segment:
    first_position: int
    path: Path


def list_segments(directory: Path) -> list[Segment]:
    segments = []
    for path in directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
        digits = path.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)]
        if digits.isdigit():
            segments.append(Segment(int(digits), path))
    return sorted(segments, key=lambda segment: segment.first_position)


def fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _all_zero(data: bytes, offset: int) -> bool:
    chunk = len(_ZERO_CHUNK)
    while offset < len(data):
        part = data[offset : offset + chunk]  # a copy, but then a memcmp: fast
        if part != _ZERO_CHUNK[: len(part)]:
            return False
        offset += chunk
    return True


def _is_end_of_data(data: bytes, offset: int) -> bool:
    """True when nothing but preallocated zeros follows `offset`."""
    header = data[offset : offset + RECORD_HEADER.size]
    return header == _EMPTY_HEADER[: len(header)] and _all_zero(data, offset)


def _data_end(data: bytes, offset: int) -> int:
    """Offset just past the last non-zero byte at or after `offset`."""
    end = len(data)
    chunk = len(_ZERO_CHUNK)
    while end > offset:
        start = max(offset, end - chunk)
        part = data[start:end]
        if part != _ZERO_CHUNK[: len(part)]:
            return start + len(part.rstrip(b"\0"))
        end = start
    return offset


def iterate_segment(segment: Segment) -> Iterator[tuple[LogBatch, int]]:
    """Yield (batch, end offset) for each record; raise on any damage."""
    data = segment.path.read_bytes()
    offset = 0
    expected = segment.first_position
    while offset < len(data) and not _is_end_of_data(data, offset):
        try:
            batch, next_offset = decode_batch_at(data, offset)
        except RecordCorruptedError as error:
            raise LogCorruptedError(f"{segment.path}: {error}") from error
        if batch.first_position != expected:
            raise LogCorruptedError(
                f"{segment.path}: record at offset {offset} starts at position "
                f"{batch.first_position}, expected {expected}"
            )
        expected = batch.last_position + 1
        offset = next_offset
        yield batch, offset


def _valid_record_after(data: bytes, start: int, next_position: int) -> int | None:
    """Offset of a valid record after the damaged one at `start` that continues the log.

    When the damaged record's header checksum holds, its length is trusted and
    the search starts past it: a torn record's payload may itself contain an
    encoded record (commands are opaque bytes) and must not be mistaken for
    acknowledged data. Only a record carrying a later position counts.
    """
    search_from = start + 1
    with contextlib.suppress(RecordCorruptedError):
        search_from = start + record_length_at(data, start)
    while True:
        candidate = data.find(_MAGIC_BYTES, search_from)
        if candidate < 0:
            return None
        try:
            batch, _ = decode_batch_at(data, candidate)
        except RecordCorruptedError:
            search_from = candidate + 1
            continue
        if batch.first_position >= next_position:
            return candidate
        search_from = candidate + 1


def _write_all(descriptor: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view = view[written:]
        offset += written


def preallocate(
    path: Path, size_bytes: int, *, pause_s: float = 0.0, stop: threading.Event | None = None
) -> None:
    """Create `path` filled with zeros and flushed, so later writes change no metadata.

    With `pause_s`, the zeros go out as small synchronous writes with a pause after
    each: a fill in the background then puts at most one small write in front of a
    log append on the disk's queue, where one bulk write and its fsync would hold
    appends back for tens of milliseconds. Once `stop` is set the fill gives up and
    removes the partial file (a closing log does not wait for a spare it won't use).
    """
    paced = pause_s > 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DSYNC if paced else 0)
    chunk_limit = PACED_CHUNK_BYTES if paced else len(_ZERO_CHUNK)
    descriptor = os.open(path, flags, 0o644)
    try:
        offset = 0
        while offset < size_bytes:
            chunk = _ZERO_CHUNK[: min(chunk_limit, size_bytes - offset)]
            _write_all(descriptor, chunk, offset)
            offset += len(chunk)
            if stop is not None and stop.is_set():
                break
            if paced:
                time.sleep(pause_s)
        else:
            os.fsync(descriptor)
            return
    finally:
        os.close(descriptor)
    path.unlink(missing_ok=True)


class FileLogStore:
    """`LogStore` over segment files; blocking work runs on one writer thread."""

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._writer = WriterThread("log-writer")
        # The next segment is zero-filled ahead of time on its own thread, so a
        # roll is a rename rather than a 64 MiB write in front of an append.
        self._spare_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-spare")
        self._spare: Future[None] | None = None
        self._closing = threading.Event()
        self._lock = FolderLock(directory)
        self._active_descriptor: int | None = None
        self._active_size = 0
        self._next_position = 1
        self.appended_records = 0
        self.appended_bytes = 0
        # A benchmark's probe: when a list, each durable write's duration (ns) joins it,
        # so append latency can be told apart from what the disk itself took.
        self.write_samples_ns: list[int] | None = None

    # --- synchronous core, usable directly by tools and tests -----------------

    def open_sync(self) -> LogTail:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        segments = list_segments(self.directory)
        torn = 0
        last_position = 0
        consensus_time_ms = 0
        active_end = 0
        while segments:
            newest = segments[-1]
            dropped, tail_batch, active_end = self._repair_segment(newest)
            torn += dropped
            if tail_batch is not None:
                last_position = tail_batch.last_position
                consensus_time_ms = tail_batch.consensus_time_ms
                break
            if len(segments) == 1:
                last_position = newest.first_position - 1
                break
            # An empty newest segment (crash during a roll) carries no entry: drop it.
            newest.path.unlink()
            fsync_directory(self.directory)
            segments.pop()
        first_position = segments[0].first_position if segments else 1
        self._next_position = last_position + 1
        if segments:
            self._open_active(segments[-1].path, active_end)
            self._prepare_spare()
        else:
            self._roll(self._next_position)  # a fresh log starts with its first segment ready
        return LogTail(first_position, last_position, consensus_time_ms, torn)

    def append_sync(self, batch: LogBatch, record: bytes) -> None:
        if batch.first_position != self._next_position:
            raise LogCorruptedError(
                f"append at position {batch.first_position}, log expects {self._next_position}"
            )
        if self._active_descriptor is None or (
            self._active_size > 0 and self._active_size + len(record) > self.segment_bytes
        ):
            self._roll(batch.first_position)
        descriptor = self._active_descriptor
        if descriptor is None:
            raise LogFencedError("log is not open for appending")
        samples = self.write_samples_ns
        if samples is None:
            _write_all(descriptor, record, self._active_size)  # O_DSYNC: durable on return
        else:
            started_ns = time.perf_counter_ns()
            _write_all(descriptor, record, self._active_size)
            samples.append(time.perf_counter_ns() - started_ns)
        self._active_size += len(record)
        self._next_position = batch.last_position + 1
        self.appended_records += 1
        self.appended_bytes += len(record)

    def read_sync(self, position: int) -> Iterator[LogBatch]:
        segments = list_segments(self.directory)
        if segments and position < segments[0].first_position:
            raise LogCorruptedError(
                f"position {position} was truncated; the log starts at {segments[0].first_position}"
            )
        expected: int | None = None
        for index, segment in enumerate(segments):
            following = segments[index + 1] if index + 1 < len(segments) else None
            if following is not None and following.first_position <= position:
                continue
            if expected is not None and segment.first_position != expected:
                raise LogCorruptedError(
                    f"{segment.path}: starts at position {segment.first_position} but the "
                    f"previous segment ends before {expected}: entries are missing"
                )
            for batch, _ in iterate_segment(segment):
                expected = batch.last_position + 1
                if batch.last_position < position:
                    continue
                yield batch
            if expected is None or expected < segment.first_position:
                expected = segment.first_position

    def truncate_before_sync(self, position: int) -> int:
        """Delete whole segments whose entries all lie before `position`."""
        segments = list_segments(self.directory)
        removed = 0
        for index, segment in enumerate(segments[:-1]):
            if segments[index + 1].first_position <= position:
                segment.path.unlink()
                removed += 1
        if removed:
            fsync_directory(self.directory)
        return removed

    def release_in_forked_child(self) -> None:
        """In a forked child: close the descriptors it was handed and does not use."""
        self._lock.release_in_forked_child()
        if self._active_descriptor is not None:
            os.close(self._active_descriptor)

    def close_sync(self) -> None:
        self._closing.set()
        if self._spare is not None:
            self._spare.result()
            self._spare = None
        if self._active_descriptor is not None:
            os.close(self._active_descriptor)
            self._active_descriptor = None
        self._lock.release()

    # --- LogStore protocol ------------------------------------------------------

    async def open(self) -> LogTail:
        return await self._run(self.open_sync)

    def append(self, batch: LogBatch, record: bytes) -> asyncio.Future[None]:
        return self._run(self.append_sync, batch, record)

    async def read_from(self, position: int) -> AsyncIterator[LogBatch]:
        for batch in self.read_sync(position):
            yield batch

    async def truncate_before(self, position: int) -> None:
        await self._run(self.truncate_before_sync, position)

    async def close(self) -> None:
        await self._run(self.close_sync)
        self._writer.stop()
        self._spare_executor.shutdown(wait=True)

    # --- internals ----------------------------------------------------------------

    def _run(self, function: Callable[..., ResultT], *arguments: object) -> asyncio.Future[ResultT]:
        """Submit to the writer thread at once; the caller awaits when it needs to."""
        return self._writer.submit(function, *arguments)

    def _repair_segment(self, segment: Segment) -> tuple[int, LogBatch | None, int]:
        """Cut a torn tail off `segment`: (bytes dropped, last valid batch, end of data)."""
        data = segment.path.read_bytes()
        offset = 0
        last: LogBatch | None = None
        expected = segment.first_position
        while offset < len(data) and not _is_end_of_data(data, offset):
            try:
                batch, next_offset = decode_batch_at(data, offset)
            except RecordCorruptedError as error:
                valid_after = _valid_record_after(data, offset, expected)
                if valid_after is not None:
                    raise LogCorruptedError(
                        f"{segment.path}: damaged record at offset {offset} ({error}) is "
                        f"followed by a valid record at offset {valid_after}; refusing to "
                        "truncate acknowledged entries"
                    ) from error
                dropped = _data_end(data, offset) - offset
                log.warning(
                    "log.torn_tail_truncated",
                    segment=str(segment.path),
                    offset=offset,
                    dropped_bytes=dropped,
                    reason=str(error),
                )
                with segment.path.open("r+b") as handle:
                    handle.truncate(offset)
                    handle.flush()
                    os.fsync(handle.fileno())
                return dropped, last, offset
            if batch.first_position != expected:
                raise LogCorruptedError(
                    f"{segment.path}: record at offset {offset} starts at position "
                    f"{batch.first_position}, expected {expected}"
                )
            expected = batch.last_position + 1
            last = batch
            offset = next_offset
        return 0, last, offset

    def _open_active(self, path: Path, data_end: int) -> None:
        if self._active_descriptor is not None:
            os.close(self._active_descriptor)
        self._active_descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o644)
        self._active_size = data_end

    def _prepare_spare(self) -> None:
        spare = self.directory / SPARE_SEGMENT
        self._spare = self._spare_executor.submit(
            preallocate, spare, self.segment_bytes, pause_s=SPARE_PAUSE_S, stop=self._closing
        )

    def _roll(self, first_position: int) -> None:
        path = self.directory / segment_name(first_position)
        spare = self.directory / SPARE_SEGMENT
        if self._spare is not None:
            self._spare.result()  # normally long done: it started one segment ago
            self._spare = None
        if not spare.exists():
            preallocate(spare, self.segment_bytes)
        os.replace(spare, path)
        fsync_directory(self.directory)
        self._open_active(path, 0)
        self._prepare_spare()
