"""Operator commands to the matcher groups: halt, resume, kill-switch.

Admin calls are rare, so each opens one short Execute call to the group that
owns the symbol (or to every group, for a user's kill-switch), sends one batch
and waits for its result. The matcher logs the command before answering, so an
accepted answer means the halt is durable.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import grpc

from gateway.core.refusals import timed_out, unavailable
from protos.oms.v1 import matcher_pb2
from services.clients.channels import mesh_channel
from services.clients.matcher_directory import MatcherDirectory
from services.coordination.errors import CoordinationUnavailable
from services.coordination.group_keys import DEFAULT_MESH_ID

EXECUTE_METHOD = "/oms.v1.Matcher/Execute"


class MatcherControl:
    def __init__(
        self,
        directory: MatcherDirectory,
        *,
        timeout_s: float,
        etcd_endpoints: Sequence[str] = (),
        mesh_id: str = DEFAULT_MESH_ID,
    ) -> None:
        self.directory = directory
        self.timeout_s = timeout_s
        # Fixed addresses, or each group's leader (resolved at every call: admin calls
        # are rare, and one must reach whoever leads now).
        self.sources = directory.sources(etcd_endpoints, mesh_id)
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}
        self._ids = itertools.count(1)

    def groups(self) -> list[str]:
        return list(self.directory.addresses)

    async def execute(
        self, group: str, command: matcher_pb2.MatcherCommand
    ) -> matcher_pb2.MatcherCommandResult:
        command.correlation_id = next(self._ids)
        try:
            address, channel = await self._channel(group)
        except CoordinationUnavailable as error:
            raise unavailable(f"matcher {group}: {error}") from error
        batch = matcher_pb2.MatcherCommandBatch(commands=[command]).SerializeToString()

        async def one_batch() -> AsyncIterator[bytes]:
            yield batch

        call = channel.stream_stream(
            EXECUTE_METHOD,
            request_serializer=None,
            response_deserializer=matcher_pb2.MatcherResultBatch.FromString,
        )(one_batch(), timeout=self.timeout_s)
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
        for _, channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        for source in self.sources.values():
            await source.close()

    async def _channel(self, group: str) -> tuple[str, grpc.aio.Channel]:
        address = await self.sources[group].resolve()
        known = self._channels.get(group)
        if known is not None and known[0] == address:
            return known
        if known is not None:
            await known[1].close()  # the group's leader moved
        self._channels[group] = (address, mesh_channel(address))
        return self._channels[group]
