"""A filesystem that loses every write not yet synced when its process dies: a power cut.

In the style of LazyFS (INESC TEC): a FUSE filesystem over a backing folder that keeps
each file's unsynced data in its own memory, as a kernel's page cache would, and puts
it in the backing folder only when the data is made durable: `fsync`/`fdatasync` of
the file, or a write through a descriptor opened with `O_DSYNC` or `O_SYNC`. SIGKILL
of this process is the power cut: what was only in its memory is gone, and the next
mount over the same backing folder shows exactly what was synced.

The fault model, stated: file data (writes, truncations, preallocation) is lost unless
synced; directory operations (create, rename, unlink, mkdir) reach the backing folder
at once, as on a filesystem that journals metadata synchronously. A rename of an
unsynced file keeps its data unsynced under the new name.

    python -m tests.power_cut.lazy_filesystem BACKING MOUNTPOINT

runs in the foreground, one thread, until unmounted or killed
(`tests/power_cut/power_cut_disk.py` drives it).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import mfusepy

SYNC_FLAGS = os.O_DSYNC | os.O_SYNC
STAT_FIELDS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
TIME_FIELDS = ("st_atime", "st_mtime", "st_ctime")


class LazyFilesystem(mfusepy.Operations):  # type: ignore[misc]  # mfusepy has no types
    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        # A file once written: its whole content as this filesystem shows it (the page
        # cache), and the byte ranges of it not yet synced to the backing file. The cache
        # stays after a sync, so a log synced at every append is not read back each time.
        self.cache: dict[str, bytearray] = {}
        self.dirty: dict[str, list[tuple[int, int]]] = {}  # path -> [(start, end)]
        self.resized: set[str] = set()  # paths whose size changed since their last sync
        self.handles: dict[int, tuple[str, bool]] = {}  # handle -> (path, writes sync)
        self.next_handle = 1

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _content(self, path: str) -> bytearray:
        """The file's content, read from the backing file once."""
        content = self.cache.get(path)
        if content is None:
            content = bytearray(Path(self._real(path)).read_bytes())
            self.cache[path] = content
        return content

    def _sync(self, path: str) -> None:
        """What of `path` is not on the backing file yet goes there, and is synced."""
        ranges = self.dirty.pop(path, None)
        resized = path in self.resized
        self.resized.discard(path)
        if ranges is None and not resized:
            return
        content = self.cache[path]
        descriptor = os.open(self._real(path), os.O_WRONLY)
        try:
            for start, end in sorted(ranges or ()):
                view = memoryview(content)[start : min(end, len(content))]
                written = 0
                while written < len(view):
                    written += os.pwrite(descriptor, view[written:], start + written)
            os.ftruncate(descriptor, len(content))
            os.fdatasync(descriptor)
        finally:
            os.close(descriptor)

    def _forget(self, path: str) -> None:
        self.cache.pop(path, None)
        self.dirty.pop(path, None)
        self.resized.discard(path)

    def _handle(self, path: str, flags: int) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = (path, bool(flags & SYNC_FLAGS))
        return handle

    # --- metadata ----------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        try:
            stat = os.lstat(self._real(path))
        except OSError as error:
            raise mfusepy.FuseOSError(error.errno or errno.EIO) from None
        attributes: dict[str, Any] = {name: getattr(stat, name) for name in STAT_FIELDS}
        for name in TIME_FIELDS:
            attributes[name] = getattr(stat, name + "_ns")
        content = self.cache.get(path)
        if content is not None:
            attributes["st_size"] = len(content)
        return attributes

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def statfs(self, path: str) -> dict[str, int]:
        stat = os.statvfs(self._real(path))
        return {
            name: getattr(stat, name)
            for name in (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
        }

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._real(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._real(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._real(path))
        self._forget(path)

    def rename(self, old: str, new: str) -> None:
        os.rename(self._real(old), self._real(new))
        self._forget(new)
        if old in self.cache:
            self.cache[new] = self.cache.pop(old)
        if old in self.dirty:
            self.dirty[new] = self.dirty.pop(old)
        if old in self.resized:
            self.resized.discard(old)
            self.resized.add(new)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._real(path), mode)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)

    def access(self, path: str, amode: int) -> None:
        if not os.access(self._real(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)

    # --- data ----------------------------------------------------------------------

    def create(self, path: str, mode: int, flags: int) -> int:
        descriptor = os.open(self._real(path), os.O_WRONLY | os.O_CREAT, mode)
        os.close(descriptor)
        return self._handle(path, flags)

    def open(self, path: str, flags: int) -> int:
        if not os.path.exists(self._real(path)):
            raise mfusepy.FuseOSError(errno.ENOENT)
        return self._handle(path, flags)

    def release(self, path: str, fh: int) -> None:
        self.handles.pop(fh, None)  # closing syncs nothing

    def flush(self, path: str, fh: int) -> None:
        pass

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        content = self.cache.get(path)
        if content is not None:
            return bytes(content[offset : offset + size])
        descriptor = os.open(self._real(path), os.O_RDONLY)
        try:
            return os.pread(descriptor, size, offset)
        finally:
            os.close(descriptor)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        _, synchronous = self.handles.get(fh, (path, False))
        if synchronous and path not in self.cache:
            # O_DSYNC onto a file never cached: straight through, costing only this write.
            descriptor = os.open(self._real(path), os.O_WRONLY)
            try:
                written = 0
                while written < len(data):
                    written += os.pwrite(descriptor, data[written:], offset + written)
                os.fdatasync(descriptor)
            finally:
                os.close(descriptor)
            return len(data)
        content = self._content(path)
        end = offset + len(data)
        if end > len(content):
            content.extend(bytes(end - len(content)))
            self.resized.add(path)
        content[offset:end] = data
        self.dirty.setdefault(path, []).append((offset, end))
        if synchronous:
            self._sync(path)  # this write and the file's earlier unsynced ones, durable
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        content = self._content(path)
        if length < len(content):
            del content[length:]
        else:
            content.extend(bytes(length - len(content)))
        self.resized.add(path)

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> None:
        if mode:
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        content = self._content(path)
        if offset + size > len(content):
            content.extend(bytes(offset + size - len(content)))
            self.resized.add(path)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self._sync(path)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        pass  # directory operations reach the backing folder at once


def main(arguments: list[str]) -> int:
    backing, mountpoint = (Path(argument) for argument in arguments)
    mfusepy.FUSE(
        LazyFilesystem(backing.resolve()),
        str(mountpoint),
        foreground=True,
        nothreads=True,
        # No kernel caching of names or sizes: every question reaches this process.
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
