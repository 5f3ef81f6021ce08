"""RuntimeHost and DurableEgressFeed with a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.egress_feed import DurableEgressFeed, EgressWindowExceededError
from services.runtime.hosting import HostPlan, RuntimeHost
from services.runtime.node import NodeSettings, RuntimeNode
from services.runtime.sequencer import SequencerSettings

Egress = tuple[int, int | None]


def make_host(
    data_dir: Path, retained: int = 1000, max_pending_entries: int = 200_000
) -> RuntimeHost[Egress]:
    node: RuntimeNode[Egress] = RuntimeNode(
        CounterMachine(),
        NodeSettings(
            data_dir=data_dir,
            snapshot_interval_entries=0,
            sequencer=SequencerSettings(
                timer_interval_ms=0, max_pending_entries=max_pending_entries
            ),
        ),
    )
    return RuntimeHost(node, DurableEgressFeed(retained), listen_address="127.0.0.1:0")


def health_only(_host: RuntimeHost[Egress]) -> HostPlan:
    return HostPlan(service_names=("oms.test",), register=lambda _server: None)


async def health_status(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(service="oms.test"))
        return int(response.status)


async def test_host_serves_health_ingress_and_resumable_egress(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    running = asyncio.create_task(host.run(health_only))
    try:
        async with asyncio.timeout(30):
            await host.ready.wait()
        assert await health_status(host.bound_port) == health_pb2.HealthCheckResponse.SERVING
        first, egress = await host.ingress.submit(encode_increment(7, 5))
        assert egress == ((7, 5),)
        second, _ = await host.ingress.submit(encode_increment(7, 1))
        seen: list[tuple[int, Egress]] = []
        async for record in host.feed.subscribe(first):
            seen.extend(record.items)
            if record.last_position >= second:
                break
        assert seen == [(first, (7, 5)), (second, (7, 6))]
    finally:
        host.stop()
        async with asyncio.timeout(30):
            await running


async def test_egress_of_the_replayed_tail_is_available_after_restart(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    running = asyncio.create_task(host.run(health_only))
    async with asyncio.timeout(30):
        await host.ready.wait()
    position, _ = await host.ingress.submit(encode_increment(1, 10))
    host.stop()
    async with asyncio.timeout(30):
        await running

    restarted = make_host(tmp_path)
    running = asyncio.create_task(restarted.run(health_only))
    try:
        async with asyncio.timeout(30):
            await restarted.ready.wait()
        records = restarted.feed.subscribe(position)
        async with asyncio.timeout(5):
            record = await anext(records)
        assert record.items == [(position, (1, 10))]
    finally:
        restarted.stop()
        async with asyncio.timeout(30):
            await running


async def test_a_position_older_than_the_window_is_refused(tmp_path: Path) -> None:
    host = make_host(tmp_path, retained=2)
    running = asyncio.create_task(host.run(health_only))
    try:
        async with asyncio.timeout(30):
            await host.ready.wait()
        positions = [(await host.ingress.submit(encode_increment(k, 1)))[0] for k in range(5)]
        with pytest.raises(EgressWindowExceededError):
            await anext(host.feed.subscribe(positions[0]))
        newest = await anext(host.feed.subscribe(positions[-1]))
        assert newest.items == [(positions[-1], (4, 1))]
    finally:
        host.stop()
        async with asyncio.timeout(30):
            await running


async def test_settled_returns_under_steady_load_with_everything_applied_durable(
    tmp_path: Path,
) -> None:
    host = make_host(tmp_path)
    running = asyncio.create_task(host.run(health_only))
    stop_load = asyncio.Event()

    async def steady_load() -> None:
        # Submissions keep arriving while the reads below wait for durability.
        while not stop_load.is_set():
            await asyncio.gather(*(host.ingress.submit(encode_increment(1, 1)) for _ in range(8)))

    try:
        async with asyncio.timeout(30):
            await host.ready.wait()
        producers = [asyncio.create_task(steady_load()) for _ in range(4)]
        node = host.node
        for _ in range(20):
            async with asyncio.timeout(10):  # no task in between, unlike wait_for
                await host.settled()
            # Nothing ran between settled() returning and this line: what a query reads now.
            assert node.replica.applied_position == node.sequencer.durable_position
            assert host.ingress.holds == 0
            await asyncio.sleep(0)
        stop_load.set()
        await asyncio.gather(*producers)
    finally:
        stop_load.set()
        host.stop()
        async with asyncio.timeout(30):
            await running


async def test_a_readers_batches_keep_their_order_through_holds_and_full_queues(
    tmp_path: Path,
) -> None:
    # Four pending entries at most: the reader waits for capacity again and again, and
    # reads holding ingress come and go; its entries must still land in its order.
    host = make_host(tmp_path, max_pending_entries=4)
    running = asyncio.create_task(host.run(health_only))
    try:
        async with asyncio.timeout(30):
            await host.ready.wait()
        reading = True

        async def reads() -> None:
            while reading:
                await host.settled()
                await asyncio.sleep(0)

        reader_of_state = asyncio.create_task(reads())
        others = [
            asyncio.create_task(host.ingress.submit(encode_increment(1_000 + k, 1)))
            for k in range(50)
        ]
        futures = [await host.ingress.enqueue(encode_increment(k, 1)) for k in range(300)]
        positions = [(await future).first_position for future in futures]
        reading = False
        await asyncio.gather(reader_of_state, *others)
        assert positions == sorted(positions)
        assert host.ingress.statistics().waits_for_capacity > 0
    finally:
        host.stop()
        async with asyncio.timeout(30):
            await running


async def test_a_second_server_on_a_served_port_fails_instead_of_sharing_it(
    tmp_path: Path,
) -> None:
    first = make_host(tmp_path / "first")
    running = asyncio.create_task(first.run(health_only))
    try:
        async with asyncio.timeout(30):
            await first.ready.wait()
        second: RuntimeHost[Egress] = RuntimeHost(
            RuntimeNode(
                CounterMachine(),
                NodeSettings(data_dir=tmp_path / "second", snapshot_interval_entries=0),
            ),
            DurableEgressFeed(10),
            listen_address=f"127.0.0.1:{first.bound_port}",
        )
        with pytest.raises(RuntimeError, match="Failed to bind"):
            async with asyncio.timeout(30):
                await second.run(health_only)
        assert await health_status(first.bound_port) == health_pb2.HealthCheckResponse.SERVING
    finally:
        first.stop()
        async with asyncio.timeout(30):
            await running
