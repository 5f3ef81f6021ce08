"""Waiting for a freshly started server to answer, without hanging."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from services.infra.errors import InfraError, PortTakenError
from services.infra.server_log import ServerLog

POLL_INTERVAL = 0.05
# What etcd ("bind: address already in use") and postgres ("could not bind IPv4
# address ...: Address already in use") print when their port was taken.
_PORT_TAKEN = "address already in use"


def wait_until_ready(
    process: subprocess.Popen[bytes],
    is_ready: Callable[[], bool],
    *,
    server: str,
    timeout: float,
    log: ServerLog,
) -> None:
    """Poll `is_ready` until it holds; raise InfraError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not is_ready():
        exit_code = process.poll()
        if exit_code is not None:
            tail = log.tail()
            error = PortTakenError if _PORT_TAKEN in tail.lower() else InfraError
            raise error(
                f"{server} exited with code {exit_code} during startup; "
                f"last lines of {log.path}:\n{tail}"
            )
        if time.monotonic() >= deadline:
            raise InfraError(
                f"{server} did not become ready within {timeout:g} s; "
                f"last lines of {log.path}:\n{log.tail()}"
            )
        time.sleep(POLL_INTERVAL)
