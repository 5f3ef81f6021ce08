"""The matcher core's own errors: bad settings, bad snapshots, stale cursors, unknown
symbols, broken invariants."""

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


class MarketSequenceTooOldError(MatcherError):
    """A market-data subscriber asked for book updates or trades of a symbol older than
    that symbol's retained window.

    The subscriber must take a new book snapshot (`book_snapshot`) and go on from its
    sequences instead of resuming.
    """

    def __init__(
        self, symbol: str, stream: str, from_sequence: int, first_retained_sequence: int
    ) -> None:
        super().__init__(
            f"{stream} of symbol {symbol!r} from sequence {from_sequence} are gone; "
            f"the oldest retained is {first_retained_sequence}"
        )
        self.symbol = symbol
        self.stream = stream  # "updates" (book updates) or "trades"
        self.from_sequence = from_sequence
        self.first_retained_sequence = first_retained_sequence


class UnknownSymbolError(MatcherError, KeyError):
    """A market-data query named a symbol this matcher group does not trade."""

    def __init__(self, symbol: str) -> None:
        super().__init__(f"symbol {symbol!r} is not traded by this matcher group")
        self.symbol = symbol

    def __str__(self) -> str:
        return str(self.args[0])


class MarketFeedInactiveError(MatcherError):
    """A market-data query while the group decides under a state-machine version before 2,
    which publishes no market data."""

    def __init__(self, machine_version: int) -> None:
        super().__init__(
            f"the matcher group runs state-machine version {machine_version}: "
            "market data is published from version 2 on"
        )
        self.machine_version = machine_version
