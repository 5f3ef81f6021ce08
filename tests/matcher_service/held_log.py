"""An in-process matcher host whose log becomes durable only when the test says so.

`HeldLog` wraps the real file log: while `holding`, every append is written at
once but reported durable only when the test calls `release_next()`. That makes
the window between "applied" and "durable" as long as a test needs, so what the
service shows from that window can be checked deterministically, without a
slow disk or a crash at the right microsecond.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from services.coordination.writer_tokens import WriterFences
from services.matcher.command import engine_settings
from services.matcher.core.machine import MatcherEgress, MatcherMachine
from services.matcher.service import MatcherServicer
from services.matcher.settings import MatcherServiceSettings
from services.runtime.core.log_batch import LogBatch
from services.runtime.egress_feed import DurableEgressFeed
from services.runtime.file_log import FileLogStore
from services.runtime.hosting import HostPlan, RuntimeHost
from services.runtime.log_store import LogTail
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings


class HeldLog:
    """Implements `services.runtime.log_store.LogStore` around a `FileLogStore`."""

    def __init__(self, directory: Path) -> None:
        self.inner = FileLogStore(directory)
        self.holding = False
        self.held: deque[tuple[LogBatch, asyncio.Event]] = deque()

    async def open(self) -> LogTail:
        return await self.inner.open()

    def append(self, batch: LogBatch, record: bytes) -> Awaitable[None]:
        written = self.inner.append(batch, record)
        if not self.holding:
            return written
        release = asyncio.Event()
        self.held.append((batch, release))

        async def durable() -> None:
            await written
            await release.wait()

        return asyncio.ensure_future(durable())

    def release_next(self) -> LogBatch:
        batch, release = self.held.popleft()
        release.set()
        return batch

    def read_from(self, position: int) -> AsyncIterator[LogBatch]:
        return self.inner.read_from(position)

    async def truncate_before(self, position: int) -> None:
        await self.inner.truncate_before(position)

    async def close(self) -> None:
        await self.inner.close()


def held_host(data_dir: Path) -> tuple[RuntimeHost[MatcherEgress], HeldLog]:
    """The matcher group g1 as `oms matcher` builds it, on a held log, without timer entries."""
    settings = MatcherServiceSettings(listen="127.0.0.1:0", data_dir=data_dir)
    log = HeldLog(data_dir / "log")
    node: RuntimeNode[MatcherEgress] = RuntimeNode(
        MatcherMachine(engine_settings(settings)),
        NodeSettings(
            data_dir=data_dir,
            snapshot_interval_entries=0,
            sequencer=SequencerSettings(timer_interval_ms=0),
        ),
        log_store=log,
    )
    host = RuntimeHost(node, DurableEgressFeed(1_000), listen_address=settings.listen)
    return host, log


def serve(host: RuntimeHost[MatcherEgress]) -> tuple[asyncio.Task[None], list[MatcherServicer]]:
    """Run the host with the matcher service; the list receives the servicer once it exists."""
    servicers: list[MatcherServicer] = []

    def plan(running: RuntimeHost[MatcherEgress]) -> HostPlan:
        servicer = MatcherServicer(running, max_inflight=64, fences=WriterFences((), "test"))
        servicers.append(servicer)
        return servicer.plan()

    return asyncio.create_task(host.run(plan)), servicers


async def serving_at_newest_version(host: RuntimeHost[MatcherEgress]) -> None:
    """Until the host serves and its new log's VERSION entry (the first writer switches an
    empty log to the newest version) is durable: a test that then holds records holds its
    own, never that one."""
    async with asyncio.timeout(30):
        await host.ready.wait()
    machine = host.node.replica.machine
    newest = max(machine.implemented_versions)
    await wait_until(
        lambda: (
            machine.version == newest
            and host.node.sequencer.durable_position == host.node.replica.applied_position
        ),
        timeout_s=30,
    )


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `condition` until it holds; fail after `timeout_s` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached within {timeout_s:g} s")
        await asyncio.sleep(0.005)


async def stop_host(
    host: RuntimeHost[MatcherEgress], log: HeldLog, serving: asyncio.Task[None]
) -> None:
    log.holding = False
    while log.held:
        log.release_next()
    host.stop()
    async with asyncio.timeout(30):
        await serving
