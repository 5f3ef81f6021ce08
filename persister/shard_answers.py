"""The persister's line to the shard's ingress: the shared `ShardLink`, renewed on reconnect.

Answers sent on a stream that broke may not have reached the shard's log, and
`ShardLink.send` cannot say which did. So each time the persister finds the
shard again, and each time the link's own stream breaks while the egress stream
lives on (a shard too busy to read it is found wedged), it starts a fresh link and
re-sends what matters (recent flush answers; the shard drops the ones it already
applied as stale). Hydrations and
dedup lookups need nothing: the shard asks again after its redrive interval.
"""

from __future__ import annotations

from collections.abc import Sequence

from protos.oms.v1 import shard_pb2
from services.clients.shard_link import ShardLink, ShardUnavailableError
from services.coordination.addresses import AddressSource


class ShardAnswers:
    def __init__(self, shard: AddressSource) -> None:
        self.shard = shard  # where the shard is (its leader, when replicated)
        self._link = ShardLink(shard)
        self.renewals = 0

    async def send(self, commands: Sequence[shard_pb2.ShardCommand]) -> None:
        link = self._link
        try:
            await link.send(commands)
        except ShardUnavailableError:
            if link is self._link:
                raise
            # Renewed while this send waited for room: the answers go on the new link.
            await self._link.send(commands)

    @property
    def link(self) -> ShardLink:
        """The link answers go on now (a renewal replaces it)."""
        return self._link

    async def renew(self) -> None:
        previous = self._link
        self._link = ShardLink(self.shard)
        self.renewals += 1
        await previous.close()

    async def close(self) -> None:
        await self._link.close()
