"""The persister's line to the shard's ingress: the shared `ShardLink`, renewed on reconnect.

`ShardLink` keeps one Execute stream and reconnects on the next send. When its
stream broke, the previous call's request poller is still parked on the link's
queue and takes the first batch queued after the break with it (see the report
of issue 5). The persister renews the link each time it finds the shard again,
before it re-sends anything, so the answers that matter most (flush answers of a
shard that restarted) never go into a queue with a stale reader. Answers lost
while the shard was away are covered anyway: hydrations and dedup lookups are
asked again by the shard, and recent flush answers are re-sent after renewing.
"""

from __future__ import annotations

from collections.abc import Sequence

from protos.oms.v1 import shard_pb2
from services.clients.shard_link import ShardLink


class ShardAnswers:
    def __init__(self, shard_address: str) -> None:
        self.shard_address = shard_address
        self._link = ShardLink(shard_address)
        self.renewals = 0

    async def send(self, commands: Sequence[shard_pb2.ShardCommand]) -> None:
        await self._link.send(commands)

    async def renew(self) -> None:
        previous = self._link
        self._link = ShardLink(self.shard_address)
        self.renewals += 1
        await previous.close()

    async def close(self) -> None:
        await self._link.close()
