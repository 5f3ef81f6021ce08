"""One writer per log folder: a POSIX record lock on its LOCK file, never inherited.

The lock is `fcntl(F_SETLK)` (`fcntl.lockf`), not `flock`: a `flock` lock belongs to
the open file description, which a forked child shares, so a snapshot child (see
`background_snapshot.py`) that outlived its parent kept the log fenced, and the
restarted writer failed with LogFencedError until the child exited. A child that
hung inside `os.fork` itself (in a finalizer CPython runs while it drops the other
threads' states, before any of the child's own code) did so for good. A POSIX
record lock belongs to the process: a child never holds it, and the kernel drops it
the instant the writer dies, however its children fare.

Two properties of POSIX locks are covered here: one process may lock the same file
twice, and closing any descriptor of the file drops the process's lock. So the
folders this process writes are also kept in a process-wide set, checked before
the LOCK file is even opened.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from services.runtime.errors import LogFencedError

LOCK_FILE = "LOCK"

_folders_locked_here: set[Path] = set()
_folders_guard = threading.Lock()


class FolderLock:
    """The exclusive right of this process to write `directory`'s log."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._key = directory.resolve()
        self._descriptor: int | None = None

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> None:
        """Take the lock, or raise LogFencedError naming who holds it (idempotent)."""
        if self._descriptor is not None:
            return
        with _folders_guard:
            if self._key in _folders_locked_here:
                raise LogFencedError(f"this process already writes the log in {self.directory}")
            descriptor = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:  # EAGAIN or EACCES: another process holds it
                os.close(descriptor)  # holds no lock of ours: nothing is dropped
                raise LogFencedError(
                    f"another process is writing the log in {self.directory}"
                ) from error
            _folders_locked_here.add(self._key)
            self._descriptor = descriptor

    def release(self) -> None:
        descriptor = self._descriptor
        if descriptor is None:
            return
        with _folders_guard:
            self._descriptor = None
            _folders_locked_here.discard(self._key)
            os.close(descriptor)  # closing drops the record lock

    def release_in_forked_child(self) -> None:
        """In a forked child: close the copied descriptor (the lock was never the child's)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
