"""TCP ports on the loopback interface: picking free ones and telling whether one is taken."""

from __future__ import annotations

import contextlib
import socket

from services.infra.errors import InfraError

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the kernel's pick for a bind to port 0)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> tuple[int, ...]:
    """`count` distinct free ports."""
    # Every socket stays bound until all are picked; binding them one after another could
    # hand out the same port twice.
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for sock in sockets:
            sock.bind((host, 0))
        return tuple(int(sock.getsockname()[1]) for sock in sockets)


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
