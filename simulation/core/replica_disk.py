"""A replica's snapshot files on a disk that can lose, tear and flip what it holds.

A snapshot is written, then synced a little later. A crash before the sync loses
the file or leaves it torn (cut short); a flipped byte can hit any file. Every file
carries a CRC of its header and payload, so recovery skips a damaged one and takes
the next newest (the real `snapshot_files.py` does the same), or a peer's.
"""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass

from services.runtime.core.snapshot_policy import log_needed_after, snapshots_to_keep

_HEADER = struct.Struct("<QQ")
SNAPSHOTS_KEPT = 2


@dataclass(slots=True)
class SnapshotFile:
    position: int
    consensus_time_ms: int
    payload: bytes
    checksum: int
    synced: bool = False

    def valid(self) -> bool:
        header = _HEADER.pack(self.position, self.consensus_time_ms)
        return zlib.crc32(header + self.payload) == self.checksum


class ReplicaDisk:
    def __init__(self) -> None:
        self.files: list[SnapshotFile] = []  # oldest first
        self.damaged_skipped = 0

    def write(self, position: int, consensus_time_ms: int, payload: bytes) -> SnapshotFile:
        header = _HEADER.pack(position, consensus_time_ms)
        file = SnapshotFile(position, consensus_time_ms, payload, zlib.crc32(header + payload))
        # Kept in position order (a replay from an older snapshot writes older ones again),
        # one file per position, as file names are.
        self.files = [f for f in self.files if f.position != position]
        self.files.append(file)
        self.files.sort(key=lambda f: f.position)
        return file

    def sync(self, file: SnapshotFile, egress_floor: int | None) -> None:
        """The file is on disk; older ones go but the newest `SNAPSHOTS_KEPT` and the
        newest at or before `egress_floor` (`snapshot_policy`, as `snapshot_files.py`)."""
        if file not in self.files:
            return
        file.synced = True
        synced = [f for f in self.files if f.synced]
        kept = set(snapshots_to_keep([f.position for f in synced], SNAPSHOTS_KEPT, egress_floor))
        for old in synced:
            if old.position not in kept:
                self.files.remove(old)

    def crash(self, rng: random.Random) -> list[str]:
        """The power goes: each unsynced file is lost or left torn."""
        happened = []
        for file in list(self.files):
            if file.synced:
                continue
            if rng.randrange(2):
                self.files.remove(file)
                happened.append(f"lost snapshot {file.position}")
            else:
                file.payload = file.payload[: rng.randrange(max(1, len(file.payload)))]
                file.synced = True
                happened.append(f"torn snapshot {file.position}")
        return happened

    def corrupt(self, rng: random.Random) -> str | None:
        """A flipped bit in the newest snapshot (the one a restart reads first)."""
        if not self.files:
            return None
        file = self.files[-1]
        if not file.payload:
            return None
        at = rng.randrange(len(file.payload))
        flipped = bytes([file.payload[at] ^ (1 << rng.randrange(8))])
        file.payload = file.payload[:at] + flipped + file.payload[at + 1 :]
        return f"flipped a bit of snapshot {file.position} at byte {at}"

    def newest_valid(
        self, check: bool = True, at_or_before: int | None = None
    ) -> SnapshotFile | None:
        for file in reversed(self.files):
            if at_or_before is not None and file.position > at_or_before:
                continue
            if not check or file.valid():
                return file
            self.damaged_skipped += 1
        return None

    def positions(self) -> list[int]:
        """Of every file here, ascending (a damaged one is found when it is read)."""
        return sorted(file.position for file in self.files)

    def log_needed_after(self, egress_floor: int | None) -> int:
        """What this replica could recover from without the log before it, its egress
        floor's snapshot included (`snapshot_policy.log_needed_after`)."""
        valid = [file.position for file in self.files if file.synced and file.valid()]
        return log_needed_after(valid, egress_floor)
