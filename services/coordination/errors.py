"""Errors of the coordination layer: what callers of etcd see, whatever the client library."""

from __future__ import annotations


class CoordinationError(RuntimeError):
    """Base of every error the etcd adapter raises."""


class CoordinationUnavailable(CoordinationError):
    """etcd did not answer (no quorum, no member reachable, a timeout): retry."""


class CoordinationDenied(CoordinationError):
    """etcd refused the call for who made it (auth on: the certificate's name is no user
    of etcd's, or its role does not cover the key). Retrying will not help: the
    deployment's certificates or etcd's users and roles are wrong."""


class RevisionCompacted(CoordinationError):
    """The history asked for is compacted away: read the current state and go on from it."""

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"etcd history compacted below revision {compacted_revision}")
        self.compacted_revision = compacted_revision


class LeaseLost(CoordinationError):
    """The lease this process held expired or was revoked: it holds nothing any more."""
