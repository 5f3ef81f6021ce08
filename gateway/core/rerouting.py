"""What the gateway does when a shard answers NOT_OWNER to a command it routed.

The shard, the routing authority, refuses a command for a user that is not its own
at the routing epoch it has logged, changing nothing, and names that epoch; the same
command (same ids) may go again:

- the shard's epoch is older than the one the gateway routed by: it has not logged
  the gateway's epoch yet, and will in a moment: ask it again shortly;
- otherwise (the shard decided under a newer epoch, or the same one): wait for the
  gateway's routing to move past the epoch it routed by, then route again; if it
  does not move, the shard's answer goes to the client;
- past the re-routing budget, the shard's answer (NOT_OWNER, retryable) goes to the
  client, who retries with the same ids.
"""

from __future__ import annotations

from enum import Enum


class NotOwnerStep(Enum):
    ANSWER = "answer"  # the client gets the shard's answer
    ASK_AGAIN = "ask_again"  # the same shard, in a moment
    AWAIT_NEWER_EPOCH = "await_newer_epoch"  # route again once routing moves past ours


def after_not_owner(*, shard_epoch: int, routed_epoch: int, budget_spent: bool) -> NotOwnerStep:
    """The next step after NOT_OWNER from a shard the gateway chose under `routed_epoch`."""
    if budget_spent:
        return NotOwnerStep.ANSWER
    if shard_epoch < routed_epoch:
        return NotOwnerStep.ASK_AGAIN
    return NotOwnerStep.AWAIT_NEWER_EPOCH
