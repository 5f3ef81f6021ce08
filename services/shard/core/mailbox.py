"""A user's mailbox: the client commands that wait for its actor, and its bound.

In this shard an actor has no thread of its own: the log is every actor's inbox,
applied in order, and a resident actor serves a command the moment it is applied.
A command waits only while its actor cannot serve it yet: the user is being
hydrated (`Hydration`), or its actor waits for the database's dedup answer
(`DedupWait`). Those waiting commands are the actor's mailbox
(seeds/actor-model-risk-engine.txt, MC-MB-01 and INV-ACTOR-02), and it is bounded:

- at most `max_parked_per_user` client commands per user, and `max_parked_total`
  over the shard;
- cancels and an operator's commands (risk limits, halts, restarts) reduce risk:
  they are admitted past those bounds, cancels into a reserve of a quarter of the
  per-user bound and a tenth of the total, an operator's commands into twice that,
  so a user flooding places cannot lock out their own cancels, and a user flooding
  cancels cannot lock out the operator;
- matcher events (fills, cancels, expiries) are never refused: money the matcher
  moved must settle; their number is bounded by the user's live orders;
- a command that finds the mailbox full is refused BACKPRESSURE, retryable, and
  changes nothing; nothing is dropped silently: every command has its answer, and
  a retry with the same ids is exactly-once (dedup);
- market ticks never enter a mailbox: they are conflated per symbol before the log
  (`services/shard/tick_mailbox.py`) and logged behind queued orders.

The order within a mailbox is the log's: a cancel is never served before the place
it cancels. Everything here is decided from logged state, so replicas agree.
"""

from __future__ import annotations

from services.shard.core.commands import (
    CancelAllAfter,
    CancelAllOrders,
    CancelOrder,
    ClientCommand,
    EndSession,
    KeepSession,
    SetRiskLimits,
    UserControl,
)

_OPERATOR = (SetRiskLimits, UserControl)
_CANCELS = (CancelOrder, CancelAllOrders, CancelAllAfter, KeepSession, EndSession)


def reserve_shares(command: ClientCommand) -> int:
    """How many reserve shares `command` may use: 0 for places and transfers, 1 for a
    cancel, a cancel-all, a dead man's switch or a session's command, 2 for an operator's
    command (the second share is the operator's alone)."""
    kind = type(command)
    if kind in _OPERATOR:
        return 2
    return 1 if kind in _CANCELS else 0


def mailbox_full(
    command: ClientCommand,
    waiting_for_user: int,
    waiting_in_shard: int,
    max_per_user: int,
    max_total: int,
) -> bool:
    """Whether `command` finds its user's mailbox (or the shard's) full."""
    shares = reserve_shares(command)
    max_per_user += shares * max(1, max_per_user // 4)
    max_total += shares * max(1, max_total // 10)
    return waiting_for_user >= max_per_user or waiting_in_shard >= max_total
