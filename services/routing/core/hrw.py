"""Rendezvous (highest random weight) hashing with a hash every language has.

A user belongs to the cluster with the highest score, where

    score(cluster, user) = the first 8 bytes, big-endian, of
                           SHA-256(UTF-8 of "<cluster id>/<user id in decimal>")

and a tie (never seen in practice) goes to the smaller cluster id. Python's `hash()`
is salted per process, so it is never used here: a gateway in another language, or
another Python process, must compute the same owner. Adding a cluster moves only the
users whose new highest score is the new cluster's (about 1/N of them); removing one
moves only its own users. The README publishes test vectors
(`tests/routing/test_hrw.py` holds the same ones).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


class NoClusterError(ValueError):
    """Ownership asked of an empty membership."""


def score(cluster_id: str, user_id: int) -> int:
    digest = hashlib.sha256(f"{cluster_id}/{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_owner(user_id: int, cluster_ids: Iterable[str]) -> str:
    """The cluster of `cluster_ids` that owns `user_id` (NoClusterError if none)."""
    best: tuple[int, str] | None = None
    for cluster_id in cluster_ids:
        candidate = score(cluster_id, user_id)
        if best is None or candidate > best[0] or (candidate == best[0] and cluster_id < best[1]):
            best = (candidate, cluster_id)
    if best is None:
        raise NoClusterError(f"no cluster to own user {user_id}")
    return best[1]
