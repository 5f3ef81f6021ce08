"""The replicated log backend: records as keys in etcd, appended only by the term's leader.

etcd's Raft keeps the log: a record is durable once the transaction that puts it
has committed on a quorum of etcd members. Keys under one state machine's prefix
(`GroupKeys`):

    <prefix>leader                          the leader key (its lease; value: who leads)
    <prefix>log/<first position, 20 digits> one record, or the manifest of a split one
    <prefix>chunk/<first position>/<index>  the pieces of a record over `chunk_bytes`

Every append is one transaction guarded by the leader key's create revision, the
term's fencing token: once another replica holds the leader key (or it is gone),
the compare fails and the append raises `LogFencedError`, so a deposed leader can
never add a record. The record's own key must also be absent, so a retried append
(an answer lost to a timeout) never writes over anything: if the key is there with
our bytes, the first attempt committed.

A record larger than `chunk_bytes` (etcd refuses requests over its limit, 1.5 MiB by
default) is written as chunks first and its manifest last, each guarded; readers
see it only once the manifest is there, and the chunks of a record that never got
its manifest (the leader died between them) are removed by the next leader's open.

Values carry a kind byte: `R` + the record (services/runtime/core/log_batch.py, with
its own checksums), or `M` + the chunk count and total length.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Awaitable

import structlog

from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import Entry, EtcdSession, Guard, prefix_end
from services.coordination.group_keys import GroupKeys
from services.runtime.core.log_batch import LogBatch, RecordCorruptedError, decode_batch_at
from services.runtime.errors import LogCorruptedError, LogFencedError, RuntimeStoreError
from services.runtime.log_store import LogTail

log = structlog.get_logger(__name__)
DEFAULT_CHUNK_BYTES = 1024 * 1024
RECORD = b"R"
MANIFEST = b"M"
_MANIFEST = struct.Struct("<II")  # chunk count, total bytes
READ_PAGE = 64  # records per range read
APPEND_RETRY_S = 0.05
ATTEMPT_TIMEOUT_S = 1.5  # etcd elects a new leader in about 1 s (election timeout)
ABSENT = 0  # a guard's create revision for "this key does not exist"


class LogUnavailableError(RuntimeStoreError):
    """etcd did not take the append in time: the record's fate is unknown here."""


def _decode(value: bytes, where: str) -> LogBatch:
    try:
        batch, end = decode_batch_at(value, 0)
    except RecordCorruptedError as error:
        raise LogCorruptedError(f"{where}: {error}") from error
    if end != len(value):
        raise LogCorruptedError(f"{where}: {len(value) - end} bytes after the record")
    return batch


async def record_of(session: EtcdSession, keys: GroupKeys, entry: Entry) -> LogBatch:
    """The batch a `log/` key holds (its chunks read and joined when it is a manifest)."""
    where = entry.key.decode()
    kind, body = entry.value[:1], entry.value[1:]
    if kind == RECORD:
        return _decode(body, where)
    if kind != MANIFEST or len(body) != _MANIFEST.size:
        raise LogCorruptedError(f"{where}: not a record nor a manifest")
    count, total = _MANIFEST.unpack(body)
    first = keys.position_of(entry.key)
    start = keys.chunk_prefix(first)
    chunks = await session.range(start, prefix_end(start))
    if len(chunks) != count:
        raise LogCorruptedError(f"{where}: {len(chunks)} of {count} chunks")
    joined = b"".join(chunk.value for chunk in chunks)
    if len(joined) != total:
        raise LogCorruptedError(f"{where}: {len(joined)} of {total} bytes")
    return _decode(joined, where)


async def read_records(
    session: EtcdSession, keys: GroupKeys, position: int
) -> AsyncIterator[LogBatch]:
    """Every stored record whose entries lie at or after `position`, in order."""
    holding = await session.range(
        keys.records, keys.record(position) + b"\x00", limit=1, descending=True, keys_only=True
    )
    start = holding[0].key if holding else keys.records
    while True:
        page = await session.range(start, keys.records_end, limit=READ_PAGE)
        for entry in page:
            batch = await record_of(session, keys, entry)
            if batch.last_position >= position:
                yield batch
        if len(page) < READ_PAGE:
            return
        start = page[-1].key + b"\x00"


async def log_bounds(session: EtcdSession, keys: GroupKeys) -> tuple[int, LogBatch | None]:
    """(first position stored, the last record) of the log; (0, None) when it is empty."""
    first = await session.range(keys.records, keys.records_end, limit=1, keys_only=True)
    if not first:
        return 0, None
    (last_key,) = await session.range(keys.records, keys.records_end, limit=1, descending=True)
    return keys.position_of(first[0].key), await record_of(session, keys, last_key)


class EtcdLogReader:
    """The log as a follower sees it: readable, never appended to (`LogStore` for recovery)."""

    def __init__(self, session: EtcdSession, keys: GroupKeys) -> None:
        self.session = session
        self.keys = keys

    async def open(self) -> LogTail:
        first, last = await log_bounds(self.session, self.keys)
        return LogTail(
            first_position=first or 1,
            last_position=last.last_position if last is not None else 0,
            consensus_time_ms=last.consensus_time_ms if last is not None else 0,
            torn_bytes_dropped=0,
        )

    def append(self, batch: LogBatch, record: bytes) -> Awaitable[None]:
        raise LogFencedError("a follower does not append")

    def read_from(self, position: int) -> AsyncIterator[LogBatch]:
        return read_records(self.session, self.keys, position)

    async def truncate_before(self, position: int) -> None:
        """Only the leader deletes records."""

    async def close(self) -> None:
        """The session belongs to the caller, who closes it."""


class EtcdLogStore:
    """The log of one term's leader: appends fenced by the leader key's create revision."""

    def __init__(
        self,
        session: EtcdSession,
        keys: GroupKeys,
        term: int,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        append_timeout_s: float = 5.0,
    ) -> None:
        if term <= 0:
            raise ValueError("a term is the leader key's create revision, > 0")
        self.session = session
        self.keys = keys
        self.term = term
        self.chunk_bytes = chunk_bytes
        self.append_timeout_s = append_timeout_s
        self._fence = Guard(keys.leader, term)
        self.appends = 0
        self.append_retries = 0
        # A benchmark's probe: when a list, each append's round trip (ns) joins it, so
        # an entry's wait for the append before its own can be told apart.
        self.append_samples_ns: list[int] | None = None

    async def open(self) -> LogTail:
        first, last = await log_bounds(self.session, self.keys)
        last_position = last.last_position if last is not None else 0
        # Chunks past the end belong to a record whose manifest was never written.
        orphans_from = self.keys.chunk_prefix(last_position + 1)
        await self._guarded(deletes=((orphans_from, prefix_end(self.keys.chunks)),))
        return LogTail(
            first_position=first or 1,
            last_position=last_position,
            consensus_time_ms=last.consensus_time_ms if last is not None else 0,
            torn_bytes_dropped=0,
        )

    def append(self, batch: LogBatch, record: bytes) -> Awaitable[None]:
        return asyncio.ensure_future(self._append(batch.first_position, record))

    async def _append(self, first_position: int, record: bytes) -> None:
        started_ns = time.perf_counter_ns()
        key = self.keys.record(first_position)
        if len(record) + 1 <= self.chunk_bytes:
            await self._put_new(key, RECORD + record)
        else:
            pieces = [
                record[start : start + self.chunk_bytes]
                for start in range(0, len(record), self.chunk_bytes)
            ]
            for index, piece in enumerate(pieces):
                await self._put_new(self.keys.chunk(first_position, index), piece)
            await self._put_new(key, MANIFEST + _MANIFEST.pack(len(pieces), len(record)))
        self.appends += 1
        if self.append_samples_ns is not None:
            self.append_samples_ns.append(time.perf_counter_ns() - started_ns)

    async def _put_new(self, key: bytes, value: bytes) -> None:
        """Put `key`, guarded by the term and by `key` being absent; retried while etcd
        does not answer, for at most `append_timeout_s`.

        Each attempt gets at most `ATTEMPT_TIMEOUT_S`: a request that reached a member
        just as etcd's leader died is forwarded to the dead leader and never answered,
        while a new etcd leader is elected in about a second. Retrying is safe: the
        key's absence is part of the guard, and a failed guard reads the key back."""
        deadline = time.monotonic() + self.append_timeout_s
        while True:
            attempt_s = max(0.05, min(ATTEMPT_TIMEOUT_S, deadline - time.monotonic()))
            try:
                if await self.session.transaction(
                    (self._fence, Guard(key, ABSENT)), puts=((key, value),), timeout_s=attempt_s
                ):
                    return
                # A guard failed: our own earlier attempt committed, or the term is over.
                stored = await self.session.get(key)
                if stored is not None and stored.value == value:
                    return
                raise LogFencedError(
                    f"term {self.term} is over: {key.decode()} not appended"
                    f" (leader key {self.keys.leader.decode()} changed)"
                )
            except CoordinationUnavailable as error:
                if time.monotonic() >= deadline:
                    raise LogUnavailableError(f"append of {key.decode()}: {error}") from error
                self.append_retries += 1
                await asyncio.sleep(APPEND_RETRY_S)

    async def _guarded(self, *, deletes: tuple[tuple[bytes, bytes], ...]) -> None:
        if not await self.session.transaction((self._fence,), deletes=deletes):
            raise LogFencedError(f"term {self.term} is over")

    def read_from(self, position: int) -> AsyncIterator[LogBatch]:
        return read_records(self.session, self.keys, position)

    async def truncate_before(self, position: int) -> None:
        """Delete the records whose entries all lie before `position`, and their chunks."""
        holding = await self.session.range(
            self.keys.records,
            self.keys.record(position) + b"\x00",
            limit=1,
            descending=True,
            keys_only=True,
        )
        if not holding:
            return
        keep_from = self.keys.position_of(holding[0].key)
        await self._guarded(
            deletes=(
                (self.keys.records, self.keys.record(keep_from)),
                (self.keys.chunks, self.keys.chunk_prefix(keep_from)),
            )
        )

    async def close(self) -> None:
        """The session belongs to the caller, who closes it."""
