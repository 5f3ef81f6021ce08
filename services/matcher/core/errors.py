"""The matcher core's own errors: bad settings, bad snapshots, stale cursors, broken invariants."""

from __future__ import annotations


class MatcherError(Exception):
    """Base of every error the matcher core raises."""


class SettingsError(MatcherError, ValueError):
    """Engine or symbol settings that cannot describe a working market."""


class SnapshotFormatError(MatcherError, ValueError):
    """Snapshot bytes that this version cannot read, or whose content breaks an invariant."""


class MatcherInvariantError(MatcherError, RuntimeError):
    """State that must never happen: stop the machine (crash-only) instead of limping on."""


class SequenceTooOldError(MatcherError):
    """A subscriber asked for events older than the retained window of its OMS shard.

    The subscriber must rebuild from a fresh open-orders snapshot (reconciliation)
    instead of resuming the stream.
    """

    def __init__(self, oms_shard: str, from_sequence: int, first_retained_sequence: int) -> None:
        super().__init__(
            f"events of OMS shard {oms_shard!r} from sequence {from_sequence} are gone; "
            f"the oldest retained is {first_retained_sequence}"
        )
        self.oms_shard = oms_shard
        self.from_sequence = from_sequence
        self.first_retained_sequence = first_retained_sequence
