"""The runtime's own exceptions; storage backends map their library errors here."""

from __future__ import annotations


class RuntimeStoreError(RuntimeError):
    """Base of every storage error the runtime raises."""


class LogCorruptedError(RuntimeStoreError):
    """The log holds a damaged record that is not a torn tail: refuse to guess."""


class LogFencedError(RuntimeStoreError):
    """This process may not append: another writer holds the log (or its lease)."""


class SnapshotUnavailableError(RuntimeStoreError):
    """No snapshot and log prefix together can rebuild the state."""


class IngressFullError(RuntimeError):
    """The sequencer's bounded ingress is full: the sender must slow down and retry."""
