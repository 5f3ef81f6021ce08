"""A subscriber that follows one OMS shard's events across matcher crashes.

Like an OMS shard: whenever its Subscribe stream breaks it subscribes again from
the last sequence it received + 1. It keeps everything it received exactly as
received, so a test can check there was no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from tests.matcher_service.matcher_process import aio_channel

# What a Subscribe stream ends with when the server dies or is not up yet.
BROKEN_STREAM = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
RETRY_PAUSE_S = 0.05


class EventFollower:
    def __init__(self, address: str, shard: str) -> None:
        self.address = address
        self.shard = shard
        self.events: list[matcher_pb2.MatcherEvent] = []
        self.resumed_from: list[int] = []  # from_sequence of every Subscribe call

    @property
    def last_sequence(self) -> int:
        return self.events[-1].sequence if self.events else 0

    async def run(self) -> None:
        """Follow until cancelled; any status other than a broken stream fails the task."""
        async with aio_channel(self.address) as channel:
            stub = matcher_pb2_grpc.MatcherStub(channel)
            while True:
                from_sequence = self.last_sequence + 1
                self.resumed_from.append(from_sequence)
                call = stub.Subscribe(
                    matcher_pb2.SubscribeRequest(oms_shard=self.shard, from_sequence=from_sequence)
                )
                try:
                    async for batch in call:
                        self.events.extend(batch.events)
                except grpc.aio.AioRpcError as error:
                    if error.code() not in BROKEN_STREAM:
                        raise
                await asyncio.sleep(RETRY_PAUSE_S)

    async def wait_through(self, sequence: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.last_sequence < sequence:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.shard}: received through {self.last_sequence}, "
                    f"wanted {sequence} within {timeout_s:g} s"
                )
            await asyncio.sleep(0.02)


class LastPriceFollower:
    """Follows StreamLastPrices across matcher crashes, keeping every price received."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.prices: list[matcher_pb2.LastPrice] = []

    async def run(self) -> None:
        async with aio_channel(self.address) as channel:
            stub = matcher_pb2_grpc.MatcherStub(channel)
            while True:
                call = stub.StreamLastPrices(matcher_pb2.LastPriceRequest())
                try:
                    async for price in call:
                        self.prices.append(price)
                except grpc.aio.AioRpcError as error:
                    if error.code() not in BROKEN_STREAM:
                        raise
                await asyncio.sleep(RETRY_PAUSE_S)
