"""TCP ports on the loopback interface: picking free ones and telling whether one is taken."""

from __future__ import annotations

import contextlib
import socket

from services.infra.errors import InfraError

LOOPBACK = "127.0.0.1"
MAX_PICKS = 1_000
# Ports this process handed out. A port is free when picked but nobody holds it until
# its server binds, so the kernel may pick it again for the next caller: two services
# of one mesh would then be given one address.
_handed_out: set[tuple[str, int]] = set()


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the kernel's pick for a bind to port 0)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> tuple[int, ...]:
    """`count` distinct free ports, none handed out by this process before."""
    # Every socket stays bound until all are picked, so one call never repeats a port.
    picked: list[int] = []
    with contextlib.ExitStack() as stack:
        for _ in range(MAX_PICKS):
            if len(picked) == count:
                break
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if (host, port) not in _handed_out:
                picked.append(port)
        if len(picked) < count:
            raise InfraError(f"no {count} free ports on {host} in {MAX_PICKS} picks")
    _handed_out.update((host, port) for port in picked)
    return tuple(picked)


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
    """Raise InfraError naming the port when a server could not bind it."""
    if not port_is_free(host, port):
        raise InfraError(
            f"{purpose} port {port} on {host} is already in use: "
            "set another port, or leave it unset to pick a free one"
        )
