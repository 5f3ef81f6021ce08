"""Network partitions of one process, made by the kernel: nftables and a cgroup.

    with LinkCut(ports=[etcd_port]) as cut:
        process.command_prefix = cut.command_prefix()   # started in the cut's cgroup
        process.start_serving()
        cut.drop()                                      # its packets to etcd dropped
        ...
        cut.heal()                                      # they flow again

The process runs in a cgroup of its own (cgroup v2) from its first instruction: a
socket belongs to the cgroup its process was in when it made it, so a process moved
later would keep its open connections. An nftables table of the test's own drops
what that cgroup's sockets send to the given TCP ports on the output hook: one-way
(what the others send to it still arrives, but it can answer nothing on those links,
as behind a firewall that drops), and only that process's packets: every other
process reaches the same ports as before. The rules are on
loopback only, in a table named for this test run, removed on exit.

Needs root, Debian's nftables (`nft`) and a cgroup v2 hierarchy; `unavailable()`
says what is missing, for a skip.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tests.service_process import ServiceProcess

CGROUP_ROOT = Path("/sys/fs/cgroup")  # nft names a cgroup by its path below this
_cuts = itertools.count(1)


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (alone, or beside v1's), or None."""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, target, kind, *_ = line.split()
            if kind == "cgroup2":
                return Path(target)
    return None


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not root: nftables and cgroups need it"
    if shutil.which("nft") is None:
        return "no nft: apt-get install nftables (Debian), run as root by `make install`"
    mount = cgroup2_mount()
    if mount is None or not mount.is_relative_to(CGROUP_ROOT):
        return "no cgroup v2 hierarchy under /sys/fs/cgroup"
    return None


def _nft(*arguments: str) -> None:
    subprocess.run(["nft", *arguments], check=True, capture_output=True, text=True)


class LinkCut:
    """The packets of the processes started with `command_prefix` to `ports` on
    loopback, dropped from `drop` until `heal`."""

    def __init__(self, ports: Sequence[int]) -> None:
        mount = cgroup2_mount()
        assert mount is not None, unavailable()
        number = next(_cuts)
        self.mount = mount
        self.cgroup = mount / f"oms-test-{os.getpid()}-{number}"
        self.table = f"oms_test_{os.getpid()}_{number}"
        self.ports = list(ports)
        self.cut = False

    def __enter__(self) -> LinkCut:
        self.cgroup.mkdir()
        _nft("add", "table", "inet", self.table)
        _nft(
            "add", "chain", "inet", self.table, "out",
            "{ type filter hook output priority 0 ; policy accept ; }",
        )  # fmt: skip
        return self

    def command_prefix(self) -> list[str]:
        """A command that joins the cgroup, then execs the rest of its arguments (its
        children are born in the cgroup too)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cgroup / "cgroup.procs")]

    def restart_inside(self, process: ServiceProcess) -> None:
        """`process` killed and started again in the cut's cgroup, serving (a running
        service's sockets stay in the cgroup they were made in)."""
        process.kill()
        process.command_prefix = self.command_prefix()
        process.start_serving()

    def drop(self) -> None:
        path = str(self.cgroup.relative_to(CGROUP_ROOT))
        for port in self.ports:
            _nft(
                "add", "rule", "inet", self.table, "out", "socket", "cgroupv2", "level", "1",
                f'"{path}"', "tcp", "dport", str(port), "drop",
            )  # fmt: skip
        self.cut = True

    def heal(self) -> None:
        _nft("flush", "chain", "inet", self.table, "out")
        self.cut = False

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            _nft("delete", "table", "inet", self.table)
        # Back to the root cgroup (if it still runs), then the cgroup can go.
        with contextlib.suppress(OSError):
            for pid in (self.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.mount / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.cgroup.rmdir()
