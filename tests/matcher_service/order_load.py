"""A load generator: command batches on one Execute stream, a window of them in flight.

It runs until told to stop or until the stream breaks (the matcher was killed),
and keeps two records: every batch with its acknowledged result batch, and the
batches sent (or about to be) whose result never came: the in-flight ones, which
may or may not have become durable.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from tests.matcher_service.matcher_process import aio_channel
from tests.matcher_service.order_mix import OrderMix


class LoadGenerator:
    def __init__(self, address: str, mix: OrderMix, batch_size: int, window: int) -> None:
        self.address = address
        self.mix = mix
        self.batch_size = batch_size
        self.window = window
        self.acknowledged: list[
            tuple[matcher_pb2.MatcherCommandBatch, matcher_pb2.MatcherResultBatch]
        ] = []
        self.in_flight: deque[matcher_pb2.MatcherCommandBatch] = deque()
        self.stop = asyncio.Event()

    async def run(self) -> grpc.StatusCode | None:
        """Submit until `stop` is set (then None) or the stream breaks (then its status)."""
        async with aio_channel(self.address) as channel:
            call = matcher_pb2_grpc.MatcherStub(channel).Execute()
            slots = asyncio.Semaphore(self.window)

            async def write() -> None:
                while not self.stop.is_set():
                    await slots.acquire()
                    if self.stop.is_set():
                        break
                    batch = self.mix.batch(self.batch_size)
                    self.in_flight.append(batch)  # from here on, it may reach the log
                    await call.write(batch)
                await call.done_writing()

            writer = asyncio.create_task(write())
            try:
                while True:
                    result = await call.read()
                    if result is grpc.aio.EOF:
                        await writer
                        return None
                    batch = self.in_flight.popleft()
                    assert len(result.results) == len(batch.commands)
                    self.acknowledged.append((batch, result))
                    slots.release()
            except grpc.aio.AioRpcError as error:
                return error.code()
            finally:
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)

    async def wait_acknowledged(self, count: int, timeout_s: float) -> None:
        """Poll until `count` batches in all were acknowledged."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.acknowledged) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(
                    f"{len(self.acknowledged)} batches acknowledged, wanted {count} "
                    f"within {timeout_s:g} s"
                )
            await asyncio.sleep(0.01)
