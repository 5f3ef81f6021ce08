"""A shard's saga egress as matcher commands: what the bridge sends, without the sending.

Pure conversions (no I/O, no event loop), so the bridge's streams and the whole-mesh
simulation (`simulation/`) turn the same egress into the same commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from protos.oms.v1 import matcher_pb2, shard_pb2

__all__ = ["CancelWork", "Work", "add_command", "saga_work"]


@dataclass(frozen=True, slots=True)
class CancelWork:
    order_id: str
    user_id: int


# A submit is the order itself, kept by reference into the egress batch it came in;
# it is copied once, straight into the MatcherCommandBatch that sends it.
Work = matcher_pb2.Order | CancelWork


def saga_work(item: shard_pb2.ShardEgress) -> tuple[str, Work] | None:
    """(matcher group, work) for a SubmitToME / CancelToME egress item; None otherwise."""
    kind = item.WhichOneof("egress")
    if kind == "submit":
        return item.submit.matcher_group, item.submit.order
    if kind == "cancel":
        return item.cancel.matcher_group, CancelWork(item.cancel.order_id, item.cancel.user_id)
    return None


def add_command(batch: matcher_pb2.MatcherCommandBatch, work: Work, correlation_id: int) -> bool:
    """Append `work` to `batch` as one command; True for a submit."""
    command = batch.commands.add(correlation_id=correlation_id)
    if isinstance(work, CancelWork):
        command.cancel.order_id = work.order_id
        command.cancel.user_id = work.user_id
        return False
    command.submit.order.CopyFrom(work)
    return True
