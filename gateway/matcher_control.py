"""Operator commands to the matcher groups: halt, resume, kill-switch.

Admin calls are rare, so each opens one short Execute call to the group that
owns the symbol (or to every group, for a user's kill-switch), sends one batch
and waits for its result. The matcher logs the command before answering, so an
accepted answer means the halt is durable.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import grpc

from gateway.errors import timed_out, unavailable
from protos.oms.v1 import matcher_pb2
from services.clients.channels import mesh_channel
from services.clients.matcher_directory import MatcherDirectory

EXECUTE_METHOD = "/oms.v1.Matcher/Execute"


class MatcherControl:
    def __init__(self, directory: MatcherDirectory, *, timeout_s: float) -> None:
        self.directory = directory
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._ids = itertools.count(1)

    def groups(self) -> list[str]:
        return list(self.directory.addresses)

    async def execute(
        self, group: str, command: matcher_pb2.MatcherCommand
    ) -> matcher_pb2.MatcherCommandResult:
        command.correlation_id = next(self._ids)
        channel = self._channel(group)
        batch = matcher_pb2.MatcherCommandBatch(commands=[command]).SerializeToString()

        async def one_batch() -> AsyncIterator[bytes]:
            yield batch

        call = channel.stream_stream(
            EXECUTE_METHOD,
            request_serializer=None,
            response_deserializer=matcher_pb2.MatcherResultBatch.FromString,
        )(one_batch(), timeout=self.timeout_s)
        address = self.directory.addresses[group]
        try:
            async for results in call:
                for result in results.results:
                    if result.correlation_id == command.correlation_id:
                        answer: matcher_pb2.MatcherCommandResult = result
                        return answer
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise timed_out(f"matcher {group} ({address}) gave no answer") from error
            raise unavailable(f"matcher {group} ({address}): {error.code().name}") from error
        finally:
            call.cancel()
        raise unavailable(f"matcher {group} ({address}) closed the call without an answer")

    async def execute_everywhere(
        self, command: matcher_pb2.MatcherCommand
    ) -> dict[str, matcher_pb2.MatcherCommandResult]:
        groups = self.groups()
        copies = []
        for _ in groups:
            copy = matcher_pb2.MatcherCommand()
            copy.CopyFrom(command)
            copies.append(copy)
        results = await asyncio.gather(
            *(self.execute(group, copy) for group, copy in zip(groups, copies, strict=True))
        )
        return dict(zip(groups, results, strict=True))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def _channel(self, group: str) -> grpc.aio.Channel:
        channel = self._channels.get(group)
        if channel is None:
            channel = mesh_channel(self.directory.addresses[group])
            self._channels[group] = channel
        return channel
