"""Snapshot files: one consistent image of a state machine at one log position.

    magic u32 | format u16 | position u64 | consensus_time_ms u64 |
    hash_length u16 | body_length u64 | crc32(header fields + hash + body) u32 |
    hash | body

The checksum covers the header fields too: a flipped bit in `position` would
otherwise skip log entries silently. The position must also match the name.

A snapshot is written to a temporary name, fsynced, then renamed into place and
the folder fsynced, so a crash leaves either the old set or the new one. Loading
verifies the checksum; a damaged newest snapshot is reported and the next older
one is used (the log is kept back far enough for that).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import structlog

from services.runtime.core.snapshot_policy import snapshots_to_keep
from services.runtime.file_log import fsync_directory

log = structlog.get_logger(__name__)

SNAPSHOT_MAGIC = 0x4F4D5353  # "OMSS"
SNAPSHOT_FORMAT = 1
SNAPSHOT_HEADER = struct.Struct("<IHQQHQI")
_CHECKED_FIELDS = struct.Struct("<IHQQHQ")
SNAPSHOT_PREFIX = "snapshot-"
SNAPSHOT_SUFFIX = ".snap"


class SnapshotCorruptedError(ValueError):
    """A snapshot file is truncated or fails its checksum."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    position: int
    consensus_time_ms: int
    state_hash: bytes
    body: bytes


def snapshot_name(position: int) -> str:
    return f"{SNAPSHOT_PREFIX}{position:020d}{SNAPSHOT_SUFFIX}"


def write_snapshot_file(path: Path, snapshot: Snapshot) -> None:
    """Write and fsync `snapshot` to `path` (not yet published)."""
    fields = (
        SNAPSHOT_MAGIC,
        SNAPSHOT_FORMAT,
        snapshot.position,
        snapshot.consensus_time_ms,
        len(snapshot.state_hash),
        len(snapshot.body),
    )
    checksum = _checksum(_CHECKED_FIELDS.pack(*fields), snapshot.state_hash, snapshot.body)
    header = SNAPSHOT_HEADER.pack(*fields, checksum)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (header, snapshot.state_hash, snapshot.body):
            view = memoryview(chunk)
            while view:
                view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _checksum(fields: bytes, state_hash: bytes, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(state_hash, zlib.crc32(fields)))


def read_snapshot_file(path: Path, expected_position: int | None = None) -> Snapshot:
    data = path.read_bytes()
    if len(data) < SNAPSHOT_HEADER.size:
        raise SnapshotCorruptedError(f"{path}: truncated header")
    magic, file_format, position, consensus_time_ms, hash_length, body_length, checksum = (
        SNAPSHOT_HEADER.unpack_from(data, 0)
    )
    if magic != SNAPSHOT_MAGIC or file_format != SNAPSHOT_FORMAT:
        raise SnapshotCorruptedError(f"{path}: not a snapshot of format {SNAPSHOT_FORMAT}")
    hash_start = SNAPSHOT_HEADER.size
    body_start = hash_start + hash_length
    if len(data) != body_start + body_length:
        raise SnapshotCorruptedError(
            f"{path}: expected {body_start + body_length} bytes, found {len(data)}"
        )
    state_hash = data[hash_start:body_start]
    body = data[body_start:]
    fields = _CHECKED_FIELDS.pack(
        magic, file_format, position, consensus_time_ms, hash_length, body_length
    )
    if _checksum(fields, state_hash, body) != checksum:
        raise SnapshotCorruptedError(f"{path}: checksum mismatch")
    if expected_position is not None and position != expected_position:
        raise SnapshotCorruptedError(
            f"{path}: holds position {position} but is named for {expected_position}"
        )
    return Snapshot(position, consensus_time_ms, state_hash, body)


class FileSnapshotStore:
    """Snapshots as files in one folder, newest kept plus `retained - 1` older ones (and
    one held back for egress consumers, see `publish`)."""

    def __init__(self, directory: Path, retained: int = 2) -> None:
        if retained < 1:
            raise ValueError("retained must be at least 1")
        self.directory = directory
        self.retained = retained
        directory.mkdir(parents=True, exist_ok=True)

    def positions(self) -> list[int]:
        found = []
        for path in self.directory.glob(f"{SNAPSHOT_PREFIX}*{SNAPSHOT_SUFFIX}"):
            digits = path.name[len(SNAPSHOT_PREFIX) : -len(SNAPSHOT_SUFFIX)]
            if digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def path_for(self, position: int) -> Path:
        return self.directory / snapshot_name(position)

    def staging_path(self, position: int) -> Path:
        return self.directory / f".{snapshot_name(position)}.partial"

    def publish(self, position: int, egress_floor: int | None = None) -> None:
        """Make the staged snapshot for `position` visible, then prune old ones: all but
        the newest `retained` and the newest at or before `egress_floor`
        (`core/snapshot_policy.py`)."""
        os.replace(self.staging_path(position), self.path_for(position))
        fsync_directory(self.directory)
        positions = self.positions()
        kept = set(snapshots_to_keep(positions, self.retained, egress_floor))
        for old in positions:
            if old not in kept:
                self.path_for(old).unlink(missing_ok=True)
        for stale in self.directory.glob(f".{SNAPSHOT_PREFIX}*.partial"):
            if stale.name != self.staging_path(position).name:
                stale.unlink(missing_ok=True)

    def discard_staged(self, position: int) -> None:
        self.staging_path(position).unlink(missing_ok=True)

    def load_newest_valid(
        self, not_before: int = 0, at_or_before: int | None = None
    ) -> Snapshot | None:
        """Newest snapshot that verifies, at or after `not_before` (and at or before
        `at_or_before`, when given)."""
        for position in reversed(self.positions()):
            if at_or_before is not None and position > at_or_before:
                continue
            if position < not_before:
                break
            path = self.path_for(position)
            try:
                return read_snapshot_file(path, expected_position=position)
            except SnapshotCorruptedError as error:
                log.error("snapshot.corrupted_skipped", path=str(path), reason=str(error))
        return None

    def oldest_retained_position(self) -> int | None:
        positions = self.positions()
        return positions[0] if positions else None
