"""The infra package's errors: InfraError, and the one kind a caller can retry."""

from __future__ import annotations


class InfraError(RuntimeError):
    """A local server could not be started, reached or stopped; the message says why."""


class PortTakenError(InfraError):
    """A port a server was to listen on is taken; a port we picked can be picked again."""
