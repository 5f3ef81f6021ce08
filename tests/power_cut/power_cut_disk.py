"""A disk whose power can be cut: `lazy_filesystem.py` mounted over a backing folder.

    with PowerCutDisk(tmp_path / "disk") as disk:
        ... processes write under disk.root ...
        kill them, then disk.cut()        # unsynced writes are gone
        disk.mount()                       # the same backing folder, as synced

`cut` SIGKILLs the filesystem's process (its memory is the page cache that is lost) and
detaches the mount; a process still using it then sees errors, as a machine without
power would see nothing: kill the disk's users first. Needs /dev/fuse, Debian's fuse3
(libfuse3 and fusermount3) and mfusepy; `unavailable()` says what is missing, for a
skip.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[2]
MOUNT_TIMEOUT_S = 15.0
POLL_S = 0.01


def unavailable() -> str | None:
    """Why a power-cut disk cannot be mounted here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3: apt-get install fuse3 (Debian), run as root by `make install`"
    try:
        importlib.import_module("mfusepy")  # loads libfuse3
    except (ImportError, OSError) as error:
        return f"mfusepy cannot load libfuse3: {error}"
    return None


class PowerCutDisk:
    def __init__(self, folder: Path) -> None:
        self.backing = folder / "backing"
        self.root = folder / "disk"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "filesystem.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.cuts = 0

    def __enter__(self) -> PowerCutDisk:
        self.mount()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cut()

    def mount(self) -> None:
        assert self.process is None, "already mounted"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.power_cut.lazy_filesystem", str(self.backing),
                 str(self.root)],
                cwd=REPO_ROOT,
                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not self.mounted():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.cut()
                raise AssertionError(
                    f"the power-cut filesystem did not mount: {self.log_path.read_text()[-2000:]}"
                )
            time.sleep(POLL_S)  # a mount is not an event one can wait on

    def cut(self) -> None:
        """The power goes: whatever was not synced is lost."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            process.wait()
            self.cuts += 1
        if self.mounted():
            subprocess.run(["fusermount3", "-u", "-z", str(self.root)], check=True)

    def mounted(self) -> bool:
        # Not os.path.ismount: a mount whose filesystem died fails lstat, and looks unmounted.
        target = str(self.root.resolve())
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1] == target for line in mounts)
