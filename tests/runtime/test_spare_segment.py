"""The next segment is zero-filled in the background, paced, and never left half-made."""

from __future__ import annotations

import threading
from pathlib import Path

from services.runtime.core.log_batch import LogBatch, encode_batch
from services.runtime.core.state_machine import EntryKind
from services.runtime.file_log import SPARE_SEGMENT, FileLogStore, preallocate

SEGMENT_BYTES = 1024 * 1024


def test_a_paced_fill_makes_the_whole_zeroed_file(tmp_path: Path) -> None:
    path = tmp_path / "spare"
    preallocate(path, 3 * 128 * 1024 + 5, pause_s=0.0001)
    assert path.read_bytes() == bytes(3 * 128 * 1024 + 5)


def test_a_stopped_fill_removes_its_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "spare"
    stop = threading.Event()
    stop.set()
    preallocate(path, 32 * 1024 * 1024, pause_s=0.001, stop=stop)
    assert not path.exists()


def test_rolls_use_the_background_spare_and_close_leaves_no_partial_one(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path / "log", segment_bytes=SEGMENT_BYTES)
    store.open_sync()
    payload = bytes(200 * 1024)
    for position in range(1, 13):  # about 2.4 MiB: two rolls onto spares
        batch = LogBatch(position, position, [(int(EntryKind.COMMAND), payload)])
        store.append_sync(batch, encode_batch(batch))
    store.close_sync()
    spare = tmp_path / "log" / SPARE_SEGMENT
    # Either the fill finished before close (a whole spare) or close stopped it (none).
    assert not spare.exists() or spare.stat().st_size == SEGMENT_BYTES

    reopened = FileLogStore(tmp_path / "log", segment_bytes=SEGMENT_BYTES)
    tail = reopened.open_sync()
    assert tail.last_position == 12
    assert [batch.first_position for batch in reopened.read_sync(1)] == list(range(1, 13))
    reopened.close_sync()
