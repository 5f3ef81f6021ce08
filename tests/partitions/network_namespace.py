"""A network namespace of the test's own, for a process the test cuts off by the kernel.

    with NetworkNamespace() as namespace:
        process.host = namespace.inside                 # it listens on the namespace's side
        process.command_prefix = namespace.command_prefix()
        process.start_serving()
        namespace.drop_to(etcd_port)                    # its packets to etcd dropped
        ...
        namespace.heal()

The namespace is joined to the host by a veth pair on a /30 of its own in
10.231.0.0/16: the host's side `outside`, the namespace's `inside`. A process started
with `command_prefix` (`ip netns exec`) has the namespace's network only: its own
loopback and the veth, so whatever it reaches, it reaches over that link, and
whoever reaches it does too. `drop_to` adds, in an nftables table of the host's named
for the namespace, a rule that drops what arrives over the link from the namespace
for a TCP port of the host's: one way (what the host sends in still arrives), and
silently, as a firewall between two machines drops: the sender's kernel sends, its
TCP retransmits, its calls wait for their deadlines, and a new connection's SYN
is lost like the rest (a drop on the sender's own output hook fails its new
connections at once with EPERM instead). Nothing else the host
receives is touched. On exit the table and the namespace go, and the veth pair with
it.

Needs root, iproute2 (`ip`) and Debian's nftables (`nft`); `unavailable()` says
what is missing, for a skip.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from types import TracebackType

_namespaces = itertools.count(1)


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not root: network namespaces and nftables need it"
    if shutil.which("ip") is None:
        return "no ip: apt-get install iproute2 (Debian)"
    if shutil.which("nft") is None:
        return "no nft: apt-get install nftables (Debian), run as root by `make install`"
    return None


def _run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def _subnets_in_use() -> set[int]:
    """The third octets of the 10.231.x.0/30 subnets some interface already holds."""
    used = set()
    for line in _run("ip", "-o", "-4", "addr", "show").splitlines():
        for word in line.split():
            if word.startswith("10.231."):
                used.add(int(word.split(".")[2]))
    return used


class NetworkNamespace:
    def __init__(self) -> None:
        number = next(_namespaces)
        tag = f"{os.getpid() % 100_000}x{number}"
        self.name = f"oms-{tag}"
        self._host_link = f"oh{tag}"[:15]  # interface names are at most 15 characters
        self._inner_link = f"oi{tag}"[:15]
        self._table = f"oms_ns_{tag}"
        used = _subnets_in_use()
        start = (os.getpid() * 7 + number) % 250
        octet = next(
            (start + step) % 250 + 1 for step in range(250) if (start + step) % 250 + 1 not in used
        )
        self.outside = f"10.231.{octet}.1"
        self.inside = f"10.231.{octet}.2"

    def __enter__(self) -> NetworkNamespace:
        inside = ["ip", "netns", "exec", self.name]
        _run("ip", "netns", "add", self.name)
        try:
            _run(
                "ip",
                "link",
                "add",
                self._host_link,
                "type",
                "veth",
                "peer",
                "name",
                self._inner_link,
            )
            _run("ip", "link", "set", self._inner_link, "netns", self.name)
            _run("ip", "addr", "add", f"{self.outside}/30", "dev", self._host_link)
            _run("ip", "link", "set", self._host_link, "up")
            _run(*inside, "ip", "addr", "add", f"{self.inside}/30", "dev", self._inner_link)
            _run(*inside, "ip", "link", "set", self._inner_link, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            _run("nft", "add", "table", "inet", self._table)
            _run(
                "nft", "add", "chain", "inet", self._table, "in",
                "{ type filter hook input priority 0 ; policy accept ; }",
            )  # fmt: skip
        except BaseException:
            self._remove()
            raise
        return self

    def command_prefix(self) -> list[str]:
        """Runs the rest of a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def drop_to(self, port: int) -> None:
        """Drop what the namespace sends to the host's TCP `port`, from now on."""
        _run(
            "nft", "add", "rule", "inet", self._table, "in", "iifname", self._host_link,
            "ip", "saddr", self.inside, "tcp", "dport", str(port), "drop",
        )  # fmt: skip

    def heal(self) -> None:
        _run("nft", "flush", "chain", "inet", self._table, "in")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._remove()

    def _remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("nft", "delete", "table", "inet", self._table)
        # The host's end goes with the pair; deleting it first frees the subnet even
        # if a process left behind still holds the namespace open.
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("ip", "link", "delete", self._host_link)
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("ip", "netns", "delete", self.name)
