"""The commands waiting for one matcher group: re-drives first, then fresh egress.

The bridge's durable work queue is the shard's set of in-flight sagas; this is
only its in-memory front. Two parts, drained in this order:

- `redrive`: the group's sagas from a `GetInFlight` snapshot, in the shard's
  order (submits, then cancels). They go first so that a cancel that arrived
  fresh can never overtake the re-driven submit of its own order.
- fresh items from the egress stream, bounded by `capacity`: a full queue makes
  the egress reader wait (backpressure, never a drop) while the group is up.

While the group is down the queue is closed: fresh items are shed and counted,
because the group's next connection starts from a new `GetInFlight` snapshot,
which holds every one of them that still needs the matcher.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from protos.oms.v1 import matcher_pb2, shard_pb2


def matcher_command(item: shard_pb2.ShardEgress) -> tuple[str, matcher_pb2.MatcherCommand] | None:
    """(matcher group, command) for a SubmitToME / CancelToME egress item; None otherwise."""
    kind = item.WhichOneof("egress")
    if kind == "submit":
        command = matcher_pb2.MatcherCommand()
        command.submit.order.CopyFrom(item.submit.order)
        return item.submit.matcher_group, command
    if kind == "cancel":
        command = matcher_pb2.MatcherCommand()
        command.cancel.order_id = item.cancel.order_id
        command.cancel.user_id = item.cancel.user_id
        return item.cancel.matcher_group, command
    return None


class WorkQueue:
    def __init__(self, group: str, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"queue capacity must be positive, got {capacity}")
        self.group = group
        self.capacity = capacity
        self.is_open = False
        self._redrive: deque[matcher_pb2.MatcherCommand] = deque()
        self._fresh: deque[matcher_pb2.MatcherCommand] = deque()
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._redrive) + len(self._fresh)

    async def open(self) -> None:
        async with self._changed:
            self.is_open = True

    async def close(self) -> None:
        """Drop everything waiting and shed fresh items until the next `open`."""
        async with self._changed:
            self.is_open = False
            self._redrive.clear()
            self._fresh.clear()
            self._changed.notify_all()

    async def redrive(self, commands: Iterable[matcher_pb2.MatcherCommand]) -> None:
        async with self._changed:
            self._redrive.extend(commands)
            self._changed.notify_all()

    async def offer(self, command: matcher_pb2.MatcherCommand) -> bool:
        """Queue a fresh command; False if the group is down (the command is shed)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self.is_open or len(self._fresh) < self.capacity
            )
            if not self.is_open:
                return False
            self._fresh.append(command)
            self._changed.notify_all()
            return True

    async def take(self, limit: int) -> list[matcher_pb2.MatcherCommand]:
        """Wait for work; then up to `limit` commands, re-drives first."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._redrive or self._fresh))
            taken: list[matcher_pb2.MatcherCommand] = []
            for source in (self._redrive, self._fresh):
                while source and len(taken) < limit:
                    taken.append(source.popleft())
            self._changed.notify_all()
            return taken
