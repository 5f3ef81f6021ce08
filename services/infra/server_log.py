"""A server's stdout/stderr file, quoted in error messages."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

# Enough for the last lines of any startup failure without reading a huge log.
_TAIL_BYTES = 64 * 1024


class ServerLog:
    """Appends each run to one file and remembers where the current run began.

    Appending keeps the history of earlier runs for debugging; quoting only the current
    run keeps error messages about this start, not an old one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._run_start = 0

    def open_for_run(self) -> BinaryIO:
        """Open for appending; the caller hands the file to the process and closes its copy."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.path.open("ab")
        self._run_start = log_file.tell()
        return log_file

    def tail(self, lines: int = 30) -> str:
        """The last `lines` lines written since `open_for_run`."""
        try:
            with self.path.open("rb") as log_file:
                size = log_file.seek(0, 2)
                log_file.seek(max(self._run_start, size - _TAIL_BYTES))
                text = log_file.read().decode(errors="replace")
        except OSError as error:
            return f"(log {self.path} unreadable: {error})"
        kept = text.splitlines()[-lines:]
        return "\n".join(kept) if kept else "(log is empty)"
