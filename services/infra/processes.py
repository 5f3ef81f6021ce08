"""Server processes: whether a pid still runs, and stopping one politely, then firmly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from services.infra.errors import InfraError

_PROC = Path("/proc")
_POLL_INTERVAL = 0.05
# SIGKILL cannot be ignored; this only bounds the wait for the kernel to tear the process down.
_KILL_TIMEOUT = 10.0
# Detached servers outlive the objects that started them. Holding their Popen here keeps
# Python from warning that a dropped Popen still runs, and lets stop_pid collect their exit
# status when the same process later stops them (tests do).
_detached_children: dict[int, subprocess.Popen[bytes]] = {}


def pid_is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    if pid <= 0:
        return False
    stat_file = _PROC / str(pid) / "stat"
    if _PROC.is_dir():
        try:
            stat = stat_file.read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        # A zombie has exited but waits to be reaped; in a container whose pid 1 never reaps,
        # it would look alive forever to kill(pid, 0).
        state = stat.rsplit(")", 1)[-1].split()[0]
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_command_line(pid: int) -> str | None:
    """The command line of `pid` joined by spaces, or None when it cannot be read."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def pid_runs(pid: int, marker: str) -> bool:
    """True when `pid` runs and its command line mentions `marker` (e.g. its data folder).

    A pid recorded on disk may have been reused by an unrelated program after a reboot or
    crash; checking the command line keeps us from signalling a stranger.
    """
    if not pid_is_running(pid):
        return False
    command_line = pid_command_line(pid)
    return command_line is None or marker in command_line


def track_detached(process: subprocess.Popen[bytes]) -> None:
    """Remember a detached server we spawned until someone stops it."""
    _detached_children[process.pid] = process


def stop_child(
    process: subprocess.Popen[bytes],
    polite: signal.Signals,
    timeout: float,
    *,
    own_group: bool,
) -> None:
    """Stop a process we spawned: `polite` signal, then SIGKILL after `timeout` seconds."""
    _detached_children.pop(process.pid, None)
    if process.poll() is not None:
        return
    process.send_signal(polite)
    try:
        process.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    _kill(process.pid, own_group=own_group)
    try:
        process.wait(_KILL_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        raise InfraError(f"pid {process.pid} survived SIGKILL for {_KILL_TIMEOUT:g} s") from error


def stop_pid(pid: int, polite: signal.Signals, timeout: float, *, own_group: bool) -> None:
    """Stop a process known only by pid (e.g. started by an earlier `oms infra up`)."""
    child = _detached_children.pop(pid, None)
    if child is not None and child.poll() is None:
        stop_child(child, polite, timeout, own_group=own_group)
        return
    if not pid_is_running(pid):
        _reap(pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, polite)
    if _wait_gone(pid, timeout):
        return
    _kill(pid, own_group=own_group)
    if not _wait_gone(pid, _KILL_TIMEOUT):
        raise InfraError(f"pid {pid} survived SIGKILL for {_KILL_TIMEOUT:g} s")


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(pid)
        if not pid_is_running(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_INTERVAL)


def _reap(pid: int) -> None:
    # When the server is our own child (started detached by this same process), nobody
    # else will collect its exit status.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _kill(pid: int, *, own_group: bool) -> None:
    # A server started in its own session leads a process group; killing the group also
    # takes down workers (postgres backends) that would otherwise linger.
    with contextlib.suppress(ProcessLookupError):
        if own_group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
