"""One log record: a batch of entries sharing a consensus time.

On disk and on the wire a record is

    magic u32 | body_length u32 | crc32(body) u32 | crc32(first 12 bytes) u32 | body
    body = first_position u64 | consensus_time_ms u64 | entry_count u32 | entry*
    entry = kind u8 | payload_length u32 | payload

The body checksum detects a torn or flipped record before a single entry of it
is applied; the header has its own checksum so that, when a record is damaged,
the log can still tell whether its declared length is trustworthy (and so where
the next record would start). Both sides check their invariants: encoding
refuses an empty or oversized batch, decoding refuses a body whose entries do
not add up to its declared length.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from services.runtime.core.state_machine import EntryKind

RECORD_MAGIC = 0x4F4D534C  # "OMSL"
RECORD_HEADER = struct.Struct("<IIII")
_HEADER_FIELDS = struct.Struct("<III")
BODY_HEADER = struct.Struct("<QQI")
ENTRY_HEADER = struct.Struct("<BI")
MAX_RECORD_BODY_BYTES = 64 * 1024 * 1024
_VALID_KINDS = frozenset(int(kind) for kind in EntryKind)


class RecordCorruptedError(ValueError):
    """A record's bytes do not form a valid, checksummed record."""


@dataclass(frozen=True, slots=True)
class LogBatch:
    """Entries `first_position .. first_position + len(entries) - 1`."""

    first_position: int
    consensus_time_ms: int
    entries: Sequence[tuple[int, bytes]]

    @property
    def last_position(self) -> int:
        return self.first_position + len(self.entries) - 1


def encode_batch(batch: LogBatch) -> bytes:
    if not batch.entries:
        raise ValueError("a log record holds at least one entry")
    if batch.first_position < 1 or batch.consensus_time_ms < 0:
        raise ValueError(
            f"invalid record header: {batch.first_position=} {batch.consensus_time_ms=}"
        )
    pack_entry = ENTRY_HEADER.pack
    parts = [BODY_HEADER.pack(batch.first_position, batch.consensus_time_ms, len(batch.entries))]
    for kind, payload in batch.entries:
        if kind not in _VALID_KINDS:
            raise ValueError(f"unknown entry kind {kind}")
        parts.append(pack_entry(kind, len(payload)))
        parts.append(payload)
    body = b"".join(parts)
    if len(body) > MAX_RECORD_BODY_BYTES:
        raise ValueError(f"record body of {len(body)} bytes exceeds {MAX_RECORD_BODY_BYTES}")
    return frame_record(body)


def frame_record(body: bytes) -> bytes:
    """Header (with both checksums) followed by `body`."""
    fields = _HEADER_FIELDS.pack(RECORD_MAGIC, len(body), zlib.crc32(body))
    return fields + zlib.crc32(fields).to_bytes(4, "little") + body


def record_length_at(buffer: bytes | memoryview, offset: int) -> int:
    """Total length of the record starting at `offset`, validating only its header."""
    if len(buffer) - offset < RECORD_HEADER.size:
        raise RecordCorruptedError(f"truncated record header at offset {offset}")
    magic, body_length, _, header_checksum = RECORD_HEADER.unpack_from(buffer, offset)
    fields = bytes(buffer[offset : offset + _HEADER_FIELDS.size])
    if zlib.crc32(fields) != header_checksum:
        raise RecordCorruptedError(f"header checksum mismatch at offset {offset}")
    if magic != RECORD_MAGIC:
        raise RecordCorruptedError(f"bad record magic {magic:#x} at offset {offset}")
    if body_length > MAX_RECORD_BODY_BYTES or body_length < BODY_HEADER.size:
        raise RecordCorruptedError(f"implausible body length {body_length} at offset {offset}")
    total: int = RECORD_HEADER.size + body_length
    return total


def decode_batch_at(buffer: bytes | memoryview, offset: int = 0) -> tuple[LogBatch, int]:
    """Decode the record at `offset`; return it and the offset just past it."""
    total = record_length_at(buffer, offset)
    if len(buffer) - offset < total:
        raise RecordCorruptedError(f"truncated record body at offset {offset}")
    _, body_length, checksum, _ = RECORD_HEADER.unpack_from(buffer, offset)
    body_start = offset + RECORD_HEADER.size
    body = bytes(buffer[body_start : body_start + body_length])
    if zlib.crc32(body) != checksum:
        raise RecordCorruptedError(f"checksum mismatch in record at offset {offset}")
    first_position, consensus_time_ms, count = BODY_HEADER.unpack_from(body, 0)
    entries: list[tuple[int, bytes]] = []
    cursor = BODY_HEADER.size
    unpack_entry = ENTRY_HEADER.unpack_from
    entry_header_size = ENTRY_HEADER.size
    for _ in range(count):
        if cursor + entry_header_size > body_length:
            raise RecordCorruptedError(f"entry header overruns record at offset {offset}")
        kind, length = unpack_entry(body, cursor)
        cursor += entry_header_size
        if kind not in _VALID_KINDS:
            raise RecordCorruptedError(f"unknown entry kind {kind} in record at offset {offset}")
        end = cursor + length
        if end > body_length:
            raise RecordCorruptedError(f"entry payload overruns record at offset {offset}")
        entries.append((kind, body[cursor:end]))
        cursor = end
    if cursor != body_length or count == 0:
        raise RecordCorruptedError(f"record at offset {offset} has inconsistent entry layout")
    return LogBatch(first_position, consensus_time_ms, entries), offset + total


CHECKPOINT_PAYLOAD = struct.Struct("<Q")
VERSION_PAYLOAD = struct.Struct("<I")


def encode_checkpoint(position: int, state_hash: bytes) -> bytes:
    """Payload of a CHECKPOINT entry: the leader's state hash after `position`."""
    return CHECKPOINT_PAYLOAD.pack(position) + state_hash


def decode_checkpoint(payload: bytes) -> tuple[int, bytes]:
    if len(payload) < CHECKPOINT_PAYLOAD.size:
        raise RecordCorruptedError("checkpoint payload too short")
    (position,) = CHECKPOINT_PAYLOAD.unpack_from(payload, 0)
    return position, payload[CHECKPOINT_PAYLOAD.size :]


def encode_version(version: int) -> bytes:
    """Payload of a VERSION entry: the state-machine version in force from it on."""
    if version < 1:
        raise ValueError(f"a state-machine version is positive, not {version}")
    return VERSION_PAYLOAD.pack(version)


def decode_version(payload: bytes) -> int:
    if len(payload) != VERSION_PAYLOAD.size:
        raise RecordCorruptedError("version payload of the wrong size")
    (version,) = VERSION_PAYLOAD.unpack(payload)
    return int(version)
