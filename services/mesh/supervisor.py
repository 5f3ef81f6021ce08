"""Supervised child processes with readable status and a clean stop.

Each child is an `oms <service>` process. Its output lines are relayed with the
child's name in front; if it exits unexpectedly it is restarted after a
backoff, and after `max_restarts` failures inside `restart_window_s` the
supervisor gives up on the whole mesh rather than flapping forever. Stopping
sends SIGTERM to every child, waits `grace_s`, then SIGKILLs what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: Sequence[str]
    environment: dict[str, str] = field(default_factory=dict)
    address: str = ""  # host:port its gRPC health answers on, if any


class MeshFailedError(RuntimeError):
    """A child kept failing; the mesh was stopped."""


class Supervisor:
    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        grace_s: float = 10.0,
        max_restarts: int = 5,
        restart_window_s: float = 60.0,
        backoff_s: float = 0.5,
    ) -> None:
        self.children = list(children)
        self.grace_s = grace_s
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.backoff_s = backoff_s
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()

    def status_lines(self) -> list[str]:
        lines = []
        for child in self.children:
            process = self._processes.get(child.name)
            state = "running" if process and process.returncode is None else "stopped"
            pid = f"pid {process.pid}" if process else ""
            lines.append(f"{child.name:<11}{state:<9}{pid}")
        return lines

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Run every child until `stop()`; raise `MeshFailedError` if one keeps failing."""
        async with asyncio.TaskGroup() as group:
            for child in self.children:
                group.create_task(self._keep_running(child))
            group.create_task(self._stop_all_when_asked())

    async def _keep_running(self, child: ChildSpec) -> None:
        failures: deque[float] = deque()
        while not self._stopping.is_set():
            process = await asyncio.create_subprocess_exec(
                *child.argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**_base_environment(), **child.environment},
            )
            self._processes[child.name] = process
            print(f"[mesh] {child.name} started (pid {process.pid})", flush=True)
            await self._relay(child.name, process)
            code = await process.wait()
            if self._stopping.is_set():
                return
            now = time.monotonic()
            failures.append(now)
            while failures and now - failures[0] > self.restart_window_s:
                failures.popleft()
            print(f"[mesh] {child.name} exited with {code}; restarting", flush=True)
            if len(failures) > self.max_restarts:
                self._stopping.set()
                raise MeshFailedError(
                    f"{child.name} failed {len(failures)} times in {self.restart_window_s:.0f} s"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.backoff_s * len(failures)):
                    await self._stopping.wait()

    async def _relay(self, name: str, process: asyncio.subprocess.Process) -> None:
        if process.stdout is None:
            return
        async for line in process.stdout:
            sys.stdout.write(f"{name:<10}| {line.decode(errors='replace')}")
            sys.stdout.flush()

    async def _stop_all_when_asked(self) -> None:
        await self._stopping.wait()
        processes = [p for p in self._processes.values() if p.returncode is None]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.create_task(process.wait()) for process in processes]
        if waits:
            _, still_running = await asyncio.wait(waits, timeout=self.grace_s)
            if still_running:
                for process in processes:
                    if process.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            process.kill()
                await asyncio.gather(*still_running)


def _base_environment() -> dict[str, str]:
    return dict(os.environ)
