"""TCP ports on the loopback interface: picking free ones and telling whether one is taken."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Callable
from pathlib import Path

from services.infra.errors import InfraError, PortTakenError

LOOPBACK = "127.0.0.1"
MAX_PICKS = 1_000
# Listening ports come from below the kernel's ephemeral range, never from it: a port in
# that range that is free when picked can become the source port of any outgoing
# connection on the machine (a gRPC client, a database pool) before its server binds it,
# and the server then fails with "address already in use". A busy test mesh opens
# thousands of connections, and initdb holds the window open for a second or two.
# Google's portpicker avoids the range for the same reason.
_LOWEST_PICK = 15_000
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_DEFAULT_EPHEMERAL = (32_768, 60_999)
_pick_source = random.SystemRandom()
# A picked port is free when picked, not when its server binds it: another process on
# the machine may take it in between, whatever range it comes from. Starts that lose
# that race pick again, this many times in all.
START_ATTEMPTS = 3
# Ports this process handed out. A port is free when picked but nobody holds it until
# its server binds, so the kernel may pick it again for the next caller: two services
# of one mesh would then be given one address.
_handed_out: set[tuple[str, int]] = set()


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing is bound to right now, outside the kernel's ephemeral range."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> tuple[int, ...]:
    """`count` distinct free ports, none handed out by this process before."""
    # Every socket stays bound until all are picked, so one call never repeats a port.
    picked: list[int] = []
    candidates = listening_port_range()
    with contextlib.ExitStack() as stack:
        for _ in range(MAX_PICKS):
            if len(picked) == count:
                break
            port = _pick_source.choice(candidates) if candidates else 0
            if (host, port) in _handed_out:
                continue
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            # No SO_REUSEADDR: a port with connections lingering in TIME_WAIT is skipped too.
            try:
                sock.bind((host, port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
            if (host, port) not in _handed_out:
                picked.append(port)
        if len(picked) < count:
            raise InfraError(f"no {count} free ports on {host} in {MAX_PICKS} picks")
    _handed_out.update((host, port) for port in picked)
    return tuple(picked)


def listening_port_range() -> range:
    """Ports worth picking for servers: from 15,000 up to the start of the ephemeral range.

    Empty when the machine's ephemeral range leaves no room below it; callers then fall
    back to the kernel's pick.
    """
    low, _ = _ephemeral_range()
    return range(_LOWEST_PICK, low)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = _EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _LINUX_DEFAULT_EPHEMERAL


def port_is_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connect to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_is_free(host: str, port: int) -> bool:
    """True when a server could bind host:port now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # etcd and postgres bind with SO_REUSEADDR, so a port held only by connections in
        # TIME_WAIT is usable to them; probing the same way avoids false alarms.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def require_free_port(host: str, port: int, purpose: str) -> None:
    """Raise PortTakenError naming the port when a server could not bind it."""
    if not port_is_free(host, port):
        raise PortTakenError(
            f"{purpose} port {port} on {host} is already in use: "
            "set another port, or leave it unset to pick a free one"
        )


def start_with_repicks(start: Callable[[], None], repick: Callable[[], None] | None) -> None:
    """Run `start`; when it fails on a taken port, `repick` and start again.

    `repick` is None when the caller chose the ports: then the first failure stands,
    naming the port, since picking another would ignore the caller's choice.
    """
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            start()
            return
        except PortTakenError:
            if repick is None or attempt == START_ATTEMPTS:
                raise
            repick()
