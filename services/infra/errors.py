"""The one error type of the infra package."""

from __future__ import annotations


class InfraError(RuntimeError):
    """A local server could not be started, reached or stopped; the message says why."""
