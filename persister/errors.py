"""The persister's own error tree: what callers catch instead of asyncpg's exceptions.

`persister.store` is the one module that sees asyncpg; it maps every library error
into one of these, so the rest of the service decides on meaning, not on driver
classes:

    StoreError
    ├── StoreUnavailable   the server cannot be reached or the connection broke:
    │                      retry the whole unit of work later (nothing was committed)
    ├── ConflictError      a unique key or exclusion constraint refused the row
    └── RowRejected        the row itself is bad: a CHECK, NOT NULL or foreign key
                           failed, or a value does not fit its column
"""

from __future__ import annotations


class StoreError(Exception):
    """A database operation failed; see the subclasses for what to do about it."""


class StoreUnavailable(StoreError):
    """The database is unreachable or the connection broke mid-operation."""


class ConflictError(StoreError):
    """A uniqueness constraint refused a row (`constraint` names it when known)."""

    def __init__(self, message: str, constraint: str = "") -> None:
        super().__init__(message)
        self.constraint = constraint


class RowRejected(StoreError):
    """The database refused a row's content (check, not-null, foreign key, range)."""

    def __init__(self, message: str, constraint: str = "") -> None:
        super().__init__(message)
        self.constraint = constraint


class MigrationError(StoreError):
    """The schema on the server does not match the migrations this build ships."""


class EgressGapError(RuntimeError):
    """The shard no longer retains the egress after our cursor: rows would be lost.

    Raised instead of skipping ahead; an operator must restore the missing
    positions (or accept the loss explicitly) before the persister can resume.
    """


class WriterFencedError(RuntimeError):
    """A newer persister claimed this shard: this one must stop writing (and does)."""
