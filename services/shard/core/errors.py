"""The shard core's exceptions: invariant violations stop the machine, faults are supervised."""

from __future__ import annotations


class ShardError(Exception):
    """Base of every exception the shard core raises on purpose."""


class ShardSettingsError(ShardError, ValueError):
    """Settings that cannot describe a working shard."""


class MalformedCommandError(ShardError, ValueError):
    """Bytes or fields that do not form a command this shard accepts."""


class SnapshotFormatError(ShardError, ValueError):
    """Snapshot bytes this version cannot restore."""


class ShardInvariantError(ShardError):
    """State that must never exist. Crash-only: stop rather than limp on with wrong money."""


class ConservationError(ShardInvariantError):
    """Per asset, users + clearing + fees != deposits - withdrawals + hydrated in - out."""


class NegativeBalanceError(ShardInvariantError):
    """A user's total balance of an asset went below zero."""


class ReservationError(ShardInvariantError):
    """A reservation without an open order or saga, or reservations above the total."""


class OrderIndexError(ShardInvariantError):
    """The open-orders index, the saga registry or the client-id map disagree."""


class OrderTransitionError(ShardInvariantError):
    """An order lifecycle move the transition table does not list."""


class ActorLifecycleError(ShardInvariantError):
    """An actor lifecycle move the transition table does not list."""


class InjectedFault(ShardError):
    """Raised on purpose by the fault-injection point (`ShardSettings.fault_injection`)."""
